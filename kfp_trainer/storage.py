"""Fetch a dataset or model into a directory from ``builtin://``, local paths, ``hf://`` or ``s3://``.

Used by the dataset and model initializer components (and usable on its own):

* ``builtin://datasets/<name>``, ``builtin://models/<name>``: generated offline
  (:mod:`kfp_trainer.trainers.builtin`);
* ``file:///abs/path``, ``/abs/path`` or ``relative/path`` (e.g. on the KFP workspace at
  ``/kfp-workspace/...``): copied;
* ``hf://<org>/<name>[@<revision>]``: Hugging Face Hub snapshot (``huggingface_hub``);
  the token comes from ``HF_TOKEN`` or ``ACCESS_TOKEN`` in the environment;
* ``s3://<bucket>/<prefix>``: every object under the prefix (``boto3``); endpoint and
  keys come from the environment (``AWS_ENDPOINT_URL`` or ``ENDPOINT``,
  ``AWS_ACCESS_KEY_ID`` or ``ACCESS_KEY_ID``, ...), e.g. set from a Kubernetes Secret
  with ``kfp.kubernetes.use_secret_as_env``.

Credentials are read from the environment only and never printed or stored in metadata.

Example:
    >>> import tempfile
    >>> info = fetch("builtin://datasets/addition", tempfile.mkdtemp(), kind="dataset")  # doctest: +SKIP
    >>> info["files"]  # doctest: +SKIP
    2
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .errors import UserError
from .redaction import redact_text

SCHEMES = ("builtin", "file", "hf", "s3")
HF_ENDPOINT = "https://huggingface.co"
_CREDENTIAL_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
_HF_PART = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_HF_REVISION = re.compile(r"(?!.*(?:^|/)\.\.?(?:/|$))[A-Za-z0-9._/-]{1,255}")


class StorageError(UserError):
    """A source URI cannot be fetched: bad URI, missing package, unreachable or offline."""


def scheme_of(uri: str) -> str:
    """The URI's scheme, ``file`` for plain paths.

    Example:
        >>> scheme_of("hf://Qwen/Qwen2.5-0.5B"), scheme_of("/kfp-workspace/data"), scheme_of("S3://b/k")
        ('hf', 'file', 's3')
    """
    if "://" not in uri:
        return "file"
    return uri.split("://", 1)[0].lower()


def redact(uri: str) -> str:
    """The URI without any user:password part, for logs and metadata (see :mod:`kfp_trainer.redaction`).

    Example:
        >>> redact("s3://key:secret@bucket/data")
        's3://***@bucket/data'
    """
    return redact_text(uri)


def _first_env(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if env.get(name):
            return env[name]
    return None


def _stats(dest: Path) -> tuple[int, int]:
    files = [p for p in dest.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def fetch(
    uri: str,
    dest: str | Path,
    *,
    kind: str = "dataset",
    env: Mapping[str, str] | None = None,
    ignore_patterns: list[str] | None = None,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Fetch ``uri`` into directory ``dest``.

    Args:
        uri: Source, see the module docstring.
        dest: Directory to fill (created).
        kind: ``dataset`` or ``model`` (picks the Hub repo type and builtin kind).
        env: Environment to read credentials and endpoints from (default ``os.environ``).
        ignore_patterns: Glob patterns of files to skip (``hf://`` and ``s3://``).
        timeout: Seconds to wait when probing a remote endpoint.

    Returns:
        Metadata for the artifact: ``source_uri`` (redacted), ``scheme``, ``files``, ``bytes``.

    Raises:
        StorageError: The URI is malformed, its scheme unsupported, a package is missing,
            the source does not exist or cannot be reached.
    """
    env = os.environ if env is None else env
    target = Path(dest)
    target.mkdir(parents=True, exist_ok=True)
    scheme = scheme_of(uri)
    if scheme == "builtin":
        _fetch_builtin(uri, target, kind)
    elif scheme == "file":
        _fetch_path(uri, target)
    elif scheme == "hf":
        _fetch_hf(uri, target, kind, env, ignore_patterns, timeout)
    elif scheme == "s3":
        _fetch_s3(uri, target, env, ignore_patterns)
    else:
        raise StorageError(f"{redact(uri)}: unsupported scheme {scheme!r}; use one of " + ", ".join(f"{s}://" for s in SCHEMES))
    files, size = _stats(target)
    if files == 0:
        raise StorageError(f"{redact(uri)}: nothing was fetched (no files)")
    return {"source_uri": redact(uri), "scheme": scheme, "files": files, "bytes": size}


def _fetch_builtin(uri: str, dest: Path, kind: str) -> None:
    from .trainers import builtin

    try:
        found, _ = builtin.parse_uri(uri)
    except ValueError as e:
        raise StorageError(str(e)) from None
    if found.rstrip("s") != kind:
        raise StorageError(f"{uri} is a {found.rstrip('s')}, not a {kind}")
    builtin.materialize(uri, dest)


def _fetch_path(uri: str, dest: Path) -> None:
    path = Path(urlparse(uri).path if uri.lower().startswith("file://") else uri)
    if not path.exists():
        raise StorageError(f"{uri}: no such file or directory on this machine")
    if path.resolve() == dest.resolve():
        return
    if path.is_dir():
        shutil.copytree(path, dest, dirs_exist_ok=True, symlinks=False)
    else:
        shutil.copy2(path, dest / path.name)


def _reachable(url: str, timeout: float) -> bool:
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except OSError:
        return False


def parse_hf(uri: str) -> tuple[str, str | None]:
    """``hf://org/name@rev`` -> (``org/name``, ``rev``).

    Example:
        >>> parse_hf("hf://Qwen/Qwen2.5-0.5B@main")
        ('Qwen/Qwen2.5-0.5B', 'main')
    """
    rest = uri.split("://", 1)[1].strip("/")
    repo, _, revision = rest.partition("@")
    parts = repo.split("/")
    if not 1 <= len(parts) <= 2 or not all(_HF_PART.fullmatch(p) for p in parts) or (revision and not _HF_REVISION.fullmatch(revision)):
        raise StorageError(f"{redact(uri)}: expected hf://<org>/<name>[@<revision>] (letters, digits, '.', '_', '-'; no '..')")
    return repo, revision or None


def _fetch_hf(uri: str, dest: Path, kind: str, env: Mapping[str, str], ignore: list[str] | None, timeout: float) -> None:
    repo, revision = parse_hf(uri)
    endpoint = env.get("HF_ENDPOINT") or HF_ENDPOINT
    if str(env.get("HF_HUB_OFFLINE", "")).lower() in ("1", "true", "yes"):
        raise StorageError(f"{uri}: HF_HUB_OFFLINE is set; this step cannot download from the Hugging Face Hub")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise StorageError(f"{uri}: downloading from the Hugging Face Hub needs the 'huggingface_hub' package") from None
    if not _reachable(endpoint, timeout):
        raise StorageError(
            f"{uri}: cannot reach {endpoint} (no network, or a proxy is needed). This machine looks offline: "
            "use a builtin:// or local source, or pre-fetch the files to a path on the workspace"
        )
    token = _first_env(env, "HF_TOKEN", "ACCESS_TOKEN")
    try:
        snapshot_download(
            repo_id=repo,
            repo_type="dataset" if kind == "dataset" else "model",
            revision=revision,
            local_dir=str(dest),
            token=token,
            ignore_patterns=ignore or None,
        )
    except Exception as e:  # the hub client raises many types; keep the message, drop the token
        raise StorageError(f"{uri}: download failed: {type(e).__name__}: {_scrub(str(e), token)}") from None
    # The client's download bookkeeping is not part of the dataset or model.
    shutil.rmtree(dest / ".cache" / "huggingface", ignore_errors=True)
    if (dest / ".cache").is_dir() and not any((dest / ".cache").iterdir()):
        (dest / ".cache").rmdir()


def _scrub(text: str, *secrets: str | None) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _fetch_s3(uri: str, dest: Path, env: Mapping[str, str], ignore: list[str] | None) -> None:
    parsed = urlparse(uri)
    bucket, prefix = parsed.hostname or "", parsed.path.lstrip("/")
    if not bucket:
        raise StorageError(f"{redact(uri)}: expected s3://<bucket>/<prefix>")
    try:
        import boto3
    except ImportError:
        raise StorageError(f"{redact(uri)}: reading from S3 needs the 'boto3' package") from None
    key_id = _first_env(env, "AWS_ACCESS_KEY_ID", "ACCESS_KEY_ID")
    secret = _first_env(env, "AWS_SECRET_ACCESS_KEY", "SECRET_ACCESS_KEY")
    client = boto3.client(
        "s3",
        endpoint_url=_first_env(env, "AWS_ENDPOINT_URL", "ENDPOINT", "S3_ENDPOINT"),
        region_name=_first_env(env, "AWS_REGION", "REGION", "AWS_DEFAULT_REGION"),
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
    )
    import fnmatch

    count = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                rel = s3_relative_key(key, prefix)
                if not rel or any(fnmatch.fnmatch(rel, p) for p in ignore or []):
                    continue
                target = safe_join(dest, rel)
                if target is None:
                    raise StorageError(f"{redact(uri)}: object key {key!r} would be written outside {dest}; refusing to fetch")
                target.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, key, str(target))
                count += 1
    except StorageError:
        raise
    except Exception as e:  # botocore errors vary; never echo credentials
        raise StorageError(f"{redact(uri)}: download failed: {type(e).__name__}: {_scrub(str(e), key_id, secret)}") from None
    if count == 0:
        raise StorageError(f"{redact(uri)}: no objects under that prefix")


def s3_relative_key(key: str, prefix: str) -> str | None:
    """Where object ``key`` goes under the destination when fetching ``prefix``; ``None`` to skip it.

    The prefix names a "folder" (``data`` means ``data/...``, never ``data-private/...``)
    or exactly one object.

    Example:
        >>> s3_relative_key("data/train.jsonl", "data"), s3_relative_key("data-private/x", "data")
        ('train.jsonl', None)
        >>> s3_relative_key("data/model.bin", "data/model.bin"), s3_relative_key("a/b/", "a")
        ('model.bin', None)
    """
    if key.endswith("/"):
        return None  # a "folder" placeholder object
    if not prefix:
        return key
    if key == prefix:
        return key.rsplit("/", 1)[-1]
    folder = prefix if prefix.endswith("/") else prefix + "/"
    return key[len(folder) :] if key.startswith(folder) else None


def safe_join(root: str | Path, rel: str) -> Path | None:
    """``root / rel``, or ``None`` when ``rel`` is absolute or its ``..`` would leave ``root``.

    Example:
        >>> safe_join("/dest", "a/b.txt"), safe_join("/dest", "../../etc/passwd"), safe_join("/dest", "/etc/passwd")
        (PosixPath('/dest/a/b.txt'), None, None)
    """
    parts = rel.replace("\\", "/").split("/")
    if not rel or rel.startswith("/") or any(p in ("..", ".") for p in parts) or "\0" in rel:
        return None
    base = Path(root).resolve()
    target = (base / "/".join(p for p in parts if p)).resolve()
    return target if target == base or base in target.parents else None


def safe_env_names(env: Mapping[str, str]) -> list[str]:
    """Names of credential-like variables present (for a log line that shows no values).

    Example:
        >>> safe_env_names({"HF_TOKEN": "x", "PATH": "/bin"})
        ['HF_TOKEN']
    """
    return sorted(k for k in env if any(m in k.upper() for m in _CREDENTIAL_MARKERS))
