"""The official MCP conformance suite (``@modelcontextprotocol/conformance``), run from pytest.

``scripts/install-conformance`` installs the suites and a Node 22 into :func:`conformance_home`
(one directory per suite version); this module finds them there (same directory logic as
the script) and runs a suite's ``server`` command against a URL. Two suites: 0.1.16 for the
2025 revisions (``--suite all --spec-version X``) and 0.2.0-alpha.12 for 2026-07-28
(``--requirements 2026-07-28``). See docs/conformance.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUITE_VERSION = "0.1.16"  # the 2025 revisions
MODERN_SUITE_VERSION = "0.2.0-alpha.12"  # the 2026-07-28 requirement set
MODERN_REQUIREMENTS = "2026-07-28"
SPEC_VERSIONS = ("2025-11-25", "2025-06-18")
SUITES = (SUITE_VERSION, MODERN_SUITE_VERSION)
INSTALL_SCRIPT = "scripts/install-conformance"
SUITE_TIMEOUT = 300.0  # seconds for one whole suite run; a run takes 2 to 10 s
TIMED_OUT = -1  # SuiteRun.returncode of a run that was stopped after its timeout
HERE = Path(__file__).resolve().parent

# The 2026-07-28 requirement set as 0.2.0-alpha.12 lists it (``list --requirements 2026-07-28``;
# test_conformance checks these against the installed suite). Required scenarios decide
# conformance; the tasks extension's and the pending ones run and are reported, never scored.
MODERN_REQUIRED = (
    "server-stateless", "completion-complete", "tools-list", "tools-call-simple-text", "tools-call-image",
    "tools-call-audio", "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-error",
    "tools-call-with-progress", "server-sse-multiple-streams", "resources-list", "resources-read-text",
    "resources-read-binary", "resources-templates-read", "sep-2164-resource-not-found", "prompts-list",
    "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource", "prompts-get-with-image",
    "dns-rebinding-protection", "caching",
    "input-required-result-basic-elicitation", "input-required-result-basic-sampling",
    "input-required-result-basic-list-roots", "input-required-result-request-state",
    "input-required-result-multiple-input-requests", "input-required-result-multi-round",
    "input-required-result-missing-input-response", "input-required-result-non-tool-request",
    "input-required-result-result-type", "input-required-result-unsupported-methods",
    "input-required-result-tampered-state", "input-required-result-capability-check",
    "input-required-result-ignore-extra-params", "input-required-result-validate-input",
)
MODERN_EXTENSION = (  # optional: the tasks extension
    "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields", "tasks-request-state-removal",
    "tasks-mrtr-input", "tasks-request-headers", "tasks-dispatch-and-envelope", "tasks-status-notifications",
    "tasks-required-task-error", "tasks-mrtr-composition",
)
MODERN_PENDING = ("json-schema-2020-12", "http-header-validation", "http-custom-header-server-validation")
EXPECTED_FAILURES = HERE / "expected-failures.yml"


def conformance_home(version: str = SUITE_VERSION) -> Path:
    """``$VMCP_CONFORMANCE_HOME/<version>`` when set, else
    ``${XDG_CACHE_HOME:-$HOME/.cache}/vmcp-actors/conformance-<version>``."""
    explicit = os.environ.get("VMCP_CONFORMANCE_HOME")
    if explicit:
        return Path(explicit) / version
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "vmcp-actors" / f"conformance-{version}"


@dataclass(frozen=True)
class Requirements:
    """What a revision's requirement set (``list --requirements R``) asks of a server.

    ``required`` scenarios decide conformance (the suite exits 1 when one fails); ``not_scored``
    maps each server scenario that runs but never counts to the suite's reason (``extension``
    for the ``tasks-*`` scenarios, ``pending`` for scenarios whose checks are not final).
    """

    revision: str
    required: tuple[str, ...]
    not_scored: dict[str, str]

    def reason(self, reason: str) -> tuple[str, ...]:
        return tuple(name for name, why in self.not_scored.items() if why == reason)


def parse_requirements(revision: str, listing: str) -> Requirements:
    """The server side of ``conformance list --requirements <revision>``'s output."""
    required: list[str] = []
    not_scored: dict[str, str] = {}
    section = reason = None
    for line in listing.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not line.startswith(" "):  # a section heading
            section = "server" if stripped.startswith("Server scenarios") else \
                "not_scored" if stripped.startswith("Run and reported") else None
            continue
        if section == "not_scored" and not stripped.startswith("- "):
            reason = stripped.split(" (")[0].rstrip(":")  # "extension (16):"
            continue
        if section == "server" and stripped.startswith("- "):
            required.append(stripped[2:].strip())
        elif section == "not_scored" and stripped.endswith("[server]") and reason:
            not_scored[stripped[2:].removesuffix("[server]").strip()] = reason
    return Requirements(revision, tuple(required), not_scored)


@dataclass(frozen=True)
class Suite:
    node: Path
    entry: Path  # the suite's dist/index.js

    @property
    def version(self) -> str:
        """The version ``package.json`` next to ``dist/`` names (no Node run)."""
        package = json.loads((self.entry.parent.parent / "package.json").read_text())
        return str(package.get("version", "?"))

    def requirements(self, revision: str = MODERN_REQUIREMENTS) -> Requirements:
        """What ``revision`` requires of a server, as this suite lists it (a second, no network)."""
        done = subprocess.run([str(self.node), str(self.entry), "list", "--requirements", revision],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
                              env={**os.environ, "NO_COLOR": "1"}, check=True)
        return parse_requirements(revision, done.stdout)

    def command(self, url: str, spec_version: str, output_dir: Path, expected_failures: Path | None) -> list[str]:
        """``spec_version`` 2026-07-28 runs that revision's requirement set (the alpha suite)."""
        selection = ["--requirements", spec_version] if spec_version == MODERN_REQUIREMENTS else \
            ["--suite", "all", "--spec-version", spec_version]
        command = [str(self.node), str(self.entry), "server", "--url", url, *selection, "--output-dir", str(output_dir)]
        if expected_failures is not None:
            command += ["--expected-failures", str(expected_failures)]
        return command


def find_suite(version: str = SUITE_VERSION, home: Path | None = None) -> Suite | None:
    """The installed suite of ``version`` (in ``home``, by default :func:`conformance_home`), or
    None when ``scripts/install-conformance`` has not run."""
    home = conformance_home(version) if home is None else home
    node = home / "node_modules" / ".bin" / "node"
    entry = home / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if node.is_file() and os.access(node, os.X_OK) and entry.is_file():
        return Suite(node, entry)
    return None


@dataclass(frozen=True)
class Check:
    scenario: str
    id: str
    name: str
    status: str  # SUCCESS | FAILURE | WARNING | INFO
    message: str

    def __str__(self) -> str:
        return f"{self.scenario}: {self.id} ({self.name}) {self.status}: {self.message or '(no message)'}"


@dataclass(frozen=True)
class SuiteRun:
    """One ``conformance server`` run: exit code, output and every check it wrote."""

    command: list[str]
    returncode: int
    output: str
    checks: list[Check]
    ran: tuple[str, ...] = ()  # every scenario that wrote a checks.json, in the order run (some write none)

    @property
    def timed_out(self) -> bool:
        return self.returncode == TIMED_OUT

    def scenarios(self) -> dict[str, str]:
        """Each scenario and how it went: ``passed``, or ``failed`` when any check failed (a
        scenario that checked nothing passed, as the suite counts it)."""
        outcome: dict[str, str] = {scenario: "passed" for scenario in self.ran}
        for check in self.checks:
            failed = check.status == "FAILURE"
            outcome[check.scenario] = "failed" if failed or outcome.get(check.scenario) == "failed" else "passed"
        return outcome

    def failed_scenarios(self) -> list[str]:
        return sorted(scenario for scenario, outcome in self.scenarios().items() if outcome == "failed")

    def table(self) -> str:
        """One line a scenario: how it went and its checks by status (for test output)."""
        lines = []
        for scenario, outcome in self.scenarios().items():
            statuses = [check.status for check in self.checks if check.scenario == scenario]
            counts = ", ".join(f"{statuses.count(s)} {s.lower()}" for s in ("SUCCESS", "FAILURE", "WARNING", "INFO")
                               if statuses.count(s))
            first = next((check for check in self.checks if check.scenario == scenario and check.status == "FAILURE"),
                         None)
            reason = f" - {first.id}: {first.message[:160]}" if first is not None else ""
            lines.append(f"  {'ok  ' if outcome == 'passed' else 'FAIL'} {scenario} ({counts or 'no checks'}){reason}")
        return "\n".join(lines)

    def count(self, status: str) -> int:
        return sum(1 for check in self.checks if check.status == status)

    @property
    def passed(self) -> int:
        return self.count("SUCCESS")

    @property
    def scored(self) -> int:
        """Checks that pass or fail (the suite's denominator; warnings and info are not scored)."""
        return self.passed + self.count("FAILURE")

    @property
    def problems(self) -> list[Check]:
        """Failures and warnings: with a baseline file the suite fails a scenario on either."""
        return [check for check in self.checks if check.status in ("FAILURE", "WARNING")]

    def summary(self) -> str:
        return (f"{self.passed} of {self.scored} checks passed, {self.count('FAILURE')} failed, "
                f"{self.count('WARNING')} warnings (exit {self.returncode})")

    def report(self, tail: int = 3000) -> str:
        """What to show when the run is not clean: the summary, each problem, the output's end."""
        lines = [self.summary(), *(f"  {check}" for check in self.problems)]
        if not self.checks or self.returncode != 0 and not self.problems:
            lines += ["--- suite output (end) ---", self.output[-tail:]]
        return "\n".join(lines)


def _results(output_dir: Path) -> tuple[tuple[str, ...], list[Check]]:
    """The scenarios (in the order they ran) and every check of every
    ``<output_dir>/server-<scenario>-<time>/checks.json`` (both suite versions write this layout:
    a JSON array of checks with ``id``, ``name``, ``status`` and ``errorMessage``)."""
    ran: list[str] = []
    checks: list[Check] = []
    for path in sorted(output_dir.glob("*/checks.json"), key=_started):
        scenario = _STARTED.sub("", path.parent.name.removeprefix("server-"))
        ran.append(scenario)
        try:
            entries = json.loads(path.read_text())
        except ValueError:
            checks.append(Check(scenario, "checks.json", "unreadable", "FAILURE", f"cannot parse {path}"))
            continue
        for entry in entries if isinstance(entries, list) else []:
            checks.append(Check(scenario, str(entry.get("id", "?")), str(entry.get("name", "?")),
                                str(entry.get("status", "?")), str(entry.get("errorMessage") or "")))
    return tuple(ran), checks


_STARTED = re.compile(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$")  # a results directory's name ends with its start time


def _started(checks_json: Path) -> str:
    """The start time in a results directory's name (they sort as strings): the run order."""
    found = _STARTED.search(checks_json.parent.name)
    return found.group(0) if found else ""


def read_checks(output_dir: Path) -> list[Check]:
    """Every check of every ``<output_dir>/server-<scenario>-<time>/checks.json``, by scenario."""
    return _results(output_dir)[1]


def run_suite(suite: Suite, url: str, spec_version: str, workdir: Path, *,
              expected_failures: Path | None = EXPECTED_FAILURES, timeout: float = SUITE_TIMEOUT) -> SuiteRun:
    """Run every server scenario of ``spec_version`` against ``url``, in ``workdir``
    (results go to ``workdir/results``)."""
    output_dir = workdir / "results"
    command = suite.command(url, spec_version, output_dir, expected_failures)
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    try:
        done = subprocess.run(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, check=False)
        returncode, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        returncode, output = TIMED_OUT, partial + f"\n[timed out after {timeout} s]"
    ran, checks = _results(output_dir)
    return SuiteRun(command, returncode, output, checks, ran)
