"""What is left of a deleted TrainJob (its JobSet, Jobs, pods), and how to remove it. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from ...jobstatus import JobRef

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


@dataclass(frozen=True)
class Leftover:
    """Something of a deleted TrainJob still there when waiting ended."""

    kind: str
    name: str
    terminating: bool

    def __str__(self) -> str:
        return f"{self.kind} {self.name}" + (" (terminating)" if self.terminating else "")


def leftovers_message(ref: JobRef, left: list[Leftover], waited: float) -> str:
    """What is left of a deleted TrainJob, and how to remove it."""
    pods = [x for x in left if x.kind == "Pod"]
    lines = [f"after deleting TrainJob {ref}, still present after {waited:.0f}s: " + ", ".join(map(str, left))]
    if any(x.kind == "TrainJob" for x in left):
        lines.append(f"  look at its finalizers: kubectl get trainjob -n {ref.namespace} {ref.name} -o jsonpath='{{.metadata.finalizers}}'")
    if pods and all(x.terminating for x in pods) and len(pods) == len(left):
        lines.append("  the pods were told to stop and go once their grace period ends")
    lines.append(f"  remove them now: kubectl delete jobset,job,pod -n {ref.namespace} -l {JOBSET_LABEL}={ref.name} --wait=false")
    return "\n".join(lines)
