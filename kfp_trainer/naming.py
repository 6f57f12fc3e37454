"""Deterministic TrainJob names and Kubernetes-safe label values. Pure: no I/O.

A launcher that is retried (``set_retry``), restarted, or re-run by KFP must find the
TrainJob it created before instead of creating a second one, so the name is a function of
the pipeline run, the task, and an optional discriminator (the launcher passes a digest of
the job's inputs, so ``ParallelFor`` iterations with different inputs get different names).

JobSet derives pod names ``<trainjob>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>``
that must fit in 63 characters, so the name budget depends on the runtime's longest
replicated job. :func:`max_name_length` computes it.

Example:
    >>> trainjob_name(run_id="6f1c0d5e-0000-4000-8000-000000000001", task_name="train-job")
    'train-job-zjre4eqprz'
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable

from .errors import ValidationError

RFC1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")  # use fullmatch; \Z also keeps match() whole
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_LABEL_MAX = 63
HASH_LENGTH = 10
RANDOM_SUFFIX = 5  # characters the API server appends to generateName
# Replicated jobs of the runtimes Trainer ships; the longest sets the default budget.
DEFAULT_REPLICATED_JOBS: tuple[tuple[str, int], ...] = (
    ("dataset-initializer", 1),
    ("model-initializer", 1),
    ("node", 16),
    ("launcher", 1),
)


def digest(*parts: str, length: int = HASH_LENGTH) -> str:
    """Lower-case base32 digest of ``parts``: stable across processes and machines."""
    h = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return base64.b32encode(h).decode().lower().rstrip("=")[:length]


def max_name_length(replicated_jobs: Iterable[tuple[str, int]] = DEFAULT_REPLICATED_JOBS) -> int:
    """Longest TrainJob name whose derived pod names stay within 63 characters.

    Args:
        replicated_jobs: ``(name, pods)`` for each replicated job of the runtime, where
            ``pods`` is the number of pods of one Job (``numNodes`` for ``node``).

    Returns:
        The budget, at most 63.

    Example:
        >>> max_name_length([("node", 4)])
        48
    """
    budget = DNS_LABEL_MAX
    for name, pods in replicated_jobs:
        pod_index_digits = len(str(max(pods, 1) - 1))
        # "-" name "-" jobIndex(0) "-" podIndex "-" random
        overhead = 1 + len(name) + 2 + 1 + pod_index_digits + 1 + RANDOM_SUFFIX
        budget = min(budget, DNS_LABEL_MAX - overhead)
    return budget


def sanitize_stem(text: str) -> str:
    """Turn free text (a KFP task name) into the start of an RFC-1035 name."""
    stem = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not stem or not stem[0].isalpha():
        stem = "tj-" + stem if stem else "tj"
    return stem.strip("-")


def trainjob_name(
    *,
    run_id: str,
    task_name: str,
    prefix: str = "",
    discriminator: str = "",
    max_length: int | None = None,
) -> str:
    """Deterministic RFC-1035 name for the TrainJob of one task of one pipeline run.

    Same arguments give the same name (retries adopt); a different run, task or
    discriminator gives a different one.

    Args:
        run_id: The KFP pipeline run (job) id.
        task_name: The KFP task name.
        prefix: Readable start of the name; defaults to the task name.
        discriminator: Extra input that tells apart tasks sharing run and name
            (for example ``ParallelFor`` iterations); the launcher passes a digest of the
            job's inputs.
        max_length: Name budget; defaults to :func:`max_name_length` of Trainer's runtimes.

    Raises:
        ValidationError: ``prefix`` is not an RFC-1035 label or leaves no room for the hash.
    """
    budget = max_name_length() if max_length is None else max_length
    if prefix:
        if not isinstance(prefix, str) or not RFC1035.fullmatch(prefix):
            raise ValidationError(
                "name_prefix",
                prefix,
                "lower-case letters, digits and '-', starting with a letter and ending with a letter or digit (RFC 1035)",
            )
        if len(prefix) > budget - HASH_LENGTH - 1:
            raise ValidationError(
                "name_prefix",
                prefix,
                f"at most {budget - HASH_LENGTH - 1} characters (the name budget is {budget} so that JobSet's pod names fit in 63)",
            )
        stem = prefix
    else:
        stem = sanitize_stem(task_name)[: budget - HASH_LENGTH - 1].rstrip("-")
    return f"{stem}-{digest(run_id, task_name, discriminator)}"


def check_name(name: str, max_length: int) -> str:
    """Validate a user-given TrainJob name against RFC 1035 and the pod-name budget."""
    if not isinstance(name, str) or not RFC1035.fullmatch(name):
        raise ValidationError("name", name, "an RFC-1035 label: lower-case letters, digits and '-', starting with a letter")
    if len(name) > max_length:
        raise ValidationError(
            "name",
            name,
            f"at most {max_length} characters, so that the pod names JobSet derives (<name>-<replicatedJob>-0-0-xxxxx) fit in 63",
        )
    return name


def label_value(text: object) -> str:
    """Make ``text`` a valid label value (<= 63 chars), keeping it recognisable.

    Example:
        >>> label_value("Train Job #1")
        'Train-Job-1'
    """
    text = str(text)
    if _LABEL_VALUE.fullmatch(text) and len(text) <= DNS_LABEL_MAX:
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
    if len(cleaned) > DNS_LABEL_MAX:
        cleaned = cleaned[: DNS_LABEL_MAX - HASH_LENGTH - 1].rstrip("-_.") + "-" + digest(text)
    return cleaned
