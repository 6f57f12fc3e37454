"""One fake of the :class:`~kfp_trainer.backends.base.Backend` contract, for the unit tests.

It plays one job from a script -- statuses, and numbers that advance a fake clock by that
many seconds and stand for a heartbeat -- records every call, and runs a hook at the moments
a test wants to act on (send a signal, raise): ``prepare``, ``create``, ``watch``,
``logs`` (the log follower starts), ``blockers``, ``diagnose``, ``request_delete`` (the early
deletion), ``delete``. Its submit hands back a :class:`FakeJob` (the job's handle) that
plays the backend's script. Tests subclass it to change one part (what submit writes), or
subclass :class:`FakeJob` and name it in ``job_type`` (how the job behaves: its log).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kfp_trainer.backends.base import Backend, Blocker, JobHandle, LogLine, LogSink, RuntimeInfo, Submission
from kfp_trainer.cancel import Stop
from kfp_trainer.jobstatus import JobRef, JobStatus


class FakeClock:
    """A clock the script moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeJob(JobHandle):
    """The handle :meth:`FakeBackend.submit` hands back: it plays the backend's script and hooks."""

    def __init__(self, backend: FakeBackend, ref: JobRef) -> None:
        super().__init__(ref)
        self.backend = backend

    @property
    def lines(self) -> list[str]:
        """The trainer's log lines."""
        return self.backend.lines

    def watch(self) -> Iterator[JobStatus | None]:
        b = self.backend
        b._hook("watch")
        for item in b.script:
            if isinstance(item, (int, float)):
                b.clock.now += item
                yield None
            else:
                yield item
        while b.idle:
            time.sleep(0.01)
            yield None

    def blockers(self) -> list[Blocker]:
        self.backend._hook("blockers")
        return list(self.backend.blocker_list)

    def queue_notes(self) -> list[str]:
        b = self.backend
        out, b.queue = b.queue[:1], b.queue[1:]
        return out

    def follow_logs(self, *, nodes: str, sink: LogSink, stop: threading.Event) -> None:
        self.backend._hook("logs")
        for line in self.backend.lines:
            sink(LogLine("node-0", line))
        if self.backend.hold_logs:
            stop.wait(60)  # like a real follower: until the launcher says the job is over

    def diagnose(self, *, tail: int = 40) -> str:
        self.backend._hook("diagnose")
        return "Pods:\n  x-node-0-0: Failed"

    def request_delete(self) -> None:
        self.backend.requested.append((time.monotonic(), self.ref))
        self.backend._hook("request_delete")

    def delete(self, *, wait: float = 30.0) -> str:
        return self.backend.delete(self.ref, wait=wait)

    def release(self) -> None:
        self.backend.released.append(self.ref)

    def inspect_hint(self) -> str:
        return f"  kubectl get trainjob -n {self.ref.namespace} {self.ref.name}"


class FakeBackend(Backend):
    """A backend that plays one job; see the module docstring.

    Args:
        script: Statuses to yield, and numbers (seconds the clock moves; a heartbeat).
        clock: The fake clock the numbers move.
        blockers: What :meth:`blockers` reports, every time.
        lines: The trainer's log lines.
        idle: After the script, heartbeats until the launcher stops (else the watch ends).
        hold_logs: The log follower waits for ``stop`` after its lines, as a real one does.
        notes: The submission's notes.
        queue: What the queue says, one note per :meth:`queue_notes` call.
        left: What :meth:`delete` reports as left.
        hooks: ``name -> callable`` run at that moment (see the module docstring).
    """

    job_type: type[FakeJob] = FakeJob  # the handle submit hands back

    def __init__(
        self,
        script: list[Any] | tuple[Any, ...] = (),
        clock: FakeClock | None = None,
        *,
        blockers: list[Blocker] | tuple[Blocker, ...] = (),
        lines: list[str] | tuple[str, ...] = (),
        idle: bool = False,
        hold_logs: bool = True,
        notes: tuple[str, ...] = (),
        queue: list[str] | tuple[str, ...] = (),
        left: str = "",
        namespace: str = "ns",
        nodes: int = 1,
        api_version: str = "v2.2",
        hooks: dict[str, Callable[[], None] | None] | None = None,
    ) -> None:
        self.script = list(script)
        self.clock = clock or FakeClock()
        self.blocker_list = list(blockers)
        self.lines = list(lines)
        self.idle = idle
        self.hold_logs = hold_logs
        self.notes = notes
        self.queue = list(queue)
        self.left = left
        self.namespace = namespace
        self.nodes = nodes
        self.api_version = api_version
        self.hooks = dict(hooks or {})
        self.calls: list[tuple[str, Any]] = []
        self.submitted: list[dict[str, Any]] = []
        self.deleted: list[JobRef] = []
        self.requested: list[tuple[float, JobRef]] = []  # request_delete calls: (monotonic time, job)
        self.reclaimed: list[str] = []
        self.released: list[JobRef] = []
        self.jobs: list[FakeJob] = []  # the handles submit handed back
        self.exists = False
        self.delete_finished = False

    @property
    def writes(self) -> list[tuple[str, Any]]:
        """The calls that would change a cluster."""
        return [c for c in self.calls if c[0] in ("submit", "delete")]

    def _hook(self, name: str) -> None:
        hook = self.hooks.get(name)
        if hook is not None:
            hook()

    def default_namespace(self) -> str:
        return self.namespace

    def runtime_info(self, inputs: Any) -> RuntimeInfo:
        """The runtime :meth:`resolve_runtime` reports (a subclass may add initializers)."""
        return RuntimeInfo(
            name=inputs.runtime, kind=inputs.runtime_kind, api_version=self.api_version,  # type: ignore[arg-type]
            replicated_jobs=(("node", self.nodes),),
        )  # fmt: skip

    def resolve_runtime(self, inputs: Any) -> RuntimeInfo:
        self.calls.append(("resolve_runtime", inputs.runtime))
        self._hook("prepare")
        return self.runtime_info(inputs)

    def create(self, manifest: dict[str, Any]) -> None:
        """What the create request does (a subclass may write files)."""

    def submit(self, manifest: dict[str, Any], *, runtime: Any = None, stop: Stop | None = None) -> Submission:
        name = manifest["metadata"]["name"]
        self.calls.append(("submit", name))
        self.submitted.append(copy.deepcopy(manifest))
        self._hook("create")  # while the create request is in flight
        self.create(manifest)
        self.exists = True
        if stop is not None:
            stop.check()  # as the Kubernetes backend once its create request returned
        ref = JobRef(manifest["metadata"].get("namespace") or self.namespace, name, "uid-1")
        self.jobs.append(self.job_type(self, ref))
        return Submission(self.jobs[-1], adopted=False, notes=self.notes)

    def reclaim(self, manifest: dict[str, Any], *, wait: float = 30.0) -> str | None:
        self.reclaimed.append(manifest["metadata"]["name"])
        if not self.exists:
            return None
        self.exists = False
        return f"deleted TrainJob {self.namespace}/{manifest['metadata']['name']}"

    def delete(self, ref: JobRef, *, wait: float = 30.0) -> str:
        self.calls.append(("delete", ref.name))
        self.deleted.append(ref)
        self._hook("delete")
        self.exists = False
        self.delete_finished = True
        return self.left
