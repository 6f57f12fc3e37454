"""One prepared TrainJob's life (:mod:`kfp_trainer.prepare` makes it): submit/adopt -> follow -> outcome.

The launcher is the same for every backend. It owns the policies a pipeline step needs:

* three time limits (:mod:`kfp_trainer.timing`): ``queue_timeout`` (suspended in a queue),
  ``start_timeout`` (creation or admission until a trainer runs: scheduling, image pulls;
  time queued left out) and ``run_timeout`` (from then on); on any it deletes the TrainJob;
  the step's log says which queue the job waits in and why, and the outcome keeps the
  seconds queued, starting and running;
* the trainer's progress (``status.trainerStatus``) as a log line when it moves
  (:mod:`kfp_trainer.trainer_status`);
* "cannot start" detection: a blocker the backend reports (``TrainJobResourcesCreationFailed``,
  an unschedulable pod, an image that cannot be pulled) that lasts longer than its grace;
* SIGTERM/SIGINT (a KFP cancel) ends with the TrainJob deleted or never created: the entry
  point's stop token (:mod:`kfp_trainer.cancel`), handed to the launcher, is looked at where
  the launcher waits (each status or heartbeat, before and after the create request), so a
  signal during the create waits for its answer, then deletes what it made, and nothing
  interrupts a deletion; it exits with :class:`~kfp_trainer.errors.CancelledError`. Once the
  job exists, a thread of its own sends the deletion the moment the stop is requested, whatever
  the flow is doing then, and the flow says so only after it went out: a KFP pod is gone within
  a second of the signal (milliseconds, at times), and the step's output may have no reader any more. A launcher given no
  token makes its own for the run (:func:`~kfp_trainer.cancel.stopping`): the Python API cancels
  the same way as the entry points;
* deleting waits, bounded, until the job's JobSet, Jobs and pods are gone, and says what is
  left and how to remove it;
* a TrainJob deleted by someone else (gone, or ``deletionTimestamp`` set) ends the step at once,
  failed (``DeletedWhileRunning``): no line relayed twice, nothing deleted or patched
  (:mod:`kfp_trainer.backends.deletion`);
* the trainer's log streamed to stdout in a thread, each line fed to the metric parser;
* on failure a :class:`~kfp_trainer.errors.JobFailedError` carrying the reason, the failed
  pods, recent events and the log tail.

Example:
    >>> from kfp_trainer.backends.kubernetes import KubernetesBackend  # doctest: +SKIP
    >>> backend = KubernetesBackend.from_config()  # doctest: +SKIP
    >>> with stopping() as stop:  # doctest: +SKIP
    ...     job = prepare(backend, TrainJobInputs(runtime="torch-distributed", run_id="r1", task_name="train"), stop=stop)
    ...     outcome = Launcher(backend, stop=stop).run(job)
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import spec
from .backends.base import Backend, Blocker, JobHandle, Submission
from .backends.deletion import RETRY
from .cancel import Stop, stopping
from .errors import CancelledError, CannotStartError, InfraError, JobFailedError, TimeLimitError
from .jobstatus import JobRef, JobStatus, Phase, following
from .kube_types import TrainJobStatus
from .metrics import MetricSeries, from_trainer_status
from .prepare import PreparedJob
from .relay import Printer
from .timing import PREEMPTED, PhaseTimes, duration
from .trainer_status import ProgressLog

log = logging.getLogger(__name__)
DELETED_DRAIN = 2.0  # seconds for the log of a job deleted by someone else: the rest from each cursor, at once


@dataclass(frozen=True)
class LaunchOptions:
    """Launcher policies. Times are in seconds; 0 means no limit."""

    start_timeout: float = 3600.0  # creation until the trainer runs, time queued (suspended) left out
    run_timeout: float = 0.0
    queue_timeout: float = 0.0  # time suspended in the queue, in all
    blocker_grace: float = 300.0  # how long an unschedulable / image-pull problem may last
    fatal_blocker_grace: float = 10.0  # how long "resources / pods cannot be created" may last
    blocker_check_interval: float = 2.0  # the first check comes this long after submitting
    logs: str = "0"  # trainer node index, "all", or "none"
    delete_after_success: bool = False
    log_drain_timeout: float = 30.0
    delete_timeout: float = 30.0  # how long to wait for a deleted job's JobSet, Jobs and pods to go
    metric_names: str = ""  # the metrics to keep (kfp_trainer.metrics.MetricFilter): names, re:REGEX; "" every one

    def __post_init__(self) -> None:
        from .spec import check_launch_options

        check_launch_options(metric_names=self.metric_names)  # a bad pattern fails here, before anything is created


@dataclass
class Outcome:
    """What happened to one TrainJob: the component turns this into its outputs."""

    ref: JobRef
    manifest: dict[str, Any]
    phase: Phase
    reason: str = ""
    message: str = ""
    adopted: bool = False
    replaced: bool = False
    runtime: str = ""
    api_version: str = ""
    metrics: MetricSeries = field(default_factory=MetricSeries)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (unix time, event)
    status: TrainJobStatus = field(default_factory=lambda: TrainJobStatus())
    log_lines: int = 0
    times: dict[str, float] = field(default_factory=dict)  # seconds queued, starting, running (:mod:`kfp_trainer.timing`)
    queue: str = ""  # the Kueue LocalQueue the job was submitted to
    preemptions: int = 0  # times it was suspended again after it ran (Kueue preempted or evicted it)
    progress: list[dict[str, Any]] = field(default_factory=list)  # trainerStatus history (:mod:`kfp_trainer.trainer_status`)
    # Pods in each Job of each replicated job ({"node": 2}): JobSet's status counts Jobs, a user counts nodes.
    pods_per_job: dict[str, int] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        """True when the TrainJob completed."""
        return self.phase is Phase.SUCCEEDED


def _on_nodes(pods_per_job: dict[str, int]) -> str:
    """`` on 2 nodes``: how many nodes the trainer ran on (JobSet's status says 1 Job), or "" when not known."""
    nodes = pods_per_job.get("node")
    return f" on {nodes} node{'s' if nodes != 1 else ''}" if nodes else ""


@dataclass
class _Follow:
    """What following one job keeps track of between two statuses."""

    begin: float
    queue: str  # the Kueue LocalQueue, or ""
    remote: bool  # MultiKueue: pods and logs are on a worker cluster
    times: PhaseTimes
    progress: ProgressLog = field(default_factory=ProgressLog)
    started_at: list[float] = field(default_factory=list)  # when the trainer was first seen running (once)
    blockers: dict[str, float] = field(default_factory=dict)  # reason -> first seen
    last_check: float = 0.0  # of the blockers: a job that starts within the interval costs no blocker watches
    last_phase: Phase | None = None

    @classmethod
    def of(cls, outcome: Outcome, now: float) -> _Follow:
        """The state at the start of following ``outcome``'s job."""
        manifest = outcome.manifest
        return cls(
            begin=now,
            queue=str(spec.dig(manifest, "metadata", "labels", spec.QUEUE_LABEL) or ""),
            remote=spec.dig(manifest, "spec", "managedBy") == spec.MULTIKUEUE,
            times=PhaseTimes.at(now),
            last_check=now,
        )


class EarlyDelete:
    """Sends a job's deletion the moment a stop is requested, from a thread of its own.

    The flow acts on a stop at its next look at the token (a heartbeat, or once a request in
    flight returns); a KFP pod is gone within a second of the signal, at times milliseconds after
    it (the container's first process notices KFP's launcher's end within a second, exits, and
    takes every other one with it). So the deletion
    request does not wait for the flow: this thread sends it at once
    (:meth:`~kfp_trainer.backends.base.JobHandle.request_delete`: background propagation, no
    finalizer to wait for, so the cluster removes the rest even if the step is killed right
    after), and the flow's own deletion then waits for it to take effect. :meth:`send` sends
    it from the flow when the thread has not (a time limit), once in all.
    """

    def __init__(self, handle: JobHandle, stop: Stop) -> None:
        self.handle = handle
        self.stop = stop
        self.sent = False
        self._lock = threading.Lock()
        self._closed = False
        self._wake = threading.Event()
        self._registration = stop.waking(self._wake)
        self._registration.__enter__()
        self._thread = threading.Thread(target=self._wait, name="early-delete", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        self._wake.wait()
        if not self._closed:
            self.send()

    def send(self) -> None:
        """Send the deletion unless it went out already (waits for one being sent by the thread)."""
        with self._lock:
            if self.sent:
                return
            self.sent = True
            try:
                self.handle.request_delete()
            except Exception as e:  # the flow's own deletion tries again, and reports
                log.info("early deletion of TrainJob %s failed: %s", self.handle.ref, e)

    def close(self) -> None:
        """The flow is done with the job: the thread ends without sending anything more."""
        self._closed = True
        self._registration.__exit__(None, None, None)
        self._wake.set()
        self._thread.join(1.0)  # it ends at once (a deletion it sent had returned before the flow's own)


def _close(statuses: Iterator[JobStatus | None]) -> None:
    close = getattr(statuses, "close", None)  # a generator's; a plain iterator has none
    if close is not None:
        close()


class Launcher:
    """Runs one TrainJob to its end on a backend. See the module docstring."""

    def __init__(
        self,
        backend: Backend,
        options: LaunchOptions = LaunchOptions(),
        *,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_submitted: Callable[[JobRef], None] | None = None,
        stop: Stop | None = None,
    ) -> None:
        self.backend = backend
        self.options = options
        self._out = out
        self.clock = clock
        self.on_submitted = on_submitted
        self._own_stop = stop is None  # no token given: run() makes one, as the entry points do
        self.stop = stop if stop is not None else Stop()

    @property
    def out(self) -> TextIO:
        """Where the step's log goes: ``out``, else ``sys.stdout`` as it is when written to (guarded while running)."""
        return self._out or sys.stdout

    def say(self, message: str) -> None:
        """A launcher message in the step's log."""
        self.out.write(f"[kfp-trainer] {message}\n")
        self.out.flush()

    def run(self, job: PreparedJob) -> Outcome:
        """Run the TrainJob ``job`` (:func:`kfp_trainer.prepare.prepare`'s) to its end.

        A stop request on the launcher's token (``stop``) before the create leaves nothing
        created; after it, what was created is deleted.

        Raises:
            UserError: Invalid inputs, missing runtime, forbidden, ownership conflict.
            JobFailedError: The job failed, could not start, or ran past a time limit.
            CancelledError: SIGTERM/SIGINT; the job was deleted (or never created).
            InfraError: The cluster stayed unreachable; the job was left to a retry.
        """
        if not self._own_stop:
            return self._run(job)
        with stopping() as self.stop:  # the Python API: a stop signal from here on deletes the job, as at the entry points
            return self._run(job)

    def _run(self, job: PreparedJob) -> Outcome:
        self.stop.check()  # a stop signal while preparing: nothing was created
        submission = self._submit(job)
        handle = submission.job
        outcome: Outcome | None = None
        early = EarlyDelete(handle, self.stop)
        try:
            self.stop.check()  # a stop signal while submit returned: the job is known, and deleted below
            outcome = Outcome(
                ref=submission.ref,
                manifest=job.manifest,
                phase=Phase.PENDING,
                adopted=submission.adopted,
                replaced=submission.replaced,
                runtime=job.runtime_name,
                api_version=job.api_version,
                pods_per_job=dict(job.runtime.replicated_jobs),
                metrics=MetricSeries(keep=self.options.metric_names),
            )
            self._announce(submission, handle, outcome)
            self._follow(outcome, handle)
        except (CancelledError, TimeLimitError, CannotStartError) as e:
            if outcome is not None and outcome.phase is Phase.DELETED:  # someone else is deleting it: theirs to finish
                self.say(f"{type(e).__name__}: TrainJob {submission.ref} is being deleted by someone else; left to them")
                raise
            early.send()  # the deletion goes out before anything is said: the output may have no reader any more
            self.say(f"{type(e).__name__}: deleting TrainJob {submission.ref}")
            self._delete(handle)
            raise
        except InfraError:
            self.say(f"lost the API server; TrainJob {submission.ref} is left running for a retry to adopt")
            raise
        finally:
            early.close()
            handle.release()
        if self.options.delete_after_success:
            self._delete(handle)
        return outcome

    def _submit(self, job: PreparedJob) -> Submission:
        manifest = job.manifest
        try:
            return self.backend.submit(manifest, runtime=job.runtime, stop=self.stop)
        except CancelledError:
            # The create request may have reached the server: find the job by name and lineage, delete it.
            try:
                done = self.backend.reclaim(manifest, wait=self.options.delete_timeout)
            except Exception as e:  # report, but do not hide the cancel
                done = f"could not check whether TrainJob {manifest['metadata']['name']} was created: {e}"
            self.say(f"cancelled while submitting; {done or 'no TrainJob was created'}")
            raise

    def _announce(self, submission: Submission, handle: JobHandle, outcome: Outcome) -> None:
        now = time.time()
        verb = "adopted existing" if submission.adopted else ("replaced failed" if submission.replaced else "created")
        outcome.timeline.append((now, f"TrainJob {verb}"))
        for note in submission.notes:
            self.say(note)
        self.say(f"{verb} TrainJob {submission.ref} (runtime {outcome.runtime}, Trainer API {outcome.api_version})")
        self.say("inspect it with:\n" + handle.inspect_hint())
        if self.on_submitted:
            self.on_submitted(submission.ref)

    def _delete(self, handle: JobHandle) -> None:
        # Nothing on a deletion's way looks for stop signals: a second SIGTERM cannot abort it.
        try:
            left = handle.delete(wait=self.options.delete_timeout)
        except Exception as e:  # report, but do not hide the original error
            self.say(f"could not delete TrainJob {handle.ref}: {e}")
            return
        if left:
            self.say(str(left))

    def _follow(self, outcome: Outcome, handle: JobHandle) -> None:
        """Follow the job to its end: statuses, time limits, blockers, the trainer's log."""
        follow = _Follow.of(outcome, self.clock())
        if follow.remote:
            self.say(f"{spec.MULTIKUEUE} runs this TrainJob on a worker cluster: its status is mirrored here, its pods and logs are there")
        stop = threading.Event()
        printer = Printer(self.out, outcome.metrics, self.options.logs == "all", lambda: self._mark_started(outcome, follow))
        statuses = handle.watch()
        logs_thread: threading.Thread | None = None
        drain = min(1.0, self.options.log_drain_timeout)  # a failure on the way: the log is cut short
        try:
            logs_thread = self._start_logs(handle, follow, printer, stop)  # inside: a cancel right after stops it below
            for status in statuses:
                self.stop.check()  # at each status and heartbeat
                now = self.clock()
                if follow.started_at and not follow.times.started:  # the trainer printed before its pod turned ready
                    follow.times.observe(Phase.RUNNING, follow.started_at[0])
                if status is not None and self._observe(outcome, follow, status, now):
                    break
                self._check_limits(handle, follow, now)
            drain = min(DELETED_DRAIN, drain) if outcome.phase is Phase.DELETED else self.options.log_drain_timeout
        finally:
            _close(statuses)
            self._stop_logs(logs_thread, stop, drain)
            printer.close()
            outcome.log_lines = printer.count
            outcome.times, outcome.queue, outcome.progress = follow.times.totals(self.clock()), follow.queue, list(follow.progress.history)
            outcome.preemptions = follow.times.preemptions
        self.stop.check()  # a stop signal while the log drained: the job is deleted like any other
        self._conclude(outcome, follow, handle)

    def _mark_started(self, outcome: Outcome, follow: _Follow) -> None:
        if not follow.started_at:
            follow.started_at.append(self.clock())
            outcome.timeline.append((time.time(), "trainer started"))

    def _start_logs(self, handle: JobHandle, follow: _Follow, printer: Printer, stop: threading.Event) -> threading.Thread | None:
        if self.options.logs == "none" or follow.remote:
            return None
        thread = threading.Thread(
            target=handle.follow_logs,
            kwargs={"nodes": self.options.logs, "sink": printer, "stop": stop},
            name="trainer-logs",
            daemon=True,
        )
        thread.start()
        return thread

    def _stop_logs(self, thread: threading.Thread | None, stop: threading.Event, drain: float) -> None:
        if thread is None or thread.ident is None:
            return
        stop.set()  # followers read what is left and return
        self.stop.join(thread, drain)  # a stop signal cuts the drain short

    def _observe(self, outcome: Outcome, follow: _Follow, status: JobStatus, now: float) -> bool:
        """Take in one status; True when the job has finished."""
        status = following(follow.last_phase, status)
        outcome.status = status.raw
        line = follow.progress.observe(status.raw, now - follow.begin)
        if line:
            self.say(line)
        if status.phase is not follow.last_phase:
            follow.last_phase = status.phase
            outcome.timeline.append((time.time(), status.phase.value + (f" ({status.reason})" if status.reason else "")))
            note = self._on_phase(status, follow.times, now, follow.queue)
            if note:
                outcome.timeline.append((time.time(), note))
        if status.phase is Phase.RUNNING:
            self._mark_started(outcome, follow)
        if status.phase.finished:
            outcome.phase, outcome.reason, outcome.message = status.phase, status.reason, status.message
            return True
        return False

    def _check_limits(self, handle: JobHandle, follow: _Follow, now: float) -> None:
        """Raise when a time limit passed or a blocker outlasted its grace."""
        options, times = self.options, follow.times
        limit = times.exceeded(now, start_timeout=options.start_timeout, queue_timeout=options.queue_timeout,
                               run_timeout=options.run_timeout, queue=follow.queue)  # fmt: skip
        if limit:
            diagnosis = self._diagnose(handle, {} if times.started else follow.blockers)
            raise TimeLimitError(f"TrainJob {handle.ref} {limit[1]}", reason=limit[0], diagnosis=diagnosis)
        waiting = times.state in ("queued", PREEMPTED)
        if now - follow.last_check >= options.blocker_check_interval and not follow.remote:
            follow.last_check = now
            self._notes(handle.pod_notes)
            if waiting:
                self._queue_notes(handle, follow.queue)
            if not times.started:
                self._check_blockers(handle, follow.blockers, now)  # queued too: e.g. its JobSet cannot be made

    def _conclude(self, outcome: Outcome, follow: _Follow, handle: JobHandle) -> None:
        """Say how the job ended; raise :class:`JobFailedError` unless it succeeded."""
        outcome.metrics.extend(from_trainer_status(outcome.status if "trainerStatus" in outcome.status else follow.progress.status()))
        if outcome.phase is Phase.SUCCEEDED:
            spent = outcome.times
            self.say(
                f"TrainJob {outcome.ref} completed{_on_nodes(outcome.pods_per_job)} ({outcome.reason or 'Complete'}): "
                f"queued {duration(spent['queued'])}, starting {duration(spent['starting'])}, running {duration(spent['running'])}"
                + (f", preempted {outcome.preemptions}x: {duration(spent[PREEMPTED])} suspended" if PREEMPTED in spent else "")
            )
            return
        deleted = outcome.phase is Phase.DELETED  # by someone else: nothing is asked of it, its pods go or are re-made
        what = f"failed: {outcome.reason or 'no reason given'}: {outcome.message}".rstrip(": ")
        if deleted:
            what = f"was deleted while running: {outcome.message or outcome.reason}; {RETRY}"
        raise JobFailedError(
            f"TrainJob {outcome.ref} {what}",
            reason=outcome.reason,
            diagnosis="Inspect with:\n" + handle.inspect_hint() if deleted else self._diagnose(handle, {}),
        )

    def _on_phase(self, status: JobStatus, times: PhaseTimes, now: float, queue: str) -> str:
        """Say what the phase change means for the wait; returns the queue's part of the timeline ("" if none)."""
        was, stretch = times.state, max(0.0, now - times.since)  # how long it has been in its current state
        times.observe(status.phase, now)
        if status.phase is Phase.SUSPENDED:
            why = f"{status.reason}: {status.message}".strip(": ")
            limit = f"queue_timeout {self.options.queue_timeout:.0f}s" if self.options.queue_timeout else "no queue_timeout"
            if times.state == PREEMPTED:
                by = "preempted or evicted by Kueue" if queue else "suspended"
                self.say(
                    f"TrainJob was suspended after {duration(times.totals(now)['running'])} running ({why}): {by}; "
                    f"waiting to be re-admitted{' to LocalQueue ' + queue if queue else ''} ({limit}; "
                    "the time suspended does not count as running time)"
                )
                return f"suspended while running: {by}"
            where = f"queued in LocalQueue {queue}" if queue else "suspended"
            self.say(f"TrainJob is {where} ({why}); waiting for {'Kueue' if queue else 'something'} to admit it ({limit})")
            return where
        note = ""
        if was == PREEMPTED:
            note = f"{'re-admitted' if queue else 'resumed'} after {duration(stretch)} suspended"
            self.say(f"{note}{' in ' + queue if queue else ''}: the trainer starts again (from its last checkpoint, if it saves them)")
        elif was == "queued":
            note = f"{'admitted' if queue else 'resumed'} after {duration(stretch)} {'in ' + queue if queue else 'suspended'}"
            self.say(note)
        if status.phase is Phase.RUNNING:
            self.say("trainer is running")
        elif status.phase is Phase.PENDING:
            self.say("waiting for the trainer to start")
        return note

    def _queue_notes(self, handle: JobHandle, queue: str) -> None:  # what the queue says (Kueue's Workload events), each once
        self._notes(handle.queue_notes, f"queue {queue or '?'}: ")

    def _notes(self, notes: Callable[[], list[str]], prefix: str = "") -> None:
        """Say each of ``notes()`` (what the queue or the pods tell)."""
        try:
            for note in notes():
                self.say(prefix + note)
        except CancelledError:
            raise
        except Exception as e:  # notes are a courtesy: never fail the step for them
            log.debug("notes unavailable: %s", e)

    def _check_blockers(self, handle: JobHandle, seen: dict[str, float], now: float) -> None:
        current = handle.blockers()
        reasons = {b.reason for b in current}
        for reason in list(seen):
            if reason not in reasons:
                del seen[reason]
        for blocker in current:
            first = seen.setdefault(blocker.reason, now)
            if first == now:
                self.say(f"not starting yet: {blocker}")
            grace = self.options.fatal_blocker_grace if blocker.fatal else self.options.blocker_grace
            if now - first >= grace:
                raise CannotStartError(
                    f"TrainJob {handle.ref} cannot start: {blocker} (for {now - first:.0f}s)",
                    reason=blocker.reason,
                    diagnosis=self._diagnose(handle, seen, current),
                )

    def _diagnose(self, handle: JobHandle, seen: dict[str, float], blockers: list[Blocker] | None = None) -> str:
        try:
            report = handle.diagnose()
        except CancelledError:  # a cancel while diagnosing is a cancel: the job gets deleted
            raise
        except Exception as e:  # the diagnosis must not hide the failure itself
            report = f"(diagnosis unavailable: {e})"
        self.stop.check()  # diagnosing takes requests: a stop signal meanwhile wins over the failure
        if blockers:
            report = "Blockers:\n" + "\n".join(f"  {b}" for b in blockers) + ("\n\n" + report if report else "")
        return report + "\n\nInspect with:\n" + handle.inspect_hint()
