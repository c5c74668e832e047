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
INSTALL_SCRIPT = "scripts/install-conformance"
SUITE_TIMEOUT = 300.0  # seconds for one whole suite run; a run takes about 10 s
HERE = Path(__file__).resolve().parent
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
class Suite:
    node: Path
    entry: Path  # the suite's dist/index.js

    def command(self, url: str, spec_version: str, output_dir: Path, expected_failures: Path | None) -> list[str]:
        """``spec_version`` 2026-07-28 runs that revision's requirement set (the alpha suite)."""
        selection = ["--requirements", spec_version] if spec_version == MODERN_REQUIREMENTS else \
            ["--suite", "all", "--spec-version", spec_version]
        command = [str(self.node), str(self.entry), "server", "--url", url, *selection, "--output-dir", str(output_dir)]
        if expected_failures is not None:
            command += ["--expected-failures", str(expected_failures)]
        return command


def find_suite(home: Path | None = None, version: str = SUITE_VERSION) -> Suite | None:
    """The installed suite of ``version``, or None when ``scripts/install-conformance`` has not run."""
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

    def scenarios(self) -> dict[str, str]:
        """Each scenario and how it went: ``passed``, or ``failed`` when any check failed."""
        outcome: dict[str, str] = {}
        for check in self.checks:
            failed = check.status == "FAILURE"
            outcome[check.scenario] = "failed" if failed or outcome.get(check.scenario) == "failed" else "passed"
        return outcome

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


def read_checks(output_dir: Path) -> list[Check]:
    """Every check of every ``<output_dir>/server-<scenario>-<time>/checks.json``, by scenario."""
    checks: list[Check] = []
    for path in sorted(output_dir.glob("*/checks.json")):
        scenario = re.sub(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$", "", path.parent.name.removeprefix("server-"))
        try:
            entries = json.loads(path.read_text())
        except ValueError:
            checks.append(Check(scenario, "checks.json", "unreadable", "FAILURE", f"cannot parse {path}"))
            continue
        for entry in entries:
            checks.append(Check(scenario, str(entry.get("id", "?")), str(entry.get("name", "?")),
                                str(entry.get("status", "?")), str(entry.get("errorMessage") or "")))
    return checks


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
        returncode, output = -1, partial + f"\n[timed out after {timeout} s]"
    return SuiteRun(command, returncode, output, read_checks(output_dir))
