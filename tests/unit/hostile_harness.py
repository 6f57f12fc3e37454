"""Runs one hostile case through an entry point and records everything a person or the cluster would see.

Entry points: ``render`` (kfp_trainer.spec.render), ``launcher`` (Launcher.run on a recording
backend), ``component`` (train_job.python_func, the code a KFP step runs) and ``cli``
(``kfp-trainer launch --inputs-file``, in process, on the same recording backend).

Run it as a script to print the counts for the README's reliability table:

    .venv/bin/python tests/unit/hostile_harness.py
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_cases import AWS_ID, AWS_KEY, CANARIES, CASES, CLI_CASES, COMPONENT_CASES, Case, CliCase  # noqa: E402

from kfp_trainer.backends.base import RuntimeInfo  # noqa: E402
from kfp_trainer.errors import KfpTrainerError  # noqa: E402
from kfp_trainer.jobstatus import JobStatus, Phase  # noqa: E402
from kfp_trainer.prepare import prepare
from tests.fakes import FakeBackend  # noqa: E402

ENTRY_POINTS = ("render", "launcher", "component", "cli")


class RecordingBackend(FakeBackend):
    """A cluster that records every call; ``writes`` are the calls that would change the cluster."""

    def __init__(self, *, api_version: str = "v2.2", allow_host_access: bool = False) -> None:
        done = JobStatus(Phase.SUCCEEDED, reason="AllJobsCompleted", raw={"jobsStatus": [{"name": "node", "succeeded": 1}]})
        lines = [json.dumps({"step": 1, "loss": 1.0})]
        super().__init__([JobStatus(Phase.RUNNING), done], namespace="team-a", api_version=api_version, lines=lines, hold_logs=False)
        self.allow_host_access = allow_host_access

    def runtime_info(self, inputs: Any) -> RuntimeInfo:
        jobs = (("dataset-initializer", 1), ("model-initializer", 1), ("node", inputs.num_nodes or 1))
        return RuntimeInfo(
            name=inputs.runtime, kind=inputs.runtime_kind, api_version=self.api_version,  # type: ignore[arg-type]
            replicated_jobs=jobs, allow_host_access=self.allow_host_access,
        )  # fmt: skip


@dataclass
class Result:
    """What one run of a case showed and did."""

    entry: str
    rejected: bool
    exit_code: int | None = None
    message: str = ""  # the error people see
    fields: list[str] = field(default_factory=list)  # fields named by a structured error (render, launcher)
    output: str = ""  # everything printed (stdout, stderr, launcher log)
    manifest: dict[str, Any] | None = None  # what reached the cluster (or the render's result)
    writes: list[Any] = field(default_factory=list)
    artifacts: str = ""  # output artifacts: metadata, report, handle

    def shown(self) -> str:
        """Everything a person, the cluster or a downstream step can read after the run."""
        return "\n".join((self.message, self.output, json.dumps(self.manifest, default=str), self.artifacts))


def _errors(e: BaseException) -> tuple[str, list[str]]:
    fields = [err.field for err in getattr(e, "errors", [])] or ([e.field] if hasattr(e, "field") else [])
    return str(e), fields


def run_render(case: Case, tmp: Path) -> Result:
    from kfp_trainer.spec import TrainJobInputs, render

    try:
        inputs = TrainJobInputs.parse(**{**_base(), **case.inputs})
        manifest = render(inputs, api_version=case.api_version, allow_host_access=case.allow_host_access)  # type: ignore[arg-type]
    except KfpTrainerError as e:
        message, fields = _errors(e)
        return Result("render", True, e.exit_code, message, fields)
    except Exception:  # noqa: BLE001 - a traceback is what the suite looks for
        return Result("render", True, None, traceback.format_exc())
    return Result("render", False, 0, manifest=manifest)


def run_launcher(case: Case, tmp: Path) -> Result:
    from kfp_trainer.launcher import Launcher, LaunchOptions
    from kfp_trainer.spec import TrainJobInputs

    backend = RecordingBackend(api_version=case.api_version, allow_host_access=case.allow_host_access)
    out = io.StringIO()
    try:
        inputs = TrainJobInputs.parse(**{**_base(), **case.inputs})
        Launcher(backend, LaunchOptions(logs="none"), out=out).run(prepare(backend, inputs))
    except KfpTrainerError as e:
        message, fields = _errors(e)
        return Result("launcher", True, e.exit_code, message, fields, out.getvalue(), _last(backend), backend.writes)
    except Exception:  # noqa: BLE001
        return Result("launcher", True, None, traceback.format_exc(), [], out.getvalue(), _last(backend), backend.writes)
    return Result("launcher", False, 0, output=out.getvalue(), manifest=_last(backend), writes=backend.writes)


def run_component(case: Case, tmp: Path) -> Result:
    from kfp import dsl

    import kfp_trainer.backends as backends
    from kfp_trainer.components import train_job

    backend = RecordingBackend(api_version=case.api_version, allow_host_access=case.allow_host_access)
    model = _artifact(dsl.Model, tmp / "base-model", {"source_uri": f"s3://{AWS_ID}:{AWS_KEY}@models/base"})
    (tmp / "base-model").mkdir(parents=True, exist_ok=True)
    outputs = {
        "output_model": _artifact(dsl.Model, tmp / "out" / "model"),
        "metrics": _artifact(dsl.Metrics, tmp / "out" / "metrics"),
        "report": _artifact(dsl.HTML, tmp / "out" / "report.html"),
        "trainjob": str(tmp / "out" / "trainjob"),
    }
    kwargs = {"backend": "kubernetes", "logs": "none", "model": model, **_base(), **case.inputs}
    workspace = tmp / "workspace"
    if case.setup == "workspace":  # a dataset to stage, and the pipeline workspace shared with the TrainJob
        workspace.mkdir()
        (tmp / "dataset").mkdir()
        (tmp / "dataset" / "train.jsonl").write_text("{}\n")
        kwargs.update(
            dataset=_artifact(dsl.Dataset, tmp / "dataset"),
            workspace_path=str(workspace),
            task_config={
                "volumes": [{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "ws"}}],
                "volumeMounts": [{"name": "kfp-workspace", "mountPath": str(workspace)}],
                "env": [{"name": "FROM_TASK", "value": "1"}],
            },
        )
    stdout, stderr = io.StringIO(), io.StringIO()
    saved = backends.select_backend
    backends.select_backend = lambda kind="auto", **kw: backend  # type: ignore[assignment]
    code: int | None = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            train_job.python_func(**outputs, **kwargs)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except Exception:  # noqa: BLE001 - a traceback is what the suite looks for
        stderr.write(traceback.format_exc())
        code = None
    finally:
        backends.select_backend = saved
    written = sorted(str(p.relative_to(tmp)) for d in (tmp / "out", workspace) if d.exists() for p in d.rglob("*"))
    artifacts = json.dumps({k: dict(v.metadata) for k, v in outputs.items() if hasattr(v, "metadata")}, default=str)
    for path in (Path(outputs["report"].path), Path(outputs["trainjob"])):
        if path.is_file():
            artifacts += "\n" + path.read_text(errors="replace")
    text = stdout.getvalue() + stderr.getvalue()
    return Result(
        "component",
        code != 0,
        code,
        stderr.getvalue(),
        [],
        text,
        _last(backend),
        backend.writes + [("file", w) for w in written],
        artifacts,
    )


def run_cli(case: Case, tmp: Path) -> Result:
    from kfp_trainer import cli
    from kfp_trainer.backends import kubernetes

    backend = RecordingBackend(api_version=case.api_version, allow_host_access=case.allow_host_access)
    path = tmp / "inputs.yaml"
    path.write_text(yaml.safe_dump({**_base(), **case.inputs}, allow_unicode=True))
    stdout, stderr = io.StringIO(), io.StringIO()
    saved = kubernetes.KubernetesBackend.from_config
    kubernetes.KubernetesBackend.from_config = classmethod(lambda cls, *a, **kw: backend)  # type: ignore[method-assign, assignment]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code: int | None = cli.main(["launch", "--inputs-file", str(path), "--logs", "none"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except Exception:  # noqa: BLE001
        stderr.write(traceback.format_exc())
        code = None
    finally:
        kubernetes.KubernetesBackend.from_config = saved  # type: ignore[method-assign]
    text = stdout.getvalue() + stderr.getvalue()
    return Result("cli", code != 0, code, stderr.getvalue(), [], text, _last(backend), backend.writes)


RUNNERS = {"render": run_render, "launcher": run_launcher, "component": run_component, "cli": run_cli}


def run_cli_case(case: CliCase, tmp: Path, *, subprocess_run: bool = False) -> Result:
    """``kfp-trainer`` with the case's arguments: in this process, or as a real process."""
    import subprocess

    from kfp_trainer import cli

    for name, data in case.files:
        (tmp / name).write_bytes(data)
    argv = [a.replace("{dir}", str(tmp)) for a in case.argv]
    if subprocess_run:
        done = subprocess.run([sys.executable, "-m", "kfp_trainer.cli", *argv], capture_output=True, text=True, timeout=120)
        return Result("cli-process", done.returncode != 0, done.returncode, done.stderr, [], done.stdout + done.stderr)
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code: int | None = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except Exception:  # noqa: BLE001
        stderr.write(traceback.format_exc())
        code = None
    return Result("cli", code != 0, code, stderr.getvalue(), [], stdout.getvalue() + stderr.getvalue())


def cli_problems(case: CliCase, result: Result) -> list[str]:
    """Everything wrong with a command-line run: it must end in exit 2 with ``case.expect`` in the error."""
    found = []
    if "Traceback" in result.shown() or result.exit_code is None:
        found.append("a traceback")
    if any(c in result.shown() for c in CANARIES):
        found.append("secret exposed")
    if result.exit_code != 2:
        found.append(f"exit code {result.exit_code}, not 2")
    if case.expect not in result.message:
        found.append(f"error does not name {case.expect}: {result.message[-300:]}")
    return found


def run(case: Case, entry: str, tmp: Path) -> Result:
    """Run ``case`` through ``entry`` in the fresh folder ``tmp``."""
    return RUNNERS[entry](case, tmp)


def problems(case: Case, result: Result) -> list[str]:
    """Everything wrong with ``result`` for ``case``; empty when it behaved as required."""
    found = []
    if "Traceback" in result.shown() or result.exit_code is None:
        found.append("a traceback")
    leaked = [c for c in CANARIES if c in result.shown()]
    if leaked:
        found.append(f"secret exposed: {leaked[0][:8]}...")
    if case.accepted:
        if result.rejected:
            found.append(f"rejected: {result.message[:300]}")
        elif result.manifest is None:
            found.append("nothing rendered")
        elif not case.check(result.manifest):  # type: ignore[misc]
            found.append("rendered, but not as required")
    else:
        if not result.rejected:
            found.append("accepted")
        if result.exit_code not in (2, None):
            found.append(f"exit code {result.exit_code}, not 2")
        if result.writes:
            found.append(f"wrote before rejecting: {result.writes}")
        if result.manifest is not None and result.entry != "render":
            found.append("a TrainJob reached the cluster")
        named = any(f.startswith(case.field) for f in result.fields) if result.fields else case.field in result.message  # type: ignore[arg-type]
        if not named:
            found.append(f"error does not name {case.field}: {result.message[:300]}")
    return found


def _base() -> dict[str, Any]:
    from hostile_cases import BASE

    return dict(BASE)


def _last(backend: RecordingBackend) -> dict[str, Any] | None:
    return backend.submitted[-1] if backend.submitted else None


def _artifact(cls: type, path: Path, metadata: dict[str, Any] | None = None) -> Any:
    a = cls(uri=str(path), name=path.name, metadata=dict(metadata or {}))
    a.path = str(path)
    return a


def main() -> int:
    """Print the counts: cases tried, rejected, accepted safely, secrets exposed, tracebacks, failures."""
    runs = rejected = accepted = exposed = tracebacks = 0
    failures = []
    for cli_case in CLI_CASES:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_cli_case(cli_case, Path(tmp))
        found = cli_problems(cli_case, result)
        runs += 1
        rejected += result.rejected and not found
        exposed += "secret exposed" in found
        tracebacks += "a traceback" in found
        if found:
            failures.append(f"{cli_case.id} via the command line: {'; '.join(found)}")
    for case in CASES + COMPONENT_CASES:
        outcomes = []
        for entry in case.layers:
            with tempfile.TemporaryDirectory() as tmp:
                result = run(case, entry, Path(tmp))
            runs += 1
            found = problems(case, result)
            outcomes.append((result.rejected, not found))
            exposed += any(p.startswith("secret exposed") for p in found)
            tracebacks += "a traceback" in found
            if found:
                failures.append(f"{case.id} via {entry}: {'; '.join(found)}")
        rejected += all(r and ok for r, ok in outcomes)
        accepted += all(not r and ok for r, ok in outcomes)
    total = len(CASES) + len(COMPONENT_CASES) + len(CLI_CASES)
    print(
        f"hostile inputs tried: {total} ({len(CASES)} TrainJob inputs and patches, {len(COMPONENT_CASES)} component options, "
        f"{len(CLI_CASES)} command-line files and flags; {runs} runs through {', '.join(ENTRY_POINTS)})"
    )
    print(f"rejected before any write, field named, exit 2: {rejected}")
    print(f"accepted and rendered safely (asserted): {accepted}")
    print(f"secrets exposed: {exposed}; tracebacks: {tracebacks}; cases not as required: {total - rejected - accepted}")
    for line in failures:
        print("  " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
