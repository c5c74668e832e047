"""The official MCP conformance suites, run against the gateway in front of the conformance fixture.

* 0.1.16, every server scenario (``--suite all``) of each 2025 revision, with the baseline
  ``expected-failures.yml`` (empty: no scenario may fail or warn), the gateway speaking
  2025-11-25 to the fixture.
* 0.2.0-alpha.12, the 2026-07-28 requirement set: every required scenario passes (the
  ``tasks-*`` extension scenarios are optional and only reported), the gateway speaking
  2026-07-28 to the fixture.
* Translation: the 2026-07-28 set in front of a fixture that speaks only 2025-11-25, and the
  2025-11-25 suite in front of one that speaks only 2026-07-28 (tests/eras.py); the
  scenarios translation must carry are listed below.

Runs straight to the fixture show a failure through the gateway is the gateway's. Needs
``scripts/install-conformance`` (skipped without it, failed under CI). Run only these:
``.venv/bin/python -m pytest -m conformance``. See docs/conformance.md.
"""

from __future__ import annotations

import os

import pytest

from tests.conformance import (
    EXPECTED_FAILURES,
    INSTALL_SCRIPT,
    MODERN_REQUIREMENTS,
    MODERN_SUITE_VERSION,
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


def _installed(version: str) -> Suite:
    found = find_suite(version=version)
    if found is None:
        message = (f"the MCP conformance suite {version} is not installed in {conformance_home(version)}: "
                   f"run {INSTALL_SCRIPT} (it installs Node 22 and the suites there)")
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def suite() -> Suite:
    return _installed("0.1.16")


@pytest.fixture(scope="module")
def modern_suite() -> Suite:
    return _installed(MODERN_SUITE_VERSION)


@pytest.fixture
def fixture_backend() -> ConformanceBackend:
    backend = conformance_backend()
    yield backend
    backend.stop()


def gateway_config(backend: ConformanceBackend, protocol: str | None = None) -> dict:
    """One backend; ``manual`` conflict resolution advertises its tool and prompt names as they are
    (resource URIs are never rewritten), so the suite finds ``test_simple_text`` and the rest.
    ``protocol`` pins the era the gateway speaks to it (by default it probes)."""
    return {
        "name": "vmcp-conformance",
        "backends": [backend_entry(BACKEND, backend, protocol)],
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
    # The fixture's 2025 tools ask the client mid-call: the gateway speaks 2025-11-25 to it.
    gateway = start_gateway(gateway_config(fixture_backend, "legacy"))
    run = run_suite(suite, gateway.url, spec_version, tmp_path)
    assert_clean(run, f"through the gateway, spec {spec_version}")


# -- 2026-07-28 ---------------------------------------------------------------------------------


def is_required(scenario: str) -> bool:
    """The tasks extension's scenarios are not scored for 2026-07-28; everything else is."""
    return not scenario.startswith("tasks-")


def assert_required_pass(run: SuiteRun, where: str, exempt: frozenset[str] = frozenset()) -> None:
    assert run.checks, f"{where}: the suite wrote no checks\n{run.report()}"
    failed = [check for check in run.checks if check.status == "FAILURE" and is_required(check.scenario)
              and check.scenario not in exempt]
    optional = sorted(s for s, outcome in run.scenarios().items() if not is_required(s) and outcome == "passed")
    print(f"{where}: {run.summary()}; optional tasks-* scenarios passing: {optional or 'none'}")
    assert not failed, f"{where}: " + "\n  ".join(str(check) for check in failed)


def test_the_fixture_passes_the_2026_requirements_directly(modern_suite: Suite, fixture_backend: ConformanceBackend,
                                                            tmp_path) -> None:
    run = run_suite(modern_suite, fixture_backend.mcp_url, MODERN_REQUIREMENTS, tmp_path, expected_failures=None)
    assert_required_pass(run, "fixture directly, 2026-07-28")


def test_the_gateway_passes_the_2026_requirements(modern_suite: Suite, fixture_backend: ConformanceBackend,
                                                   start_gateway, tmp_path) -> None:
    gateway = start_gateway(gateway_config(fixture_backend))  # probed: spoken to in 2026-07-28
    run = run_suite(modern_suite, gateway.url, MODERN_REQUIREMENTS, tmp_path, expected_failures=None)
    assert_required_pass(run, "through the gateway, 2026-07-28")


# What a backend of the other era cannot do at all: the 2026-07-28 multi round-trip
# scenarios call fixture tools that answer input_required by hand with fixed keys and
# states (a 2025 backend asks mid-call instead, which the gateway turns into input_required
# with keys of its own: tests/integration/test_modern.py covers that pairing); the 2025
# elicitation and sampling scenarios call tools that ask mid-call, which a 2026-07-28-only
# backend cannot (its SDK has no channel for it).
NOT_TRANSLATABLE_TO_LEGACY = frozenset({
    "input-required-result-basic-elicitation", "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots", "input-required-result-request-state",
    "input-required-result-multiple-input-requests", "input-required-result-multi-round",
    "input-required-result-non-tool-request", "input-required-result-result-type",
    "input-required-result-tampered-state", "input-required-result-capability-check",
    "server-stateless",  # one check of it: test_streaming_elicitation answers input_required by hand
})
NOT_TRANSLATABLE_TO_MODERN = frozenset({
    "elicitation-sep1034-defaults", "elicitation-sep1330-enums", "tools-call-elicitation", "tools-call-sampling",
})


@pytest.fixture
def legacy_only_fixture() -> ConformanceBackend:
    backend = conformance_backend(era="legacy")
    yield backend
    backend.stop()


@pytest.fixture
def modern_only_fixture() -> ConformanceBackend:
    backend = conformance_backend(era="modern")
    yield backend
    backend.stop()


def test_the_2026_requirements_through_the_gateway_in_front_of_a_2025_only_backend(
        modern_suite: Suite, legacy_only_fixture: ConformanceBackend, start_gateway, tmp_path) -> None:
    gateway = start_gateway(gateway_config(legacy_only_fixture))  # probed: it refuses server/discover
    run = run_suite(modern_suite, gateway.url, MODERN_REQUIREMENTS, tmp_path, expected_failures=None)
    stateless = [c for c in run.checks if c.scenario == "server-stateless" and c.status == "FAILURE"]
    assert [c.id for c in stateless] in ([], ["sep-2575-http-server-no-independent-requests-on-stream"]), stateless
    assert_required_pass(run, "through the gateway, 2026-07-28, 2025-only backend", NOT_TRANSLATABLE_TO_LEGACY)


def test_the_2025_suite_through_the_gateway_in_front_of_a_2026_only_backend(
        suite: Suite, modern_only_fixture: ConformanceBackend, start_gateway, tmp_path) -> None:
    gateway = start_gateway(gateway_config(modern_only_fixture))  # probed: it answers server/discover
    run = run_suite(suite, gateway.url, SPEC_VERSIONS[0], tmp_path, expected_failures=None)
    failed = sorted({c.scenario for c in run.checks if c.status == "FAILURE"})
    print(f"through the gateway, 2025-11-25, 2026-only backend: {run.summary()}")
    assert run.checks and set(failed) <= NOT_TRANSLATABLE_TO_MODERN, failed


def test_a_call_whose_backend_closes_its_stream_mid_call_is_answered(fixture_backend: ConformanceBackend,
                                                                     start_gateway) -> None:
    gateway = start_gateway(gateway_config(fixture_backend))
    session_id = gateway.initialize("2025-11-25")
    # The backend ends its stream before answering (SEP-1699 polling); the gateway resumes
    # it with GET and Last-Event-ID, so its own client sees one ordinary answer.
    answer = gateway.rpc(session_id, "tools/call", {"name": "test_reconnection", "arguments": {}})
    assert answer.get("result", {}).get("content") == [{"type": "text", "text": "Reconnection test completed"}], answer
