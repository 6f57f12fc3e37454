"""Error classes: who caused it, and whether trying again can help.

Two families, chosen once where an error is raised and never guessed later:

* :class:`UserError` -- bad input, missing runtime, forbidden, a job that failed on its
  own terms. Retrying cannot help; the message says what to change.
* :class:`InfraError` -- the API server was unreachable, timed out or answered 5xx/429.
  Retried with backoff inside the launcher; raised only once retries are exhausted.

Each class carries an ``exit_code`` so the command line and the KFP component exit with a
code that tells the two apart (KFP shows the code on the failed step).

Example:
    >>> try:
    ...     raise ValidationError("trainer.num_nodes", 0, "an integer >= 1")
    ... except UserError as e:
    ...     print(e)
    trainer.num_nodes: got 0; expected an integer >= 1
"""

from __future__ import annotations

from typing import Any

from .redaction import shown_value

EXIT_USER = 2
EXIT_JOB_FAILED = 1
EXIT_INFRA = 3
EXIT_CANCELLED = 130
# A closed stdout (``kfp-trainer render | head -1``) ends a command with 128 + SIGPIPE: the status a shell
# reports there for git, kubectl and coreutils (they die of the signal), so a script under
# ``set -o pipefail`` sees every tool alike, and a cut-off output is never reported as done.
EXIT_READER_GONE = 141


class KfpTrainerError(Exception):
    """Base class of every error this package raises on purpose.

    ``answer`` is the API server's refusal behind it (a
    :class:`~kfp_trainer.backends.kube.apierrors.APIError`: status, reason, message, details),
    when one is; callers branch on its fields, not on this error's text.
    """

    exit_code = EXIT_USER
    answer: Any = None


class UserError(KfpTrainerError, ValueError):
    """The input or the cluster's answer means retrying will not help."""

    exit_code = EXIT_USER


class ValidationError(UserError):
    """One input is invalid. Names the field, the value (secret-like values hidden) and what is allowed."""

    def __init__(self, field: str, value: Any, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        shown = repr(shown_value(field, value))  # never a secret-like value in a message
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"{field}: got {shown}; expected {allowed}")


class InvalidSpecErrors(UserError):
    """Several validation errors found at once, reported together."""

    def __init__(self, errors: list[ValidationError]) -> None:
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"{len(errors)} invalid input(s):\n{lines}")


class RuntimeNotFoundError(UserError):
    """The TrainJob names a runtime the cluster does not have."""


class OwnershipError(UserError):
    """A TrainJob with the wanted name exists and belongs to another run or task."""


class ForbiddenError(UserError):
    """The service account is not allowed to do what was asked (HTTP 403)."""


class CredentialsError(UserError):
    """The cluster's credentials cannot be read or used (a kubeconfig, a pod's service account)."""


class RejectedError(UserError):
    """The API server refused the object as invalid (HTTP 422/400)."""


class JobFailedError(UserError):
    """The TrainJob ran and ended Failed. Carries the diagnosis for the step's log."""

    exit_code = EXIT_JOB_FAILED

    def __init__(self, message: str, *, reason: str = "", diagnosis: str = "") -> None:
        self.reason = reason
        self.diagnosis = diagnosis
        super().__init__(message + (f"\n\n{diagnosis}" if diagnosis else ""))


class CannotStartError(JobFailedError):
    """The TrainJob could not start: resources not created, unschedulable, image errors."""


class TimeLimitError(JobFailedError):
    """A launcher time limit (start or run) passed; the TrainJob was deleted."""


class CancelledError(KfpTrainerError):
    """The launcher got SIGTERM/SIGINT (a KFP cancel); the TrainJob was deleted."""

    exit_code = EXIT_CANCELLED


class InfraError(KfpTrainerError):
    """A transient failure of the cluster or the network; worth retrying."""

    exit_code = EXIT_INFRA


class DeletionTimeoutError(InfraError):
    """A TrainJob that had to go first (an earlier try's) was still there when waiting ended."""


class ClusterUnreachableError(KfpTrainerError):
    """No cluster is configured, or its API server cannot be reached (DNS, refused, TLS, timeout).

    Raised by the command line's first contact, which is not retried: a person waits for it.
    """

    exit_code = EXIT_INFRA
