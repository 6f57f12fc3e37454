"""Requests counted at the API server: the audit policy the bench runs with, and its log read back.

The bench gives every launcher it starts a service account of its own in :data:`IDENTITY_NS`;
the policy logs every request of those accounts at ``Metadata`` level (nothing of the
controllers, the scheduler or the bench itself) and every write of a TrainJob's status at
``RequestResponse`` level, so the moment a job turned ``Complete`` is known to the
microsecond, as the API server saw it.

Example:
    >>> line = ('{"auditID":"a1","stage":"ResponseComplete","verb":"get","requestURI":"/api/v1/namespaces/x/pods",'
    ...         '"user":{"username":"system:serviceaccount:kfp-bench:ours-1"},"responseStatus":{"code":200},'
    ...         '"requestReceivedTimestamp":"2026-01-01T00:00:00.000000Z","stageTimestamp":"2026-01-01T00:00:00.250000Z",'
    ...         '"objectRef":{"resource":"pods","namespace":"x"}}')
    >>> log = AuditLog.parse([line])
    >>> [(r.identity, r.verb, r.resource, round(r.completed - r.received, 2)) for r in log.requests]
    [('ours-1', 'get', 'pods', 0.25)]
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp_trainer.timestamps import parse_timestamp

IDENTITY_NS = "kfp-bench"  # the launchers' service accounts live here; their jobs too
USER_PREFIX = f"system:serviceaccount:{IDENTITY_NS}:"

POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:{IDENTITY_NS}"]
  - level: RequestResponse
    resources:
      - group: trainer.kubeflow.org
        resources: ["trainjobs/status"]
  - level: None
"""


def stamp(text: str) -> float:
    """An audit timestamp (RFC 3339, microseconds) as seconds since the epoch.

    Example:
        >>> stamp("1970-01-01T00:01:00.5Z")
        60.5
    """
    parsed = parse_timestamp(text)
    if parsed is None:
        raise ValueError(f"not an RFC 3339 UTC timestamp: {text!r}")
    return parsed[0] + parsed[1] / 1e9


@dataclass
class Request:
    """One request of a bench identity, as the API server logged it."""

    identity: str
    verb: str
    uri: str
    resource: str
    subresource: str
    name: str
    namespace: str
    received: float
    completed: float = 0.0
    code: int = 0

    @property
    def dry_run(self) -> bool:
        """A server-side dry run (nothing stored)."""
        return "dryRun=" in self.uri

    @property
    def kind(self) -> str:
        """``verb resource[/subresource]`` with watches and follows told apart, e.g. ``watch pods``."""
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        verb = self.verb
        if self.subresource == "log" and "follow=true" in self.uri:
            verb = "follow"
        if self.dry_run:
            verb = f"{verb} (dry run)"
        return f"{verb} {what}"


@dataclass
class AuditLog:
    """The bench identities' requests and the TrainJobs' completion times."""

    requests: list[Request] = field(default_factory=list)
    completed: dict[tuple[str, str], tuple[float, str]] = field(default_factory=dict)  # (ns, job) -> (time, Complete|Failed)

    @classmethod
    def read(cls, path: Path) -> AuditLog:
        """Parse the API server's audit log file."""
        with open(path, encoding="utf-8", errors="replace") as f:
            return cls.parse(f)

    @classmethod
    def parse(cls, lines: Iterable[str]) -> AuditLog:
        """Parse audit log lines (JSON, one event each)."""
        by_id: dict[str, Request] = {}
        completed: dict[tuple[str, str], tuple[float, str]] = {}
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a stop of the API server
            user = (event.get("user") or {}).get("username", "")
            ref = event.get("objectRef") or {}
            if user.startswith(USER_PREFIX):
                request = by_id.get(event["auditID"])
                if request is None:
                    request = by_id[event["auditID"]] = Request(
                        identity=user[len(USER_PREFIX) :],
                        verb=event.get("verb", ""),
                        uri=event.get("requestURI", ""),
                        resource=ref.get("resource", ""),
                        subresource=ref.get("subresource", ""),
                        name=ref.get("name", ""),
                        namespace=ref.get("namespace", ""),
                        received=stamp(event["requestReceivedTimestamp"]),
                    )
                if event.get("stage") == "ResponseComplete":
                    request.completed = stamp(event["stageTimestamp"])
                    request.code = int((event.get("responseStatus") or {}).get("code") or 0)
                    request.name = request.name or ref.get("name", "")
            elif ref.get("resource") == "trainjobs" and ref.get("subresource") == "status" and event.get("stage") == "ResponseComplete":
                state = _finished(event.get("responseObject") or {})
                key = (ref.get("namespace", ""), ref.get("name", ""))
                if state and key not in completed:
                    completed[key] = (stamp(event["stageTimestamp"]), state)
        return cls(sorted(by_id.values(), key=lambda r: r.received), completed)

    def of(self, identity: str) -> list[Request]:
        """Requests of one identity, oldest first."""
        return [r for r in self.requests if r.identity == identity]

    def by_identity(self) -> dict[str, list[Request]]:
        """Requests grouped by identity."""
        grouped: dict[str, list[Request]] = defaultdict(list)
        for r in self.requests:
            grouped[r.identity].append(r)
        return grouped

    def created(self, identity: str) -> Request | None:
        """The identity's (first) stored TrainJob create."""
        for r in self.of(identity):
            if r.verb == "create" and r.resource == "trainjobs" and not r.subresource and not r.dry_run and r.code == 201:
                return r
        return None


def _finished(obj: dict[str, Any]) -> str:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return str(condition["type"])
    return ""


def kinds(requests: Iterable[Request]) -> dict[str, int]:
    """How many requests of each kind (``watch pods``: 2), most frequent first."""
    counts: dict[str, int] = defaultdict(int)
    for r in requests:
        counts[r.kind] += 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
