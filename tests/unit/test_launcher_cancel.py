"""A stop signal at any point of a launch ends with the job deleted or never created (fake backend)."""

from __future__ import annotations

import io
import os
import signal

import pytest

from kfp_trainer import cancel
from kfp_trainer.backends.base import JobRef, JobStatus, Phase, RuntimeInfo, Submission
from kfp_trainer.errors import EXIT_CANCELLED, CancelledError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.spec import TrainJobInputs

INPUTS = TrainJobInputs(run_id="run-1", task_name="train", namespace="ns")


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class Backend:
    """Records what happened to the one job; hooks send signals at chosen points."""

    def __init__(self, script=(), *, on_prepare=None, on_create=None, on_diagnose=None, on_delete=None, notes=()):
        self.script = list(script)
        self.hooks = {"prepare": on_prepare, "create": on_create, "diagnose": on_diagnose, "delete": on_delete}
        self.notes = notes
        self.exists = False
        self.deleted: list[JobRef] = []
        self.reclaimed: list[str] = []
        self.delete_finished = False

    def _hook(self, name):
        if self.hooks[name]:
            self.hooks[name]()

    def default_namespace(self):
        return "ns"

    def resolve_runtime(self, inputs):
        self._hook("prepare")
        return RuntimeInfo(name=inputs.runtime, kind=inputs.runtime_kind, api_version="v2.2", replicated_jobs=(("node", 1),))

    def submit(self, manifest):
        with cancel.deferred():  # as the Kubernetes backend's create request
            self._hook("create")
            self.exists = True
        return Submission(JobRef("ns", manifest["metadata"]["name"], "uid-1"), adopted=False, notes=self.notes)

    def reclaim(self, manifest, *, wait=30.0):
        self.reclaimed.append(manifest["metadata"]["name"])
        if self.exists:
            self.exists = False
            return f"deleted TrainJob ns/{manifest['metadata']['name']}"
        return None

    def watch(self, ref):
        yield from self.script
        while True:
            yield None

    def blockers(self, ref):
        return []

    def follow_logs(self, ref, *, nodes, sink, stop):
        stop.wait(60)

    def diagnose(self, ref, *, tail=40):
        self._hook("diagnose")
        return "Pods: (none)"

    def delete(self, ref, *, wait=30.0):
        self.deleted.append(ref)
        self._hook("delete")
        self.exists = False
        self.delete_finished = True
        return "after deleting TrainJob ns/x, still present after 30s: Pod x-node-0-0-abcde (terminating)"

    def inspect_hint(self, ref):
        return "  kubectl get trainjob"


def run(backend):
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=0, logs="none"), out=out)
    with pytest.raises(CancelledError) as info:
        launcher.run(INPUTS)
    assert info.value.exit_code == EXIT_CANCELLED == 130
    return out.getvalue()


def test_a_signal_before_the_create_creates_nothing():
    backend = Backend(on_prepare=sigterm)
    run(backend)
    assert not backend.exists and backend.reclaimed == [] and backend.deleted == []


def test_a_signal_during_the_create_waits_for_it_then_deletes_what_it_made():
    backend = Backend(on_create=sigterm)
    out = run(backend)
    assert backend.reclaimed and not backend.exists
    assert "cancelled while submitting; deleted TrainJob ns/" in out


def test_a_signal_while_announcing_deletes_the_job():
    backend = Backend([JobStatus(Phase.PENDING)], notes=("replaced stale TrainJob ns/old",))
    launcher = Launcher(backend, LaunchOptions(logs="none"), out=io.StringIO(), on_submitted=lambda ref: sigterm())
    with pytest.raises(CancelledError):
        launcher.run(INPUTS)
    assert len(backend.deleted) == 1 and not backend.exists
    assert "replaced stale TrainJob ns/old" in launcher.out.getvalue()  # type: ignore[attr-defined]


def test_a_cancel_during_failure_diagnosis_exits_130_and_deletes_the_job():
    backend = Backend([JobStatus(Phase.FAILED, "FailedJobs", "node-0 exited 1")], on_diagnose=sigterm)
    out = run(backend)
    assert len(backend.deleted) == 1
    assert "CancelledError: deleting TrainJob" in out


def test_a_second_signal_during_deletion_does_not_abort_it_and_what_is_left_is_reported():
    backend = Backend([JobStatus(Phase.RUNNING)], on_create=None, on_delete=sigterm)
    backend.script.append(None)
    hits = iter(range(1000))

    def first_signal_while_following():
        if next(hits) == 0:
            sigterm()

    original = backend.watch

    def watch(ref):
        for status in original(ref):
            first_signal_while_following()
            yield status

    backend.watch = watch  # type: ignore[method-assign]
    out = run(backend)
    assert backend.delete_finished and len(backend.deleted) == 1
    assert "Pod x-node-0-0-abcde (terminating)" in out


def test_outside_the_main_thread_signals_are_left_alone():
    import threading

    seen = []
    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=lambda: seen.append((cancel.install(), cancel.installed())))
    thread.start()
    thread.join()
    assert seen == [(False, False)] and signal.getsignal(signal.SIGTERM) == before
