"""The official MCP conformance suite, run against the gateway in front of the conformance fixture.

Every server scenario of the suite (``--suite all``) for each spec version, with the
baseline ``expected-failures.yml`` (empty: no scenario may fail or warn). One more run goes
straight to the fixture, so a failure through the gateway is the gateway's, not the
fixture's. Needs ``scripts/install-conformance`` (skipped without it, failed under CI).
Run only these: ``.venv/bin/python -m pytest -m conformance``. See docs/conformance.md.
"""

from __future__ import annotations

import os

import pytest

from tests.conformance import (
    EXPECTED_FAILURES,
    INSTALL_SCRIPT,
    SPEC_VERSIONS,
    SUITE_TIMEOUT,
    Suite,
    SuiteRun,
    conformance_home,
    find_suite,
    run_suite,
)
from tests.conformance.fixture_server import ConformanceBackend, conformance_backend
from tests.gateway import backend_entry

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.timeout(SUITE_TIMEOUT + 60),
    # the SDK deprecates logging and sampling for its 2026-07-28 revision; the fixture uses both
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

BACKEND = "fixture"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def suite() -> Suite:
    found = find_suite()
    if found is None:
        message = (f"the MCP conformance suite is not installed in {conformance_home()}: "
                   f"run {INSTALL_SCRIPT} (it installs Node 22 and the suite there)")
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture
def fixture_backend() -> ConformanceBackend:
    backend = conformance_backend()
    yield backend
    backend.stop()


def gateway_config(backend: ConformanceBackend) -> dict:
    """One backend; ``manual`` conflict resolution advertises its tool and prompt names as they are
    (resource URIs are never rewritten), so the suite finds ``test_simple_text`` and the rest."""
    return {
        "name": "vmcp-conformance",
        "backends": [backend_entry(BACKEND, backend)],
        "aggregation": {"conflictResolution": "manual"},
        # a scenario the gateway cannot serve fails in seconds instead of waiting out 30 s
        "operational": {"timeouts": {"default": "10s"}},
    }


def assert_clean(run: SuiteRun, where: str) -> None:
    assert run.checks, f"{where}: the suite wrote no checks\n{run.report()}"
    assert run.returncode == 0 and not run.problems, f"{where}: {run.report()}"


def test_the_baseline_is_empty() -> None:
    import yaml

    baseline = yaml.safe_load(EXPECTED_FAILURES.read_text())
    assert baseline == {"server": []}, f"{EXPECTED_FAILURES.name} lists expected failures: {baseline}"


def test_the_fixture_passes_the_suite_directly(suite: Suite, fixture_backend: ConformanceBackend, tmp_path) -> None:
    """Sanity: the fixture itself passes every scenario of the newest spec (a superset of 2025-06-18's)."""
    run = run_suite(suite, fixture_backend.mcp_url, SPEC_VERSIONS[0], tmp_path)
    assert_clean(run, f"fixture directly, spec {SPEC_VERSIONS[0]}")


@pytest.mark.parametrize("spec_version", SPEC_VERSIONS)
def test_the_gateway_passes_the_suite(suite: Suite, fixture_backend: ConformanceBackend, start_gateway, tmp_path,
                                      spec_version: str) -> None:
    gateway = start_gateway(gateway_config(fixture_backend))
    run = run_suite(suite, gateway.url, spec_version, tmp_path)
    assert_clean(run, f"through the gateway, spec {spec_version}")


def test_a_call_whose_backend_closes_its_stream_mid_call_is_answered(fixture_backend: ConformanceBackend,
                                                                     start_gateway) -> None:
    gateway = start_gateway(gateway_config(fixture_backend))
    session_id = gateway.initialize("2025-11-25")
    # The backend ends its stream before answering (SEP-1699 polling); the gateway resumes
    # it with GET and Last-Event-ID, so its own client sees one ordinary answer.
    answer = gateway.rpc(session_id, "tools/call", {"name": "test_reconnection", "arguments": {}})
    assert answer.get("result", {}).get("content") == [{"type": "text", "text": "Reconnection test completed"}], answer
