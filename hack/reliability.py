"""The README's reliability table: run the fault suite several times and count what happened.

    .venv/bin/python hack/reliability.py [--runs 3]        (make reliability RUNS=3)

Each run is one pytest session of ``tests/integration/test_faults_*.py`` (a fresh test cluster
with the real Trainer and JobSet controllers) plus the local backend's adoption faults
(``tests/local/test_local_adoption.py``). Outcomes come from pytest's JUnit report. TrainJobs
created, leaked and duplicated come from the fault tests' namespace checks, which count at the
API server -- a watch of every TrainJob stored, and a listing of each test's namespace when the
test ends -- not from the launcher's output (``KFP_TRAINER_RELIABILITY_LOG``, see
tests/integration/faults.py). The hostile-input figures come from
``tests/unit/hostile_harness.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KEEP = os.environ.get("KFP_TRAINER_RELIABILITY_DIR", tempfile.gettempdir())  # where a failing run's pytest output is kept
SUITES = [
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "integration").glob("test_faults_*.py")),
    "tests/local/test_local_adoption.py",
]


def run_once(index: int, workdir: Path) -> dict:
    """One pytest session of the fault suite: its test outcomes and the namespace checks' figures."""
    junit, ledger = workdir / f"junit-{index}.xml", workdir / f"ledger-{index}.jsonl"
    env = {**os.environ, "CI": "true", "KFP_TRAINER_RELIABILITY_LOG": str(ledger)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *SUITES],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - started
    cases = ET.parse(junit).getroot().iter("testcase") if junit.exists() else iter(())
    tests = failed = 0
    failures = []
    for case in cases:
        tests += 1
        bad = case.find("failure") is not None or case.find("error") is not None
        failed += bad
        if bad:
            failures.append(f"{case.get('classname')}::{case.get('name')}")
    checks = [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []
    if tests == 0 or failed:
        report = Path(KEEP) / f"kfp-trainer-reliability-run-{index + 1}.txt"
        report.write_text(done.stdout + done.stderr)
        sys.stderr.write(f"run {index + 1}: pytest output in {report}\n")
    return {
        "tests": tests,
        "failed": failed,
        "failures": failures,
        "seconds": seconds,
        "checked": len(checks),
        "trainjobs": sum(c["trainjobs"] for c in checks),
        "leaked": sum(c["leaked"] for c in checks),
        "left": sum(bool(c["leftovers"]) for c in checks),
        "duplicated": sum(c["duplicated"] for c in checks),
    }


def hostile() -> dict:
    """Tried / rejected / accepted safely / secrets exposed, from the hostile-input harness."""
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "unit" / "hostile_harness.py")], cwd=REPO, capture_output=True, text=True
    ).stdout

    def number(pattern: str) -> int:
        found = re.search(pattern, out)
        return int(found.group(1)) if found else -1

    return {
        "tried": number(r"hostile inputs tried: (\d+)"),
        "rejected": number(r"rejected before any write, field named, exit 2: (\d+)"),
        "accepted": number(r"accepted and rendered safely \(asserted\): (\d+)"),
        "exposed": number(r"secrets exposed: (\d+)"),
        "tracebacks": number(r"tracebacks: (\d+)"),
    }


def table(runs: list[dict], bad: dict) -> str:
    tests = sum(r["tests"] for r in runs)
    passed = tests - sum(r["failed"] for r in runs)
    rows = [
        ("fault tests per run (each injects its fault into a real launch)", f"{runs[0]['tests'] if runs else 0}"),
        ("runs", f"{len(runs)} (" + ", ".join(f"{r['seconds']:.0f} s" for r in runs) + ")"),
        ("outcomes correct", f"{passed} / {tests}"),
        ("TrainJobs created (counted at the API server)", str(sum(r["trainjobs"] for r in runs))),
        ("TrainJobs leaked", str(sum(r["leaked"] for r in runs))),
        ("tests that left a JobSet, Job or pod behind", str(sum(r["left"] for r in runs))),
        ("TrainJobs duplicated (two live for one run and task)", str(sum(r["duplicated"] for r in runs))),
        ("hostile inputs tried / rejected / accepted safely", f"{bad['tried']} / {bad['rejected']} / {bad['accepted']}"),
        ("secrets exposed", str(bad["exposed"])),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'':<{width}} | figure |", f"|{'-' * (width + 2)}|--------|"]
    lines += [f"| {k:<{width}} | {v} |" for k, v in rows]
    for i, r in enumerate(runs, 1):
        lines += [f"run {i}: failed {name}" for name in r["failures"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kfp-trainer-reliability-") as tmp:
        runs = []
        for i in range(args.runs):
            runs.append(run_once(i, Path(tmp)))
            r = runs[-1]
            print(
                f"run {i + 1}/{args.runs}: {r['tests'] - r['failed']}/{r['tests']} correct, {r['trainjobs']} TrainJobs, "
                f"{r['leaked']} leaked, {r['duplicated']} duplicated ({r['seconds']:.0f} s)",
                flush=True,
            )
    print(table(runs, hostile()))
    clean = all(r["failed"] == 0 and r["leaked"] == 0 and r["duplicated"] == 0 and r["tests"] > 0 for r in runs)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
