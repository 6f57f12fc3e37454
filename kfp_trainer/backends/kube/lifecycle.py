"""A TrainJob's lifecycle: create, adopt, replace, delete; never two live ones for one run and task.

Submitting finds the task's TrainJobs by their lineage labels (run id + task) first:

* the one with this name (same inputs) is adopted -- or, when it failed, replaced; when it is
  already being deleted (by someone else: a step deleted while running, then retried) it is
  never adopted, deleted or patched: the new one is created once it and everything under it are
  gone, waited for up to ``replace_timeout`` (a :class:`DeletionTimeoutError` when it is not);
* one with another name (other inputs: an earlier try of this task) is replaced: deleted and
  waited for before the new one is created -- unless the launcher recorded on it still runs,
  which is left alone and named in the log;
* one with this name but other inputs (a name given explicitly, kept across tries) is an
  earlier try too: replaced, with everything under it, when its launcher is gone; while that
  launcher runs (or when that cannot be told) it is left alone and the step fails saying so. Jobs of other runs, tasks or execution scopes
  (``ParallelFor`` iterations carry their own ``scope`` label) are never touched.

Deleting uses background propagation (the Trainer controller re-creates the JobSet of a TrainJob
held by a foreground-deletion finalizer), then waits with watches -- bounded -- until the
TrainJob, its JobSet, Jobs and pods are gone, and reports what is left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...cancel import Stop
from ...errors import DeletionTimeoutError, ForbiddenError, OwnershipError, RejectedError, UserError
from ...jobstatus import JobRef, Phase
from ...kube_types import TrainJob
from ...spec import GROUP, LABEL_DIGEST, LABEL_RUN, LABEL_SCOPE, LABEL_TASK, PLURAL, VERSION
from .. import owner
from ..base import JobHandle, Submission, check_ownership, trainjob_status
from ..deletion import deleted_status
from ..owner import describe
from .api import Conflict, NotFound, RetryPolicy, call
from .discovery import runtime_not_seen, version_mismatch
from .leftovers import JOBSET_LABEL, Leftover, leftovers_message
from .paths import MERGE_PATCH, pod, trainjob, trainjobs
from .watch import wait_gone

if TYPE_CHECKING:
    from .client import Client as ApiClient

log = logging.getLogger(__name__)
#: Makes the handle of a submitted job from its ref and the object as created or adopted (its watch starts there).
HandleFactory = Callable[[JobRef, TrainJob], JobHandle]
CREATE_TIMEOUT = (10, 20)  # a stop signal waits for the create's answer: keep it short
# The Job controller can replace pods it saw go for a Job already deleted (its cache lags the
# deletion): those orphans appear a moment after the last pod went, and the garbage collector
# removes them. Once no pod is left, look again after this many seconds and wait for any such.
POD_SETTLE = 1.0
# Seconds between tries of a create the Trainer's webhook refused for a runtime it does not see
# yet (its controller's cache lags the API server by a moment): about 7.5 s in all.
RUNTIME_SEEN_WAITS = (0.5, 1.0, 2.0, 4.0)


class Lifecycle:
    """Create, adopt, replace and delete TrainJobs through one API client."""

    def __init__(self, api: ApiClient, *, policy: RetryPolicy = RetryPolicy(), replace_timeout: float = 120.0) -> None:
        self.api = api
        self.policy = policy
        self.replace_timeout = replace_timeout

    # ------------------------------------------------------------------ requests
    def get(self, ref: JobRef) -> TrainJob:
        """The stored TrainJob (raises NotFound)."""
        found: TrainJob = call(self.api.request, "GET", trainjob(ref.namespace, ref.name), what=f"get TrainJob {ref}", policy=self.policy)
        return found

    def create(self, namespace: str, manifest: dict[str, Any], *, stop: Stop) -> TrainJob:
        """Create the TrainJob (strict field validation). A stop request waits for the answer.

        A refusal by a webhook that does not know the runtime yet (:func:`runtime_not_seen`:
        the runtime was read before, so it exists; made just now, it is not in the
        controller's cache yet) is tried again after :data:`RUNTIME_SEEN_WAITS`; nothing was
        created by a refused attempt.
        """
        ref = manifest["spec"].get("runtimeRef") or {}
        for wait in RUNTIME_SEEN_WAITS:
            try:
                return self._create(namespace, manifest, stop=stop)
            except RejectedError as e:
                if not runtime_not_seen(e.answer, ref.get("kind", ""), ref.get("name", "")):
                    raise
                log.info("the Trainer's webhook does not see %s/%s yet (made just now?); trying again in %.1fs",
                         ref.get("kind"), ref.get("name"), wait)  # fmt: skip
                stop.sleep(wait)
        return self._create(namespace, manifest, stop=stop)  # the last try: its refusal is reported

    def _create(self, namespace: str, manifest: dict[str, Any], *, stop: Stop) -> TrainJob:
        attempts = []

        def attempt(*args: Any, **kwargs: Any) -> TrainJob:
            stop.check()  # before each attempt: a cancel after an unanswered one is reclaimed by the caller
            attempts.append(1)
            created: TrainJob = self.api.request(*args, **kwargs)  # a stop signal waits for the answer
            stop.check()  # then the caller finds the job by name and deletes it
            return created

        name = manifest["metadata"]["name"]
        try:
            created = call(
                attempt,
                "POST",
                trainjobs(namespace),
                query={"fieldValidation": "Strict"},
                body=manifest,
                timeout=CREATE_TIMEOUT,
                what=f"create TrainJob {namespace}/{name}",
                policy=self.policy,
                sleep=stop.sleep,
            )
        except Conflict as e:
            if len(attempts) > 1:  # an earlier attempt got no answer: it may have made the job
                raise LostCreate(str(e), e.answer) from e
            raise
        except RejectedError as e:
            hint = version_mismatch(e.answer)
            if hint:
                raise RejectedError(f"{e}: {hint}") from e
            raise
        return created

    def lineage(self, namespace: str, run: str, task: str, scope: str = "") -> list[TrainJob]:
        """TrainJobs in ``namespace`` labelled with this run and task (and execution scope, when given)."""
        selector = f"{LABEL_RUN}={run},{LABEL_TASK}={task}" + (f",{LABEL_SCOPE}={scope}" if scope else "")
        body = call(
            self.api.request,
            "GET",
            trainjobs(namespace),
            query={"labelSelector": selector},
            what=f"list TrainJobs of run {run} task {task}",
            policy=self.policy,
        )
        return list(body.get("items") or [])

    # ------------------------------------------------------------------ submit
    def submit(self, manifest: dict[str, Any], namespace: str, *, handle: HandleFactory, stop: Stop | None = None) -> Submission:
        """Create the TrainJob, adopt this task's earlier one, or replace it (see the module docstring).

        ``handle`` makes the submission's handle from the job as created or adopted; ``stop`` is
        looked at before each create attempt and ends a wait for an earlier try's job to go.
        """
        stop = stop if stop is not None else Stop()
        manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
        name = manifest["metadata"]["name"]
        labels = manifest["metadata"].get("labels") or {}
        notes: list[str] = []
        existing = None
        if labels.get(LABEL_RUN) and labels.get(LABEL_TASK):
            try:
                jobs = self.lineage(namespace, labels[LABEL_RUN], labels[LABEL_TASK], labels.get(LABEL_SCOPE, ""))
            except ForbiddenError as e:
                jobs = []
                notes.append(f"could not look for earlier tries of this task: {e}")
            for job in jobs:
                if job["metadata"]["name"] == name:
                    existing = job
                else:
                    notes += self._retire(job, manifest, stop)
        if existing is None:
            lost = False
            try:
                return _made(handle, manifest, self.create(namespace, manifest, stop=stop), notes)
            except Conflict as e:
                lost = isinstance(e, LostCreate)
            try:
                existing = self.get(JobRef(namespace, name))
            except NotFound:  # deleted in between: create once more
                return _made(handle, manifest, self.create(namespace, manifest, stop=stop), notes)
            return self._take_over(manifest, existing, notes, handle, stop, lost_create=lost)
        return self._take_over(manifest, existing, notes, handle, stop)

    def _take_over(self, manifest: dict[str, Any], existing: TrainJob, notes: list[str], handle: HandleFactory, stop: Stop,
                   lost_create: bool = False) -> Submission:  # fmt: skip
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        if _earlier_try(manifest, existing):  # the same name given explicitly, other inputs
            return self._replace_earlier_try(manifest, existing, notes, handle, stop)
        check_ownership(manifest, existing, remedy=f"delete it: kubectl delete trainjob -n {namespace} {name}")
        ref = JobRef(namespace, name, existing["metadata"]["uid"])
        if lost_create and _same_launcher(manifest, existing) and not existing["metadata"].get("deletionTimestamp"):
            # This launcher made it: the first create's answer was lost (a timeout), its retry was told it exists.
            return _made(handle, manifest, existing, notes)
        if existing["metadata"].get("deletionTimestamp"):
            self._wait_deleted(existing, notes, stop)
            return _made(handle, manifest, self.create(namespace, manifest, stop=stop), notes)
        if trainjob_status(existing).phase is Phase.FAILED:
            log.warning("TrainJob %s from an earlier try failed; replacing it", ref)
            self._delete_for_replace(ref, tree=True, stop=stop)
            return _made(handle, manifest, self.create(namespace, manifest, stop=stop), notes, replaced=True)
        return Submission(handle(ref, self._record_launcher(manifest, existing)), adopted=True, notes=tuple(notes))

    def _record_launcher(self, manifest: dict[str, Any], existing: TrainJob) -> TrainJob:
        """Name this launcher on an adopted job, so gc and later tries see who follows it now; the job as it is then."""
        mine = (manifest["metadata"].get("annotations") or {}).get(owner.ANNOTATION)
        if not mine or (existing["metadata"].get("annotations") or {}).get(owner.ANNOTATION) == mine:
            return existing
        meta = existing["metadata"]
        try:
            patched = call(
                self.api.request,
                "PATCH",
                trainjob(meta["namespace"], meta["name"]),
                body={"metadata": {"annotations": {owner.ANNOTATION: mine}}},
                headers=MERGE_PATCH,
                what=f"record the launcher on TrainJob {meta['namespace']}/{meta['name']}",
                policy=self.policy,
            )
        except UserError as e:  # following the job matters more than the record
            log.warning("%s", e)
            return existing
        updated: TrainJob = patched
        return updated

    def _retire(self, job: TrainJob, manifest: dict[str, Any], stop: Stop) -> list[str]:
        """Deal with a TrainJob of this run and task with other inputs (another name)."""
        meta = job["metadata"]
        ref = JobRef(meta["namespace"], meta["name"], meta["uid"])
        old, new = (meta.get("labels") or {}).get(LABEL_DIGEST), (manifest["metadata"].get("labels") or {}).get(LABEL_DIGEST)
        if meta.get("deletionTimestamp"):
            self._wait_gone_for_replace(ref, tree=False, stop=stop)
            return [f"waited for TrainJob {ref} of an earlier try of this task (being deleted) to go"]
        status = trainjob_status(job)
        if status.phase.finished:
            return [f"kept TrainJob {ref} of an earlier try of this task with other inputs: it has {status.phase.value.lower()}"]
        identity = owner.parse(job)
        alive = self.launcher_alive(identity)
        who = describe(identity)
        if alive or owner.is_me(identity):
            return [f"left TrainJob {ref} of this run and task (other inputs) alone: its launcher {who} still runs it"]
        if alive is None:
            return [
                f"left TrainJob {ref} of this run and task (other inputs) alone: cannot tell whether its launcher {who} "
                f"still runs; if it is stale: kfp-trainer gc -n {ref.namespace} --yes, "
                f"or kubectl delete trainjob -n {ref.namespace} {ref.name}"
            ]
        self._delete_for_replace(ref, tree=False, stop=stop)
        return [
            f"replaced stale TrainJob {ref} of an earlier try of this task (inputs digest {old} -> {new}; "
            f"its launcher {who} is gone): deleted it before creating {manifest['metadata']['name']}"
        ]

    def _replace_earlier_try(self, manifest: dict[str, Any], existing: TrainJob, notes: list[str], handle: HandleFactory,
                             stop: Stop) -> Submission:  # fmt: skip
        """The wanted name is taken by a job of this run and task with other inputs: an earlier try.

        Replaced when its launcher is gone (deleted with everything under it, then created
        anew); left alone with a clear error while its launcher runs, or when that cannot be told.
        """
        meta = existing["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        ref = JobRef(namespace, name, meta["uid"])
        old, new = (meta.get("labels") or {}).get(LABEL_DIGEST), (manifest["metadata"].get("labels") or {}).get(LABEL_DIGEST)
        if meta.get("deletionTimestamp"):
            self._wait_deleted(existing, notes, stop)
        else:
            identity = owner.parse(existing)
            alive, who = self.launcher_alive(identity), describe(identity)
            remedy = f"give this try another name, or delete that job: kubectl delete trainjob -n {namespace} {name}"
            if alive or owner.is_me(identity):
                raise OwnershipError(
                    f"TrainJob {namespace}/{name} belongs to this run and task with other inputs (inputs digest {old}, this try {new}) "
                    f"and its launcher {who} still runs it; it is left alone. To run these inputs now, {remedy}"
                )
            if alive is None:
                raise OwnershipError(
                    f"TrainJob {namespace}/{name} belongs to this run and task with other inputs (inputs digest {old}, this try {new}); "
                    f"cannot tell whether its launcher {who} still runs, so it is left alone. If it is stale, {remedy}"
                )
            self._delete_for_replace(ref, tree=True, stop=stop)  # the new job's JobSet, Jobs and pods take the same names
            notes.append(
                f"replaced stale TrainJob {ref} of an earlier try of this task (inputs digest {old} -> {new}; "
                f"its launcher {who} is gone): deleted it before creating {name} with this try's inputs"
            )
        try:
            created = self.create(namespace, manifest, stop=stop)
        except Conflict:  # a concurrent retry created it first: follow that one
            return self._take_over(manifest, self.get(JobRef(namespace, name)), notes, handle, stop)
        return _made(handle, manifest, created, notes)

    def owned_by_run(self, manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
        """``manifest`` owned by the run its launcher's pod belongs to (:func:`~kfp_trainer.backends.owner.run_owner`).

        Unchanged outside a pod, for a job in another namespace, or when the pod cannot be read
        (the backstop is then the step's own deletion, and ``kfp-trainer gc``).
        """
        identity = owner.parse(manifest)
        if not identity or "pod" not in identity:
            return manifest
        if str(identity["pod"]).partition("/")[0] != namespace:
            return manifest
        try:
            found = self._launcher_pod(identity)
        except (NotFound, UserError) as e:
            log.info("TrainJob not owned by the run: %s", e)
            return manifest
        ref = owner.run_owner(found, identity, namespace)
        if ref is None:
            return manifest
        return {**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [ref]}}

    def _launcher_pod(self, identity: dict[str, Any]) -> dict[str, Any]:
        """The pod a launcher identity names (``namespace/name``), as stored; NotFound or UserError when it cannot be read."""
        namespace, _, name = str(identity["pod"]).partition("/")
        found: dict[str, Any] = call(self.api.request, "GET", pod(namespace, name), what=f"get launcher pod {identity['pod']}",
                                     policy=self.policy)  # fmt: skip
        return found

    def launcher_alive(self, identity: dict[str, Any] | None) -> bool | None:
        """Whether the recorded launcher still runs: True, False (gone, or none recorded), or None (cannot tell)."""
        if identity is None:
            return False
        if "pod" in identity:
            try:
                found = self._launcher_pod(identity)
            except NotFound:
                return False
            except UserError:
                return None
            return owner.pod_alive(found, identity)
        return owner.local_process_alive(identity)

    # ------------------------------------------------------------------ delete
    def _delete_for_replace(self, ref: JobRef, *, tree: bool, stop: Stop) -> None:
        left = self.delete(ref, wait=self.replace_timeout, tree=tree, stop=stop)  # a cancel ends the wait: nothing new is made
        self._refuse_to_create_over(ref, left)

    def _wait_gone_for_replace(self, ref: JobRef, *, tree: bool, stop: Stop, how: str = "") -> None:
        left = self._wait_tree(ref, time.monotonic() + self.replace_timeout, tree=tree, stop=stop)
        self._refuse_to_create_over(ref, left, how)

    def _wait_deleted(self, existing: TrainJob, notes: list[str], stop: Stop) -> None:
        """Wait (bounded) until this task's TrainJob being deleted by someone else is gone with all under it; never adopt it."""
        meta = existing["metadata"]
        ref, deleting = JobRef(meta["namespace"], meta["name"], meta["uid"]), deleted_status(existing)
        how = deleting.message if deleting else ""
        notes.append(f"TrainJob {ref} of an earlier try is being deleted; waited for it to go before creating a new one ({how})")
        self._wait_gone_for_replace(ref, tree=True, stop=stop, how=how)

    def _refuse_to_create_over(self, ref: JobRef, left: list[Leftover], how: str = "") -> None:
        blocking = [x for x in left if x.kind != "Pod" or not x.terminating]
        if blocking:
            raise DeletionTimeoutError(
                f"TrainJob {ref} of an earlier try was still being deleted after {self.replace_timeout:.0f}s "
                f"({', '.join(map(str, blocking))}{': ' + how if how else ''}); not creating another one over it. "
                + leftovers_message(ref, left, self.replace_timeout).split("\n", 1)[1].strip()
                + "\nRetry the step once it is gone."
            )

    def delete(self, ref: JobRef, *, wait: float = 30.0, tree: bool = True, stop: Stop | None = None) -> list[Leftover]:
        """Delete the TrainJob (background propagation); wait, bounded, until it and what it owns are gone.

        Args:
            ref: The job; with a uid, a newer object of the same name is never deleted.
            wait: Seconds to wait in all.
            tree: Also wait for its JobSet, Jobs and pods (else only the TrainJob).
            stop: A stop token that ends the wait (to replace a job; never to clean up after a cancel).

        Returns:
            What is still there when waiting ended (empty when everything is gone).
        """
        deadline = time.monotonic() + wait
        if not self.request_delete(ref):
            return []
        return self._wait_tree(ref, deadline, tree=tree, stop=stop)

    def request_delete(self, ref: JobRef) -> bool:
        """Send the TrainJob's deletion (background propagation: no finalizer holds it); do not wait for it.

        Once the API server has taken it, the garbage collector removes the JobSet, Jobs and pods
        whatever becomes of this process. Safe from any thread.

        Returns:
            False when another object has the name now (``ref``'s uid is gone); True otherwise,
            also when the job was gone already.
        """
        try:
            call(
                self.api.request,
                "DELETE",
                trainjob(ref.namespace, ref.name),
                query={"propagationPolicy": "Background"},
                body={"preconditions": {"uid": ref.uid}} if ref.uid else None,
                what=f"delete TrainJob {ref}",
                policy=RetryPolicy(attempts=3),
            )
        except NotFound:
            pass
        except Conflict:  # the precondition failed: another object has the name now, ours is gone
            return False
        return True

    def _wait_tree(self, ref: JobRef, deadline: float, *, tree: bool, stop: Stop | None = None) -> list[Leftover]:
        ns, name = ref.namespace, ref.name
        stages: list[tuple[str, str, list[tuple[str, str]]]] = [
            ("TrainJob", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}", [("fieldSelector", f"metadata.name={name}")]),
        ]
        if tree:
            by_label = [("labelSelector", f"{JOBSET_LABEL}={name}")]
            stages += [
                ("JobSet", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", [("fieldSelector", f"metadata.name={name}")]),
                ("Job", f"/apis/batch/v1/namespaces/{ns}/jobs", by_label),
                ("Pod", f"/api/v1/namespaces/{ns}/pods", by_label),
            ]
        left: list[Leftover] = []
        for kind, path, selectors in stages:
            keep = (lambda o: not ref.uid or o["metadata"].get("uid") == ref.uid) if kind == "TrainJob" else (lambda o: True)
            try:
                def gone() -> list[dict[str, Any]]:
                    left = max(0.0, deadline - time.monotonic())
                    return wait_gone(self.api, path, selectors, timeout=left, keep=keep, stop=stop)  # noqa: B023

                still = gone()
                if kind == "Pod" and not still and deadline > time.monotonic():
                    time.sleep(min(POD_SETTLE, deadline - time.monotonic()))
                    still = gone()
            except ForbiddenError as e:  # not allowed to look: cannot tell, say nothing wrong
                log.info("cannot check the %ss of TrainJob %s: %s", kind, ref, e)
                continue
            left += [Leftover(kind, o["metadata"]["name"], bool(o["metadata"].get("deletionTimestamp"))) for o in still]
            if kind == "TrainJob" and still:
                break  # its children are not collected before it goes
        return left

    def reclaim(self, manifest: dict[str, Any], namespace: str, *, wait: float = 30.0) -> tuple[JobRef, list[Leftover]] | None:
        """After a cancel during submission: delete this task's job if it exists (it may have just been created)."""
        ref = JobRef(namespace, manifest["metadata"]["name"])
        try:
            existing = self.get(ref)
        except NotFound:
            return None
        mine, theirs = manifest["metadata"].get("labels") or {}, existing["metadata"].get("labels") or {}
        if any(mine.get(k) != theirs.get(k) for k in (LABEL_RUN, LABEL_TASK, LABEL_DIGEST)):
            return None
        ref = JobRef(namespace, ref.name, existing["metadata"]["uid"])
        return ref, self.delete(ref, wait=wait)


def _made(handle: HandleFactory, manifest: dict[str, Any], obj: TrainJob, notes: list[str], *, replaced: bool = False) -> Submission:
    """The submission of the job this launcher created from ``manifest`` (``obj``: as the create returned it)."""
    ref = JobRef(manifest["metadata"]["namespace"], manifest["metadata"]["name"], obj["metadata"]["uid"])
    return Submission(handle(ref, obj), adopted=False, replaced=replaced, notes=tuple(notes))


class LostCreate(Conflict):
    """A retried create was told the job exists: the attempt whose answer was lost made it (or another launcher did)."""


def _earlier_try(manifest: dict[str, Any], existing: TrainJob) -> bool:
    """Whether ``existing`` is a job of the same run, task and scope as ``manifest`` with other inputs."""
    mine, theirs = manifest["metadata"].get("labels") or {}, existing["metadata"].get("labels") or {}
    return (
        bool(mine.get(LABEL_RUN)) and bool(mine.get(LABEL_TASK))
        and all(mine.get(k) == theirs.get(k) for k in (LABEL_RUN, LABEL_TASK, LABEL_SCOPE))
        and mine.get(LABEL_DIGEST) != theirs.get(LABEL_DIGEST)
    )  # fmt: skip


def _same_launcher(manifest: dict[str, Any], existing: TrainJob) -> bool:
    mine = (manifest["metadata"].get("annotations") or {}).get(owner.ANNOTATION)
    return bool(mine) and (existing["metadata"].get("annotations") or {}).get(owner.ANNOTATION) == mine
