"""The phases a step tells, in its log and its report's timeline: they never go backwards (scripted backend)."""

from __future__ import annotations

from test_launcher_policies import INPUTS, FakeClock, ScriptedBackend, launch

from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.prepare import prepare

WAITING, RUNNING = "waiting for the trainer to start", "trainer is running"
# What a 2-node TrainJob's status reads as once both node pods have ended, before the trainer's Job
# and then the JobSet say Complete: no Job of the trainer is ready, succeeded or failed yet.
BETWEEN = {"jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}]}


def said(out: str) -> list[str]:
    return [line.removeprefix("[kfp-trainer] ") for line in out.splitlines() if line.removeprefix("[kfp-trainer] ") in (WAITING, RUNNING)]


def phases(outcome) -> list[str]:
    return [event.split(" (")[0] for _, event in outcome.timeline if event.split(" (")[0] in {p.value for p in Phase}]


def test_the_pods_ending_before_the_jobset_completes_is_not_a_return_to_pending():
    clock = FakeClock()
    script = [JobStatus(Phase.PENDING), 5, JobStatus(Phase.RUNNING), 30, JobStatus(Phase.PENDING, raw=BETWEEN), 13,
              JobStatus(Phase.PENDING, raw=BETWEEN), 1, JobStatus(Phase.SUCCEEDED, "AllJobsCompleted")]  # fmt: skip
    launcher, out = launch(ScriptedBackend(script, clock, nodes=2), clock)
    outcome = launcher.run(prepare(launcher.backend, INPUTS))
    assert outcome.succeeded and outcome.pods_per_job == {"node": 2}
    assert "completed on 2 nodes (AllJobsCompleted): queued 0s, starting 5s, running 44s" in out.getvalue()
    assert said(out.getvalue()) == [WAITING, RUNNING], out.getvalue()
    assert phases(outcome) == ["Pending", "Running", "Succeeded"], outcome.timeline
    assert outcome.times == {"queued": 0.0, "starting": 5.0, "running": 44.0}


def test_after_a_preemption_the_job_does_wait_to_start_again():
    clock = FakeClock()
    suspended = JobStatus(Phase.SUSPENDED, "Suspended", "TrainJob is suspended")
    script = [JobStatus(Phase.RUNNING), 20, suspended, 60, JobStatus(Phase.PENDING, "Resumed"), 10, JobStatus(Phase.RUNNING), 5,
              JobStatus(Phase.SUCCEEDED)]  # fmt: skip
    launcher, out = launch(ScriptedBackend(script, clock), clock)
    outcome = launcher.run(prepare(launcher.backend, INPUTS))
    assert said(out.getvalue()) == [RUNNING, WAITING, RUNNING], out.getvalue()
    assert phases(outcome) == ["Running", "Suspended", "Pending", "Running", "Succeeded"], outcome.timeline
