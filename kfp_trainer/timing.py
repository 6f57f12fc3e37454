"""Where a TrainJob's time goes -- queued, starting, running, preempted -- and which limit it passed.

Pure.
A job is **queued** while it is suspended before its trainer first ran (a Kueue queue holds
it), **starting** from creation or admission until a trainer runs (scheduling, image pulls,
initializers), **running** from then on, and **preempted** while it is suspended again after
it ran (Kueue preempted or evicted it: its pods are gone until it is re-admitted). Each limit
applies to its own stretch, so a long wait in a busy queue never counts against
``start_timeout``, nor a preemption against ``run_timeout``:

* ``queue_timeout`` -- seconds waiting for Kueue, in all: queued and preempted;
* ``start_timeout`` -- seconds starting before the trainer first ran, queued time left out;
* ``run_timeout`` -- seconds running, time preempted left out.

``preempted`` appears in :meth:`PhaseTimes.totals` only for a job that was preempted.

Example:
    >>> times = PhaseTimes.at(0.0)
    >>> times.observe(Phase.SUSPENDED, 0.0); times.observe(Phase.PENDING, 500.0); times.observe(Phase.RUNNING, 530.0)
    'queued'
    'starting'
    'running'
    >>> times.totals(600.0)
    {'queued': 500.0, 'starting': 30.0, 'running': 70.0}
    >>> times.exceeded(600.0, start_timeout=60, queue_timeout=0, run_timeout=0) is None
    True
    >>> times.observe(Phase.SUSPENDED, 600.0), times.observe(Phase.RUNNING, 660.0), times.preemptions
    ('preempted', 'running', 1)
    >>> times.totals(700.0)
    {'queued': 500.0, 'starting': 30.0, 'running': 110.0, 'preempted': 60.0}
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobstatus import Phase

STATES = ("queued", "starting", "running")
PREEMPTED = "preempted"  # a fourth state, only once a job was preempted


@dataclass
class PhaseTimes:
    """Seconds spent in each state so far (the current stretch is added by :meth:`totals`)."""

    since: float  # when the current stretch began (the launcher's monotonic clock)
    state: str = "starting"
    started: bool = False  # the trainer has run at least once
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATES, 0.0))
    preemptions: int = 0  # times it was suspended again after it ran

    @classmethod
    def at(cls, now: float) -> PhaseTimes:
        """Times of a job followed from ``now`` (created or adopted: starting)."""
        return cls(since=now)

    def observe(self, phase: Phase, now: float) -> str | None:
        """Close the current stretch at ``now`` and enter ``phase``'s state; the new state when it changed."""
        if phase is Phase.SUSPENDED:
            state = PREEMPTED if self.started else "queued"
        elif phase is Phase.RUNNING or (phase is Phase.PENDING and self.started):
            state = "running"
        elif phase is Phase.PENDING:
            state = "starting"
        else:
            return None  # finished: the last stretch counts until totals() is asked
        now = max(now, self.since)
        self.spent[self.state] += now - self.since
        self.since = now
        if state == PREEMPTED and self.state != PREEMPTED:
            self.preemptions += 1
            self.spent.setdefault(PREEMPTED, 0.0)
        self.started = self.started or state == "running"
        changed, self.state = state != self.state, state
        return state if changed else None

    def totals(self, now: float) -> dict[str, float]:
        """Seconds queued, starting and running until ``now``."""
        out = dict(self.spent)
        out[self.state] += max(0.0, now - self.since)
        return {k: round(v, 3) for k, v in out.items()}

    def exceeded(
        self, now: float, *, start_timeout: float, queue_timeout: float, run_timeout: float, queue: str = ""
    ) -> tuple[str, str] | None:
        """``(reason, what happened)`` for the first limit passed at ``now``, else None. 0 means no limit."""
        spent = self.totals(now)
        if queue_timeout and spent["queued"] + spent.get(PREEMPTED, 0.0) > queue_timeout:
            where = f"in queue {queue}" if queue else "suspended"
            return "QueueTimeout", f"waited {where} longer than queue_timeout={queue_timeout:.0f}s"
        if start_timeout and not self.started and spent["starting"] > start_timeout:
            queued = f" (not counting {spent['queued']:.0f}s queued)" if spent["queued"] >= 1 else ""
            return "StartTimeout", f"did not start within start_timeout={start_timeout:.0f}s{queued}"
        if run_timeout and self.started and spent["running"] > run_timeout:
            return "RunTimeout", f"ran longer than run_timeout={run_timeout:.0f}s"
        return None


def duration(seconds: float, *, compact: bool = False) -> str:
    """``3725`` -> ``1h 2m 5s``; ``compact`` (a table's age): the two largest units from days, no spaces.

    Example:
        >>> duration(3725), duration(59.6), duration(0)
        ('1h 2m 5s', '1m 0s', '0s')
        >>> duration(93784, compact=True), duration(3725, compact=True), duration(86400, compact=True)
        ('1d2h', '1h2m', '1d')
    """
    if compact:
        whole = max(0, int(seconds))
        for unit, size, smaller, small_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
            if whole >= size:
                rest = (whole % size) // small_size
                return f"{whole // size}{unit}" + (f"{rest}{smaller}" if rest else "")
        return f"{whole}s"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"
