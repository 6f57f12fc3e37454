"""Queue time, its own limit, what the queue says, and the trainer's progress in the step's log (scripted backend)."""

from __future__ import annotations

import threading

import pytest
from test_launcher_policies import INPUTS, FakeClock, ScriptedBackend, launch

from kfp_trainer.backends.base import Blocker, LogLine
from kfp_trainer.errors import CannotStartError, TimeLimitError
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.prepare import prepare
from tests.fakes import FakeJob

QUEUED = INPUTS.model_copy(update={"queue_name": "team-q", "suspend": True})


def suspended() -> JobStatus:
    return JobStatus(Phase.SUSPENDED, "Suspended", "TrainJob is suspended")


def progress(pct: int, **metrics: str) -> JobStatus:
    status = {"progressPercentage": pct, "lastUpdatedTime": f"2026-01-01T00:00:{pct % 60:02d}Z"}
    if metrics:
        status["metrics"] = [{"name": k, "value": v} for k, v in metrics.items()]
    return JobStatus(Phase.RUNNING, raw={"trainerStatus": status})


def test_a_long_wait_in_the_queue_does_not_count_against_start_timeout():
    clock = FakeClock()
    script = [suspended()] + [10] * 50 + [JobStatus(Phase.PENDING, "Resumed"), 20, JobStatus(Phase.RUNNING), 30, JobStatus(Phase.SUCCEEDED)]
    launcher, out = launch(ScriptedBackend(script, clock), clock, start_timeout=60)
    outcome = launcher.run(prepare(launcher.backend, QUEUED))
    assert outcome.succeeded
    assert outcome.times == {"queued": 500.0, "starting": 20.0, "running": 30.0}
    assert outcome.queue == "team-q"
    text = out.getvalue()
    assert "queued in LocalQueue team-q (Suspended: TrainJob is suspended)" in text
    assert "admitted after 8m 20s in team-q" in text
    assert "queued 8m 20s, starting 20s, running 30s" in text


def test_start_timeout_still_counts_the_time_after_admission():
    clock = FakeClock()
    script = [suspended()] + [10] * 30 + [JobStatus(Phase.PENDING, "Resumed")] + [10] * 20
    backend = ScriptedBackend(script, clock)
    launcher, _ = launch(backend, clock, start_timeout=60)
    with pytest.raises(TimeLimitError, match=r"did not start within start_timeout=60s \(not counting 300s queued\)") as info:
        launcher.run(prepare(launcher.backend, QUEUED))
    assert info.value.reason == "StartTimeout" and len(backend.deleted) == 1 and 360 < clock.now <= 380


def test_queue_timeout_deletes_a_job_the_queue_never_admits():
    clock = FakeClock()
    backend = ScriptedBackend([suspended()] + [10] * 100, clock)
    launcher, _ = launch(backend, clock, queue_timeout=120, start_timeout=60)
    with pytest.raises(TimeLimitError, match="waited in queue team-q longer than queue_timeout=120s") as info:
        launcher.run(prepare(launcher.backend, QUEUED))
    assert info.value.reason == "QueueTimeout" and len(backend.deleted) == 1 and 120 < clock.now <= 130


def test_no_queue_timeout_means_waiting_as_long_as_the_queue_takes():
    clock = FakeClock()
    backend = ScriptedBackend([suspended()] + [3600] * 48 + [JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED)], clock)
    launcher, _ = launch(backend, clock, start_timeout=60)
    assert launcher.run(prepare(launcher.backend, QUEUED)).times["queued"] == 48 * 3600


def test_run_timeout_leaves_out_time_queued_again_after_a_preemption():
    clock = FakeClock()
    script = [JobStatus(Phase.RUNNING), 20, suspended(), 500, JobStatus(Phase.RUNNING)] + [5] * 10
    backend = ScriptedBackend(script, clock)
    launcher, _ = launch(backend, clock, run_timeout=40)
    with pytest.raises(TimeLimitError, match="ran longer than run_timeout=40s"):
        launcher.run(prepare(launcher.backend, INPUTS))
    assert 540 < clock.now <= 545


def test_what_the_queue_says_is_logged_once_each_while_queued():
    clock = FakeClock()
    notes = ["Pending: couldn't assign flavors to pod set node: insufficient quota for cpu", "QuotaReserved: Quota reserved"]
    script = [suspended()] + [5] * 6 + [JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED)]
    launcher, out = launch(ScriptedBackend(script, clock, queue=notes), clock)
    launcher.run(prepare(launcher.backend, QUEUED))
    text = out.getvalue()
    assert text.count("queue team-q: Pending: couldn't assign flavors to pod set node: insufficient quota for cpu") == 1
    assert text.count("queue team-q: QuotaReserved") == 1


def test_a_job_that_can_never_start_fails_fast_even_while_queued():
    clock = FakeClock()
    blocker = Blocker("TrainJobResourcesCreationFailed", "jobsets.jobset.x-k8s.io is forbidden: exceeded quota", fatal=True)
    backend = ScriptedBackend([suspended()] + [5] * 20, clock, blockers=[blocker])
    launcher, _ = launch(backend, clock, fatal_blocker_grace=10)
    with pytest.raises(CannotStartError, match="exceeded quota"):
        launcher.run(prepare(launcher.backend, QUEUED))
    assert len(backend.deleted) == 1 and clock.now <= 20


def test_progress_gets_a_line_when_it_moves_not_for_every_report():
    clock = FakeClock()
    reports = [progress(p, loss=str(3 - p / 50)) for p in range(0, 101, 1)]
    launcher, out = launch(ScriptedBackend([JobStatus(Phase.RUNNING), *reports, JobStatus(Phase.SUCCEEDED)], clock), clock)
    outcome = launcher.run(prepare(launcher.backend, INPUTS))
    lines = [line for line in out.getvalue().splitlines() if "] progress " in line]
    assert [line.split("progress ")[1].split("%")[0] for line in lines] == [str(p) for p in range(0, 101, 5)]
    assert "progress 100% (loss=1.0)" in lines[-1]
    assert len(outcome.progress) == 101 and outcome.progress[-1]["percent"] == 100
    assert outcome.metrics.final()["loss"] == 1.0  # the last trainerStatus metrics count as metrics too


def test_metrics_alone_get_a_line_at_most_once_a_minute():
    clock = FakeClock()
    script = [JobStatus(Phase.RUNNING)]
    for i in range(30):
        script += [progress(50, loss=str(i)), 10]
    launcher, out = launch(ScriptedBackend(script + [JobStatus(Phase.SUCCEEDED)], clock), clock)
    launcher.run(prepare(launcher.backend, INPUTS))
    assert sum("] progress 50%" in line for line in out.getvalue().splitlines()) == 5  # 300 s of reports: t=0, 60, ..., 240


def test_a_multikueue_job_is_followed_by_its_status_without_logs_or_pods():
    clock = FakeClock()
    inputs = INPUTS.model_copy(update={"queue_name": "team-q", "managed_by": "kueue.x-k8s.io/multikueue"})
    backend = ScriptedBackend([JobStatus(Phase.PENDING)] + [5] * 30 + [JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED)], clock,
                              blockers=[Blocker("Unschedulable", "no such pods here")], lines=["must not be read"])  # fmt: skip
    launcher, out = launch(backend, clock, blocker_grace=10)
    assert launcher.run(prepare(launcher.backend, inputs)).succeeded
    assert "must not be read" not in out.getvalue() and "its pods and logs are there" in out.getvalue()


def test_a_preempted_job_waits_to_be_readmitted_its_suspension_counted_apart_and_reported():
    clock = FakeClock()
    note = "Preempted: preempted by TrainJob ns/urgent in ClusterQueue team-cq (prioritization in the ClusterQueue)"
    script = [JobStatus(Phase.RUNNING), 20, suspended()] + [5] * 12 + [JobStatus(Phase.PENDING), JobStatus(Phase.RUNNING), 30]
    launcher, out = launch(ScriptedBackend(script + [JobStatus(Phase.SUCCEEDED)], clock, queue=[note]), clock, run_timeout=55)
    outcome = launcher.run(prepare(launcher.backend, QUEUED))  # 50 s running in all: under run_timeout, the 60 s suspended left out
    assert outcome.succeeded and outcome.preemptions == 1
    assert outcome.times == {"queued": 0.0, "starting": 0.0, "running": 50.0, "preempted": 60.0}
    text = out.getvalue()
    assert "TrainJob was suspended after 20s running (Suspended: TrainJob is suspended): preempted or evicted by Kueue" in text
    assert "waiting to be re-admitted to LocalQueue team-q" in text and f"queue team-q: {note}" in text
    assert "re-admitted after 1m 0s suspended in team-q" in text and "preempted 1x: 1m 0s suspended" in text
    events = [e for _, e in outcome.timeline]
    assert "suspended while running: preempted or evicted by Kueue" in events and "re-admitted after 1m 0s suspended" in events


def test_queue_timeout_bounds_the_wait_for_readmission_too():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.RUNNING), 20, suspended()] + [10] * 30, clock)
    launcher, _ = launch(backend, clock, queue_timeout=120)
    with pytest.raises(TimeLimitError, match="waited in queue team-q longer than queue_timeout=120s"):
        launcher.run(prepare(launcher.backend, QUEUED))
    assert len(backend.deleted) == 1 and 140 < clock.now <= 150


class PrintsBeforeReadyJob(FakeJob):
    """The trainer prints while its pod is not Ready yet (the job still Pending), then Kueue preempts it."""

    def follow_logs(self, *, nodes, sink, stop):
        self.backend.go.wait(10)
        for line in self.lines:
            sink(LogLine("node-0", line))
        self.backend.printed.set()
        stop.wait(60)

    def watch(self):
        for i, item in enumerate(super().watch()):
            if i == 1:  # the trainer prints after the job's first status; the suspension comes right after the line
                self.backend.go.set()
                assert self.backend.printed.wait(10)
            yield item


class PrintsBeforeReady(ScriptedBackend):
    """A backend whose job is a :class:`PrintsBeforeReadyJob`."""

    job_type = PrintsBeforeReadyJob

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.go, self.printed = threading.Event(), threading.Event()


def test_a_job_preempted_before_its_pod_turned_ready_but_after_its_trainer_printed_is_preempted_not_queued():
    clock = FakeClock()
    script = [JobStatus(Phase.PENDING), suspended(), 30, JobStatus(Phase.PENDING), 5, JobStatus(Phase.SUCCEEDED)]
    launcher, out = launch(PrintsBeforeReady(script, clock, lines=["epoch 1 loss=0.9"]), clock)
    outcome = launcher.run(prepare(launcher.backend, QUEUED))
    assert outcome.preemptions == 1 and outcome.times["preempted"] == 30.0
    assert "waiting to be re-admitted to LocalQueue team-q" in out.getvalue()
