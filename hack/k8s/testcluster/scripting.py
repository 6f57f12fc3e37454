"""What a test scripts on a pod of the test cluster: the annotation contract.

A pod on a KWOK node runs no program. What its containers print, how long they take,
how they exit and how often they crash is written on the pod as annotations with the
prefix ``script.kfp-trainer.test/``; the cluster's KWOK stages (``stages/pod.yaml``)
and its pod scripting process (``hack/k8s/podscript.py``) act it out. Put the
annotations on the pod template: through a TrainJob's pod template patch (the
launcher's ``pod_annotations`` input), a runtime's template, or any Job's template.

    >>> PodScript(lines=["step 1", "done"], exit_code=3).annotations()["script.kfp-trainer.test/exit-code"]
    '3'

Unscripted pods print nothing, start at once and exit 0 (restartPolicy Never or
OnFailure; with Always they run until deleted).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

PREFIX = "script.kfp-trainer.test/"
LOG = PREFIX + "log"
LINE_DELAY = PREFIX + "line-delay"
START_DELAY = PREFIX + "start-delay"
EXIT_DELAY = PREFIX + "exit-delay"
EXIT_CODE = PREFIX + "exit-code"
CRASHES = PREFIX + "crashes"
CRASH_AFTER = PREFIX + "crash-after"
CRASH_EXIT_CODE = PREFIX + "crash-exit-code"
CRASH_BACKOFF = PREFIX + "crash-backoff"
NOT_READY = PREFIX + "not-ready"
FAILING_ATTEMPTS = PREFIX + "failing-attempts"
# Written by the pod scripting process, read by the KWOK stages.
LOG_READY = PREFIX + "log-ready"
LOG_DONE = PREFIX + "log-done"

NEVER = "never"
ALWAYS = "always"
DEFAULT_LINE_DELAY = 0.05


@dataclasses.dataclass(frozen=True)
class PodScript:
    """The behaviour of every pod that carries these annotations.

    Attributes:
        lines: what the pod's first container prints, one line each ``line_delay``
            seconds; every container instance prints them from the start.
        line_delay: seconds between two lines.
        start_delay: seconds a bound pod stays Pending (ContainerCreating) before its
            containers run; None: at once; ``float("inf")``: never.
        exit_delay: seconds the last instance keeps running after its last line;
            ``float("inf")``: it runs until the pod is deleted.
        exit_code: exit code of the last instance (0: Succeeded; otherwise Failed with
            restartPolicy Never, or restarted by the "kubelet" with OnFailure/Always).
        crashes: how many instances crash (exit ``crash_exit_code``) before the last one;
            -1: every instance crashes.
        crash_after: lines instance *i* prints before it crashes (default: all lines).
        crash_exit_code: exit code of a crash.
        crash_backoff: seconds in CrashLoopBackOff between a crash and the next instance.
        not_ready: the containers run but never turn Ready.
        failing_attempts: ``exit_code`` applies only to pods of the first
            ``failing_attempts`` JobSet attempts (label ``jobset.sigs.k8s.io/restart-attempt``);
            pods of later attempts (after a JobSet restart) exit 0.
    """

    lines: Sequence[str] = ()
    line_delay: float = DEFAULT_LINE_DELAY
    start_delay: float | None = None
    exit_delay: float | None = None
    exit_code: int = 0
    crashes: int = 0
    crash_after: Sequence[int] | None = None
    crash_exit_code: int = 1
    crash_backoff: float | None = None
    not_ready: bool = False
    failing_attempts: int | None = None

    def annotations(self) -> dict[str, str]:
        """The pod annotations that script this behaviour.

        Example:
            >>> sorted(PodScript(lines=["a"], crashes=1).annotations())
            ['script.kfp-trainer.test/crashes', 'script.kfp-trainer.test/line-delay', 'script.kfp-trainer.test/log']
        """
        out: dict[str, str] = {}
        if self.lines:
            out[LOG] = json.dumps(list(self.lines))
            out[LINE_DELAY] = _seconds(self.line_delay)
        if self.start_delay is not None:
            out[START_DELAY] = _seconds(self.start_delay)
        if self.exit_delay is not None:
            out[EXIT_DELAY] = _seconds(self.exit_delay)
        if self.exit_code:
            out[EXIT_CODE] = str(int(self.exit_code))
        if self.crashes:
            out[CRASHES] = ALWAYS if self.crashes < 0 else str(int(self.crashes))
            if self.crash_exit_code != 1:
                out[CRASH_EXIT_CODE] = str(int(self.crash_exit_code))
        if self.crash_after is not None:
            out[CRASH_AFTER] = json.dumps([int(n) for n in self.crash_after])
        if self.crash_backoff is not None:
            out[CRASH_BACKOFF] = _seconds(self.crash_backoff)
        if self.not_ready:
            out[NOT_READY] = "true"
        if self.failing_attempts is not None:
            out[FAILING_ATTEMPTS] = str(int(self.failing_attempts))
        return out


def _seconds(value: float) -> str:
    if value == float("inf"):
        return NEVER
    if value < 0:
        raise ValueError(f"a delay cannot be negative: {value}")
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


@dataclasses.dataclass(frozen=True)
class InstanceLog:
    """What one container instance prints, read back from a pod's annotations."""

    lines: list[str]
    line_delay: float


def instance_log(annotations: Mapping[str, str], instance: int) -> InstanceLog:
    """The lines container instance ``instance`` prints (a crashing one may stop early).

    Example:
        >>> a = PodScript(lines=["a", "b", "c"], crashes=1, crash_after=[2]).annotations()
        >>> instance_log(a, 0).lines, instance_log(a, 1).lines
        (['a', 'b'], ['a', 'b', 'c'])
    """
    raw = annotations.get(LOG)
    lines = [str(x) for x in json.loads(raw)] if raw else []
    delay = float(annotations.get(LINE_DELAY) or DEFAULT_LINE_DELAY)
    crashes = annotations.get(CRASHES)
    crashing = crashes == ALWAYS or (crashes is not None and crashes.isdigit() and instance < int(crashes))
    after = annotations.get(CRASH_AFTER)
    if crashing and after:
        counts = json.loads(after)
        if instance < len(counts):
            lines = lines[: int(counts[instance])]
    return InstanceLog(lines, delay)
