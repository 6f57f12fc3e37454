"""A TrainJob deleted by someone else while the step follows it: the decision from the watched object,
the relay's rule for pods re-made while it goes, and the launcher's end of the step (fake backend).

The same on the real Trainer and JobSet controllers: tests/integration/test_faults_deletion.py.
"""

from __future__ import annotations

import io
import os
import signal
import threading

import pytest

from kfp_trainer.backends.base import LogLine, trainjob_status
from kfp_trainer.backends.deletion import DELETED_WHILE_RUNNING, deleted_status, made_before, propagation
from kfp_trainer.cancel import stopping
from kfp_trainer.errors import EXIT_JOB_FAILED, CancelledError, JobFailedError
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.fakes import FakeBackend, FakeClock, FakeJob
from tests.unit.test_log_follower import Body, LogServer, Pods, follower, pod, stamped, wait_lines

SINCE = "2026-05-01T10:00:05Z"
INPUTS = TrainJobInputs(run_id="run-1", task_name="train", namespace="ns")


def trainjob(*, since: str = SINCE, finalizers: list[str] | None = None, conditions: list[dict] | None = None) -> dict:
    meta = {"name": "tj", "namespace": "ns", "uid": "u1", "finalizers": finalizers or []}
    if since:
        meta["deletionTimestamp"] = since
    return {"metadata": meta, "spec": {}, "status": {"conditions": conditions or [], "jobsStatus": [{"name": "node", "ready": 1}]}}


# ----------------------------------------------------------------------------- the decision


@pytest.mark.parametrize(
    ("finalizers", "said"),
    [
        (["foregroundDeletion"], "with foreground propagation"),
        (["orphan"], "with orphan propagation (deletionTimestamp 2026-05-01T10:00:05Z): its JobSet, Jobs and pods are left running"),
        (["example.com/hold"], "with background propagation (deletionTimestamp 2026-05-01T10:00:05Z); finalizers example.com/hold hold it"),
    ],
    ids=["foreground", "orphan", "held-by-another-finalizer"],
)
def test_a_running_job_with_a_deletion_timestamp_is_deleted_by_someone_else(finalizers, said):
    status = trainjob_status(trainjob(finalizers=finalizers))
    assert (status.phase, status.reason) == (Phase.DELETED, DELETED_WHILE_RUNNING)
    assert said in status.message
    assert "not by this step" in status.message and "audit log" in status.message


def test_a_job_that_is_gone_is_deleted_by_someone_else_and_one_not_being_deleted_is_not():
    gone = trainjob_status(None)
    assert (gone.phase, gone.reason) == (Phase.DELETED, DELETED_WHILE_RUNNING) and "no longer exists" in gone.message
    assert deleted_status(trainjob(since="")) is None
    assert trainjob_status(trainjob(since="")).phase is Phase.RUNNING


def test_a_job_that_finished_keeps_its_end_while_it_is_being_deleted():
    complete = [{"type": "Complete", "status": "True", "reason": "JobsCompleted"}]
    failed = [{"type": "Failed", "status": "True", "reason": "FailedJobs"}]
    assert trainjob_status(trainjob(finalizers=["foregroundDeletion"], conditions=complete)).phase is Phase.SUCCEEDED
    assert trainjob_status(trainjob(finalizers=["foregroundDeletion"], conditions=failed)).phase is Phase.FAILED
    suspended = [{"type": "Suspended", "status": "True", "reason": "Suspended"}]
    assert trainjob_status(trainjob(conditions=suspended)).phase is Phase.DELETED


def test_the_propagation_is_read_from_the_finalizers():
    assert propagation(["foregroundDeletion", "x"]) == "foreground"
    assert propagation(["orphan"]) == "orphan"
    assert propagation([]) == "background"


# ----------------------------------------------------------------------------- the relay's rule


def made_at(stamp: str) -> dict:
    return {"metadata": {"creationTimestamp": stamp}}


def test_only_pods_made_before_the_deletion_began_are_relayed():
    assert made_before(made_at("2026-05-01T10:00:04Z"), SINCE)
    assert not made_before(made_at(SINCE), SINCE)  # the same second: re-made
    assert not made_before(made_at("2026-05-01T10:00:09Z"), SINCE)
    assert made_before(made_at("2026-05-01T10:00:09Z"), "")  # not being deleted: every pod
    assert not made_before({"metadata": {}}, SINCE)


def test_the_follower_never_reads_a_pod_re_made_while_its_job_is_being_deleted():
    """The controllers re-make the JobSet of a job held by a foreground-deletion finalizer: its new
    pod runs the script again. The lines of the first pod come once; the new pod is never read."""
    again = Body([stamped(7, "a"), stamped(7, "b"), stamped(7, "c")])
    server = LogServer([Body([stamped(1, "a"), stamped(2, "b"), stamped(3, "c")]), again])
    pods = Pods(pod("running"))
    deleted_at = {"at": ""}
    _, thread, stop, lines = follower(server, pods, deleted_at=lambda: deleted_at["at"])
    wait_lines(lines, 3)
    deleted_at["at"] = SINCE
    remade = pod("running", uid="p2")
    remade["metadata"]["creationTimestamp"] = "2026-05-01T10:00:06Z"
    pods.set(remade)  # the first pod went with its JobSet; the re-made one runs
    threading.Event().wait(0.3)  # the follower looks at the pods it is shown
    stop.set()
    pods.wake()
    thread.join(5)
    assert not thread.is_alive()
    assert lines == ["a", "b", "c"]
    assert len(server.requests) == 1


# ----------------------------------------------------------------------------- the launcher


class StubbornLogs(FakeJob):
    """A log follower that does not return when told to stop (a pod whose log never ends)."""

    def follow_logs(self, *, nodes, sink, stop):
        for line in self.lines:
            sink(LogLine("node-0", line))
        threading.Event().wait(3600)


def deleted(finalizers=("foregroundDeletion",)) -> JobStatus:
    status = deleted_status(trainjob(finalizers=list(finalizers)))
    assert status is not None
    return status


def run_to_error(backend: FakeBackend, **options) -> tuple[JobFailedError, str]:
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=0, **options), out=out, clock=backend.clock)
    with pytest.raises(JobFailedError) as info:
        launcher.run(prepare(launcher.backend, INPUTS))
    return info.value, out.getvalue()


@pytest.mark.parametrize("finalizers", [("foregroundDeletion",), ("orphan",)], ids=["foreground", "orphan"])
def test_the_step_fails_deleted_while_running_and_leaves_the_deletion_alone(finalizers):
    backend = FakeBackend([JobStatus(Phase.RUNNING), deleted(finalizers)], FakeClock(), lines=["a", "b", "c"], idle=True)
    diagnosed: list[int] = []
    backend.hooks["diagnose"] = lambda: diagnosed.append(1)
    error, out = run_to_error(backend)
    assert error.exit_code == EXIT_JOB_FAILED == 1
    assert error.reason == DELETED_WHILE_RUNNING
    assert "TrainJob ns/" in str(error) and "was deleted while running" in str(error)
    assert f"with {finalizers[0].replace('Deletion', '')} propagation" in str(error) and "not by this step" in str(error)
    assert backend.deleted == [] and backend.writes == [("submit", backend.submitted[0]["metadata"]["name"])]
    assert diagnosed == []  # nothing is asked of a job being deleted: no pods, no log tail
    assert [line for line in out.splitlines() if not line.startswith("[kfp-trainer]") and not line.startswith("  ")] == ["a", "b", "c"]


def test_the_step_ends_even_when_the_log_of_a_deleted_job_never_ends():
    class Backend(FakeBackend):
        job_type = StubbornLogs

    backend = Backend([JobStatus(Phase.RUNNING), deleted()], FakeClock(), lines=["a"], idle=True)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(error=run_to_error(backend, log_drain_timeout=3600)[0]), daemon=True)
    thread.start()
    thread.join(60)  # the drain of a deleted job's log is bounded by launcher.DELETED_DRAIN, not log_drain_timeout
    assert not thread.is_alive() and result["error"].reason == DELETED_WHILE_RUNNING


def test_a_stop_signal_after_the_deletion_was_seen_does_not_delete_the_job():
    class SignalOnStop(FakeJob):
        def follow_logs(self, *, nodes, sink, stop):
            stop.wait(60)
            os.kill(os.getpid(), signal.SIGTERM)  # the cancel lands while the step winds down
            threading.Event().wait(0.5)  # (its handler runs in the main thread meanwhile)

    class Backend(FakeBackend):
        job_type = SignalOnStop

    backend = Backend([JobStatus(Phase.RUNNING), deleted()], FakeClock(), idle=True)
    out = io.StringIO()
    with pytest.raises(CancelledError), stopping() as stop:
        launcher = Launcher(backend, LaunchOptions(blocker_check_interval=0, log_drain_timeout=5), out=out, clock=backend.clock, stop=stop)
        launcher.run(prepare(backend, INPUTS, stop=stop))
    assert backend.deleted == []
    assert "is being deleted by someone else; left to them" in out.getvalue()
