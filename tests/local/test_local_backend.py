"""The local backend runs real processes: distributed torch across local nodes, failures,
cancellation with no stray processes, initializers, adoption."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kfp_trainer.backends.local import LocalBackend, descendants
from kfp_trainer.errors import InvalidSpecErrors, JobFailedError, RuntimeNotFoundError, ValidationError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

ALLREDUCE = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    # One write per line: the ranks of a node share its stdout, unbuffered, and print() writes
    # the text and its newline apart, so two ranks' lines could interleave.
    record = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "node_rank": int(os.environ["GROUP_RANK"]), "sum": t.item()}
    sys.stdout.write(json.dumps(record) + "\\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    """
)


def run(tmp_path: Path, **inputs):
    backend = LocalBackend(tmp_path / "jobs")
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(logs=inputs.pop("logs", "0")), out=out)
    outcome = launcher.run(prepare(launcher.backend, TrainJobInputs(run_id=inputs.pop("run_id", "run-1"), task_name="train", **inputs)))
    return outcome, out.getvalue(), backend


def test_two_nodes_two_processes_all_reduce_in_a_world_of_four(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    outcome, out, _ = run(tmp_path, num_nodes=2, num_proc_per_node=2, command=["torchrun", str(script)], logs="all")
    records = [json.loads(line.split("] ", 1)[1]) for line in out.splitlines() if '"world_size"' in line]
    assert outcome.succeeded
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3]
    assert {r["world_size"] for r in records} == {4}
    assert {r["sum"] for r in records} == {10.0}
    assert sorted({r["node_rank"] for r in records}) == [0, 1]


def test_failing_trainer_fails_with_the_log_tail(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("print('loading data', flush=True)\nraise SystemExit('CUDA out of memory (pretend)')\n")
    with pytest.raises(JobFailedError) as info:
        run(tmp_path, command=["python", str(script)])
    message = str(info.value)
    assert "FailedJobs" in message and "exited with code 1" in message
    assert "loading data" in message and "CUDA out of memory (pretend)" in message


def test_a_failing_node_is_named_and_shown_not_the_node_stopped_after_it(tmp_path):
    # Node 1 fails; node 0 (which would run on) is stopped after it and exits non-zero as well.
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, time\nrank = os.environ['PET_NODE_RANK']\nprint(f'rank {rank} up', flush=True)\n"
        "sys.exit(3) if rank == '1' else time.sleep(60)\n"
    )
    with pytest.raises(JobFailedError) as info:
        run(tmp_path, num_nodes=2, command=["python", str(script)])
    message = str(info.value)
    assert "node-1 exited with code 3" in message, message
    assert "node-0: exit -15 (stopped after node-1 failed)" in message and "node-1: exit 3\n" in message, message
    assert "log lines of node-1:\n  rank 1 up" in message, message


def test_initializers_fill_the_workspace_the_trainer_reads(tmp_path):
    script = tmp_path / "count.py"
    script.write_text("import sys\nprint('records', sum(1 for _ in open(sys.argv[1])), flush=True)\n")
    outcome, out, backend = run(
        tmp_path, dataset_uri="builtin://datasets/addition", command=["python", str(script), "/workspace/dataset/test.jsonl"]
    )
    assert outcome.succeeded
    assert any(line.startswith("records ") and int(line.split()[1]) > 100 for line in out.splitlines())
    assert backend.host_path(outcome.ref, "/workspace/dataset").is_dir()


def test_retry_adopts_the_finished_job(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('trained', flush=True)\n")
    first, _, _ = run(tmp_path, command=["python", str(script)])
    second, _, _ = run(tmp_path, command=["python", str(script)])
    assert not first.adopted and second.adopted and first.ref == second.ref


def test_bad_runtime_and_uri_fail_before_anything_starts(tmp_path):
    with pytest.raises(RuntimeNotFoundError, match="Available .*torch-distributed"):
        run(tmp_path, runtime="no-such-runtime", command=["python", "-c", "pass"])
    with pytest.raises(InvalidSpecErrors, match="dataset_uri"):
        run(tmp_path, dataset_uri="ftp://x/y", command=["python", "-c", "pass"])
    with pytest.raises(ValidationError, match="executable found"):
        run(tmp_path, command=["no-such-binary-xyz"])
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").rglob("trainjob.json"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


def test_cancel_kills_the_whole_process_tree(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(300)\n")
    env = {**os.environ, "KFP_TRAINER_LOCAL_ROOT": str(tmp_path / "jobs")}
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kfp_trainer.cli",
            "launch",
            "--local",
            "--run-id",
            "r",
            "--task-name",
            "t",
            "--num-nodes",
            "2",
            "--num-proc-per-node",
            "2",
            "--command",
            f"torchrun,{script}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 90
    state = None
    while time.time() < deadline:
        files = list((tmp_path / "jobs").rglob("trainjob.json"))
        state = json.loads(files[0].read_text()) if files else None
        logs = list((tmp_path / "jobs").rglob("node-*.log"))
        if state and state["status"].get("pids") and sum(p.read_text().count("started") for p in logs) >= 4:
            break
        time.sleep(0.5)
    else:
        launcher.kill()
        pytest.fail(f"job did not start: {launcher.stdout.read() if launcher.stdout else ''}")
    leaders = state["status"]["pids"]
    members = leaders + [child for leader in leaders for child in descendants(leader)]
    assert len(members) >= 6  # 2 torchrun agents + 4 workers
    launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, output
    assert "deleting TrainJob" in output
    time.sleep(0.5)
    assert [p for p in members if _alive(p)] == []
    assert not list((tmp_path / "jobs").rglob("trainjob.json"))


def test_runtimes_from_yaml_mirror_a_cluster(tmp_path):
    runtimes = tmp_path / "runtimes"
    runtimes.mkdir()
    shared = Path(__file__).resolve().parents[2].parent / "shared" / "kubeflow-trainer-v2.3.0" / "runtimes" / "torch_distributed.yaml"
    if shared.exists():
        (runtimes / "torch.yaml").write_text(shared.read_text())
    (runtimes / "plain.yaml").write_text(
        textwrap.dedent(
            """
        apiVersion: trainer.kubeflow.org/v1alpha1
        kind: ClusterTrainingRuntime
        metadata: {name: plain-batch}
        spec:
          mlPolicy: {numNodes: 1}
          template:
            spec:
              replicatedJobs:
                - name: node
                  template: {spec: {template: {spec: {containers: [{name: node, image: busybox,
                    command: [python, -c, "import os; print('PET', os.environ.get('PET_NNODES'))"]}]}}}}
        """
        )
    )
    backend = LocalBackend(tmp_path / "jobs", runtimes_dir=runtimes)
    out = io.StringIO()
    outcome = Launcher(backend, out=out).run(prepare(backend, TrainJobInputs(run_id="r", task_name="t", runtime="plain-batch")))
    # A plain (non-torch) runtime runs its own command as it is, without the torch env.
    assert outcome.succeeded and "PET None" in out.getvalue()
    with pytest.raises(RuntimeNotFoundError, match="plain-batch"):
        Launcher(backend, out=io.StringIO()).run(prepare(backend, TrainJobInputs(run_id="r", task_name="t", runtime="nope")))


def test_one_backend_follows_two_jobs_each_through_its_own_handle(tmp_path):
    from kfp_trainer.backends.local_job import LocalJob
    from kfp_trainer.jobstatus import Phase
    from kfp_trainer.prepare import prepare

    backend = LocalBackend(tmp_path / "jobs")
    script = tmp_path / "say.py"
    script.write_text("import sys, time\ntime.sleep(0.5)\nprint('I am', sys.argv[1], flush=True)\n")
    handles = []
    for task in ("a", "b"):
        job = prepare(backend, TrainJobInputs(run_id="run-1", task_name=task, command=["python", str(script), task]))
        handles.append(backend.submit(job.manifest, runtime=job.runtime).job)
    again = backend.submit(prepare(backend, TrainJobInputs(run_id="run-1", task_name="a", command=["python", str(script), "a"])).manifest)
    assert again.adopted and isinstance(again.job, LocalJob) and again.job.changed is handles[0].changed  # woken by its supervisor
    assert not hasattr(backend, "runtime")
    for handle, task in zip(handles, ("a", "b"), strict=True):
        statuses = [s for s in handle.watch() if s is not None]
        assert statuses[-1].phase is Phase.SUCCEEDED, statuses
        lines: list[str] = []
        handle.follow_logs(nodes="0", sink=lambda line, into=lines: into.append(line.text), stop=threading.Event())
        assert lines == [f"I am {task}"]
        assert "trainjob.json" in handle.inspect_hint() and handle.blockers() == [] and handle.queue_notes() == []
    handles[0].delete()
    assert not backend.job_dir(handles[0].ref).exists() and backend.job_dir(handles[1].ref).exists()


def test_two_namespaces_with_a_job_of_the_same_name_do_not_collide(tmp_path):
    """Deleting team-a/train stops team-a's nodes only; team-b/train runs on, woken by its own supervisor, to its end."""
    from kfp_trainer.jobstatus import Phase

    backend = LocalBackend(tmp_path / "jobs")
    script = tmp_path / "wait.py"
    script.write_text("import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists():\n    time.sleep(0.05)\nprint('done')\n")
    go = tmp_path / "go"
    handles = {}
    for namespace in ("team-a", "team-b"):
        command = ["python", str(script), str(go)]
        job = prepare(backend, TrainJobInputs(run_id="run-1", task_name="train", name="train", namespace=namespace, command=command))
        handles[namespace] = backend.submit(job.manifest, runtime=job.runtime).job
    a, b = handles["team-a"], handles["team-b"]
    assert (a.ref.name, b.ref.name) == ("train", "train") and a.dir != b.dir and a.changed is not b.changed
    assert set(backend.jobs) == {("team-a", "train"), ("team-b", "train")}
    backend.delete(a.ref)  # by ref, as garbage collection and a replaced job do
    assert not a.dir.exists() and ("team-b", "train") in backend.jobs
    go.write_text("")
    statuses = [s for s in b.watch() if s is not None]
    assert statuses[-1].phase is Phase.SUCCEEDED, statuses
    lines: list[str] = []
    b.follow_logs(nodes="0", sink=lambda line: lines.append(line.text), stop=threading.Event())
    assert lines == ["done"]


def test_a_job_whose_record_is_removed_is_deleted_the_step_fails_and_its_nodes_go(tmp_path):
    """Someone removes the local job's trainjob.json while the step follows it, as a TrainJob deleted by
    someone else: the step fails (DeletedWhileRunning, exit 1) with each line once, the supervisor stops
    the node and never writes the record again."""
    from kfp_trainer.backends.deletion import DELETED_WHILE_RUNNING

    script = tmp_path / "lines.py"
    script.write_text("import time\nfor i in range(3):\n    print('line', i, flush=True)\ntime.sleep(300)\n")
    backend = LocalBackend(tmp_path / "jobs")
    out = io.StringIO()
    result: dict = {}

    inputs = TrainJobInputs(run_id="r", task_name="t", command=["python", str(script)])

    def follow() -> None:
        try:
            Launcher(backend, LaunchOptions(logs="0"), out=out).run(prepare(backend, inputs))
        except JobFailedError as e:
            result["error"] = e

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while "line 2" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.1)
    record = next((tmp_path / "jobs").rglob("trainjob.json"))
    pids = json.loads(record.read_text())["status"]["pids"]
    record.unlink()
    thread.join(60)
    assert not thread.is_alive() and "error" in result, out.getvalue()
    error = result["error"]
    assert error.exit_code == 1 and error.reason == DELETED_WHILE_RUNNING and "was deleted while running" in str(error)
    assert [line for line in out.getvalue().splitlines() if line.startswith("line ")] == ["line 0", "line 1", "line 2"]
    (job,) = backend.jobs.values()  # its supervisor, in this process
    assert job.thread is not None
    job.thread.join(30)
    assert not job.thread.is_alive() and [p for p in pids if _alive(p)] == []
    assert not record.exists()
