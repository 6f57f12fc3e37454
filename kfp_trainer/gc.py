"""``kfp-trainer gc``: find (and delete) TrainJobs that kfp-trainer left behind.

A TrainJob is considered when it carries ``app.kubernetes.io/managed-by=kfp-trainer``. It is
garbage, and listed with the reason, when any of these holds:

* **task gone** -- it has not finished, and the launcher that created or last adopted it (the
  ``kfp-trainer.kubeflow.org/launcher`` annotation) no longer runs: its pod does not exist, is
  a newer pod of the same name, has finished or is being deleted; for a launcher that ran
  outside the cluster, its process (pid and start time) is gone -- checked only on the host it
  ran on. No launcher can follow the job any more, so nothing will ever stop it;
* **run gone** -- Argo Workflows is served and no Workflow labelled ``pipeline/runid=<run id>``
  exists in the launcher's namespace (the KFP run was deleted), or that Workflow has ended
  while the TrainJob has not;
* **older than** ``--older-than`` (any state), when given.

Finished jobs whose launcher is gone are kept (they are the record of a run) unless they are
older than the limit. Nothing is deleted without ``--yes``; deletion uses background
propagation, so the Trainer controller cannot re-create the JobSet while it goes.

Example:
    >>> parse_age("1h30m")
    5400.0
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .kube_types import TrainJob
from .timestamps import parse_timestamp
from .timing import duration

MANAGED_BY = "app.kubernetes.io/managed-by=kfp-trainer"
WORKFLOW_RUN_LABEL = "pipeline/runid"
_AGE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhdw])")  # ASCII digits: float() would take '١٢' too
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90s``, ``30m``, ``24h``, ``7d``, ``1w`` or combinations (``1h30m``) -> seconds.

    Raises:
        ValidationError: Anything else.
    """
    from .errors import ValidationError

    compact = text.strip().lower()
    parts = _AGE.findall(compact)
    if not compact or not parts or "".join(n + u for n, u in parts) != compact:
        raise ValidationError("--older-than", text, "a duration such as 90s, 30m, 24h, 7d or 1h30m")
    return float(sum(float(n) * _UNIT[u] for n, u in parts))


def format_age(seconds: float) -> str:
    """A short age for the table (:func:`kfp_trainer.timing.duration`, compact).

    Example:
        >>> format_age(93784)
        '1d2h'
    """
    return duration(seconds, compact=True)


@dataclass
class Candidate:
    """One TrainJob kfp-trainer created, with what gc found out about it."""

    namespace: str
    name: str
    uid: str
    run: str
    task: str
    age: float
    state: str
    why: list[str] = field(default_factory=list)

    @property
    def garbage(self) -> bool:
        """Whether any rule applies."""
        return bool(self.why)


class Collector:
    """Finds kfp-trainer's TrainJobs and decides which are garbage (see the module docstring)."""

    def __init__(self, api: Any, *, older_than: float | None = None, now: float | None = None) -> None:
        from .backends.kube.api import RetryPolicy
        from .backends.kube.lifecycle import Lifecycle

        self.api = api
        self.older_than = older_than
        self.now = time.time() if now is None else now
        self.policy = RetryPolicy(attempts=3)
        self.lifecycle = Lifecycle(api, policy=self.policy)
        self._workflows: dict[tuple[str, str], dict[str, Any] | None | bool] = {}

    def trainjobs(self, namespace: str | None) -> list[TrainJob]:
        """kfp-trainer's TrainJobs in ``namespace`` (all namespaces when None)."""
        from .backends.kube.api import call
        from .spec import GROUP, PLURAL, VERSION

        where = f"/namespaces/{namespace}" if namespace else ""
        path = f"/apis/{GROUP}/{VERSION}{where}/{PLURAL}"
        body = call(
            self.api.request, "GET", path, query={"labelSelector": MANAGED_BY}, timeout=60, what=f"list TrainJobs ({MANAGED_BY})",
            policy=self.policy,
        )  # fmt: skip
        return list(body.get("items") or [])

    def workflow(self, namespace: str, run_id: str) -> dict[str, Any] | None | bool:
        """The KFP run's Argo Workflow; None when there is none; False when that cannot be told."""
        from .backends.kube.api import NotFound, call
        from .errors import UserError

        key = (namespace, run_id)
        if key not in self._workflows:
            path = f"/apis/argoproj.io/v1alpha1/namespaces/{namespace}/workflows"
            try:
                body = call(
                    self.api.request,
                    "GET",
                    path,
                    query={"labelSelector": f"{WORKFLOW_RUN_LABEL}={run_id}"},
                    timeout=30,
                    what="list Workflows",
                    policy=self.policy,
                )
                items = body.get("items") or []
                self._workflows[key] = items[0] if items else None
            except NotFound:  # Argo Workflows is not served here
                self._workflows[key] = False
            except UserError:  # not allowed to look
                self._workflows[key] = False
        return self._workflows[key]

    def inspect(self, job: TrainJob) -> Candidate:
        """What gc makes of one TrainJob."""
        from .backends import owner
        from .backends.base import trainjob_status
        from .backends.owner import describe
        from .spec import ANNOTATION_RUN, ANNOTATION_TASK, LABEL_RUN, LABEL_TASK

        meta = job["metadata"]
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        stamp = parse_timestamp(str(meta.get("creationTimestamp") or ""))
        created = float(stamp[0]) if stamp else None
        status = trainjob_status(job)
        state = "Deleting" if meta.get("deletionTimestamp") else status.phase.value
        found = Candidate(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid", ""),
            run=notes.get(ANNOTATION_RUN) or labels.get(LABEL_RUN, ""),
            task=notes.get(ANNOTATION_TASK) or labels.get(LABEL_TASK, ""),
            age=self.now - created if created else 0.0,
            state=state,
        )
        if meta.get("deletionTimestamp"):
            return found  # already going
        if self.older_than is not None and found.age > self.older_than:
            found.why.append(f"older than {format_age(self.older_than)}")
        identity = owner.parse(job)
        if not status.phase.finished and identity is not None and self.lifecycle.launcher_alive(identity) is False:
            found.why.append(f"task gone: launcher {describe(identity)} no longer runs")
        run_id = notes.get(ANNOTATION_RUN) or labels.get(LABEL_RUN)
        if run_id:
            where = str(identity["pod"]).partition("/")[0] if identity and "pod" in identity else found.namespace
            workflow = self.workflow(where, run_id)
            if workflow is None:
                found.why.append(f"run gone: no Workflow labelled {WORKFLOW_RUN_LABEL}={run_id} in {where}")
            elif isinstance(workflow, dict) and not status.phase.finished:
                phase = (workflow.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed", "Error"):
                    found.why.append(f"run ended: Workflow {workflow['metadata']['name']} is {phase}")
        return found

    def delete(self, candidate: Candidate) -> str:
        """Delete one garbage TrainJob (background propagation, only that uid); what happened."""
        from .jobstatus import JobRef

        ref = JobRef(candidate.namespace, candidate.name, candidate.uid)
        left = self.lifecycle.delete(ref, wait=0.0, tree=False)
        return f"deleted TrainJob {ref}" if not left else f"asked to delete TrainJob {ref}; it is still terminating"


def table(candidates: list[Candidate]) -> str:
    """The candidates as a plain-text table."""
    rows = [("NAMESPACE", "NAME", "RUN", "TASK", "AGE", "STATE", "WHY")]
    rows += [(c.namespace, c.name, c.run, c.task, format_age(c.age), c.state, "; ".join(c.why)) for c in candidates]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows)


def add_parser(sub: Any, formatter: Any = argparse.RawDescriptionHelpFormatter) -> None:
    """Register ``gc`` on the CLI's subparsers."""
    gc = sub.add_parser(
        "gc",
        help="find (and with --yes delete) TrainJobs kfp-trainer left behind",
        description=(__doc__ or "").split("Example:")[0],
        formatter_class=formatter,
    )
    where = gc.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", help="look in this namespace; the kubeconfig context's when unset")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="look in every namespace")
    gc.add_argument(
        "--older-than", type=str, metavar="AGE", help="also collect any job older than this (e.g. 24h, 7d); no age limit when unset"
    )
    gc.add_argument("--yes", action="store_true", help="delete what is listed (otherwise only list it)")
    gc.add_argument("--dry-run", action="store_true", help="only list, even with --yes")
    gc.add_argument("--all", action="store_true", help="also list the jobs that are not garbage")
    gc.add_argument(
        "--kubeconfig", metavar="PATH", help="kubeconfig file; $KUBECONFIG, else ~/.kube/config, else the pod's service account when unset"
    )
    gc.add_argument(
        "-o", "--output", choices=["json", "yaml"],
        help="print the jobs listed as a document (what was deleted included), notes on stderr; a table when unset",
    )  # fmt: skip
    gc.set_defaults(func=run)


def check_flags(ns: argparse.Namespace) -> float | None:
    """The ``--older-than`` limit in seconds, once every flag is known good (before any connection).

    Raises:
        ValidationError: ``--namespace`` is not a namespace name, or ``--older-than`` not an age.
    """
    from .errors import ValidationError
    from .spec.rules import DNS_LABEL, ok

    if ns.namespace is not None and not ok(DNS_LABEL, ns.namespace, 63):
        raise ValidationError("--namespace", ns.namespace, "a namespace name: RFC-1123 label, <= 63 characters")
    return parse_age(ns.older_than) if ns.older_than else None


def run(ns: argparse.Namespace) -> int:
    """The ``gc`` command."""
    from .backends.kube.connect import connect, kubeconfig_namespace
    from .backends.kube.discovery import default_namespace

    older = check_flags(ns)
    api = connect(ns.kubeconfig, hint="")
    collector = Collector(api, older_than=older)
    namespace = None if ns.all_namespaces else (ns.namespace or kubeconfig_namespace(ns.kubeconfig) or default_namespace())
    found = [collector.inspect(job) for job in collector.trainjobs(namespace)]
    garbage = [c for c in found if c.garbage]
    shown = found if ns.all else garbage
    where = "all namespaces" if namespace is None else f"namespace {namespace}"

    def note(text: str) -> None:  # with -o, stdout holds the document and only that
        print(text, file=sys.stderr if ns.output else sys.stdout)

    note(f"{len(found)} TrainJob(s) created by kfp-trainer in {where}; {len(garbage)} to collect")
    if shown and not ns.output:
        print(table(shown))
    deleted: dict[str, str] = {}
    if garbage and (ns.dry_run or not ns.yes):
        note("dry run: nothing deleted; add --yes to delete the jobs listed with a reason")
    elif garbage:
        for candidate in garbage:
            deleted[candidate.uid] = collector.delete(candidate)
            note(deleted[candidate.uid])
    if ns.output:
        listing = {"namespace": namespace, "found": len(found), "items": [document(c, deleted.get(c.uid)) for c in shown]}
        if ns.output == "json":
            print(json.dumps(listing, indent=2))
        else:
            import yaml

            yaml.safe_dump(listing, sys.stdout, sort_keys=False)
    return 0


def document(candidate: Candidate, deleted: str | None = None) -> dict[str, Any]:
    """One listed job for ``-o json|yaml``: the table's columns, the age in seconds, the reasons as a list."""
    return {
        "namespace": candidate.namespace, "name": candidate.name, "uid": candidate.uid, "run": candidate.run,
        "task": candidate.task, "ageSeconds": int(candidate.age), "state": candidate.state, "garbage": candidate.garbage,
        "why": list(candidate.why), "deleted": deleted,
    }  # fmt: skip
