"""What a rendered TrainJob may contain, checked after the ``patch`` is merged. Pure: no I/O.

The ``patch`` input is an expert's escape hatch: a merge patch applied to the rendered
TrainJob. It cannot be trusted more than any other input, so the merged manifest is checked
again as a whole, and the launcher's own fields are compared with what it rendered:

* **fixed by the launcher**: ``apiVersion``, ``kind``, ``metadata.name`` and ``.namespace``
  (use the ``name``/``namespace`` inputs), the lineage labels and annotations under
  ``kfp-trainer.kubeflow.org/`` and ``app.kubernetes.io/managed-by`` (they tie the job to its
  run and task: adoption, replacement and garbage collection rely on them),
  ``spec.runtimeRef`` (use ``runtime``/``runtime_kind``), ``spec.managedBy`` (use
  ``managed_by``), and no ``finalizers``,
  ``ownerReferences`` or other metadata;
* **checked like the inputs**: node counts, processes per node, env (reserved names,
  credentials as literal values anywhere), initializer URIs, labels, annotations, images,
  deadlines, and every string for control characters and credentials;
* **host access** -- ``hostPath`` volumes, ``privileged`` or ``allowPrivilegeEscalation``
  containers, added capabilities, ``hostNetwork``/``hostPID``/``hostIPC``, host ports,
  bidirectional mount propagation, an unmasked ``/proc``, ``Unconfined`` seccomp or AppArmor
  profiles, Windows host processes, SELinux users, roles or non-container types and unsafe
  sysctls (what the PodSecurity *baseline* level forbids, :mod:`~kfp_trainer.spec.host_access`) -- is
  refused unless the cluster admin allows it on the
  ClusterTrainingRuntime (annotation ``kfp-trainer.kubeflow.org/allow-host-access: "true"``;
  a namespaced TrainingRuntime cannot grant it, as namespace users may create those);
* **size**: at most 512 KiB in all, 256 KiB of annotations per object, 128 KiB per value,
  so the API server, etcd and the pods the controllers copy it into all accept it.

Errors name the field as ``patch.<path>`` where the patch changed it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..dicts import dig
from ..errors import ValidationError
from ..numbers import int_in
from ..redaction import HIDDEN
from . import env_rules, rules
from .host_access import HOST_ADMIN, host_settings
from .inputs import (
    INITIALIZER_JOBS,
    INT64_MAX,
    LABEL_MANAGED_BY,
    LABEL_PREFIX,
    MANAGERS,
    MAX_ANNOTATIONS_BYTES,
    MAX_DEPTH,
    MAX_MANIFEST_BYTES,
    MAX_NODES,
    MAX_PROC_PER_NODE,
    RESERVED_ENV_PREFIXES,
    TRAINER_CONTROLLER,
)

Path = tuple[Any, ...]
_SPEC_KEYS = {
    "v2.2": {"activeDeadlineSeconds", "initializer", "managedBy", "runtimePatches", "runtimeRef", "suspend", "trainer"},
    "v2.1": {"annotations", "initializer", "labels", "managedBy", "podTemplateOverrides", "runtimeRef", "suspend", "trainer"},
}


def fmt(path: Path) -> str:
    """``("spec", "trainer", "env", 0)`` -> ``spec.trainer.env[0]``."""
    out = ""
    for key in path:
        out = rules.key_path(out, key)
    return out


_ABSENT = object()


class _Checker:
    def __init__(
        self, manifest: dict[str, Any], base: dict[str, Any], api_version: str | None, allow_host_access: bool | None, local: bool
    ):
        self.manifest, self.base = manifest, base
        self.api_version, self.allow_host_access, self.local = api_version, allow_host_access, local
        self.errors: list[ValidationError] = []
        self.checked_env: set[Path] = set()

    def name(self, path: Path) -> str:
        return ("patch." if dig(self.manifest, *path, default=_ABSENT) != dig(self.base, *path, default=_ABSENT) else "") + fmt(path)

    def add(self, path: Path, value: Any, allowed: str) -> None:
        self.errors.append(ValidationError(self.name(path), value, allowed))

    def fixed(self, path: Path, how: str) -> None:
        """The launcher's value at ``path`` must survive the patch unchanged."""
        now, was = dig(self.manifest, *path, default=_ABSENT), dig(self.base, *path, default=_ABSENT)
        if now != was:
            self.add(path, None if now is _ABSENT else now, f"unchanged ({'absent' if was is _ABSENT else repr(was)}): {how}")

    # ------------------------------------------------------------------ launcher-owned fields
    def check_identity(self) -> None:
        m = self.manifest
        for key in set(m) - {"apiVersion", "kind", "metadata", "spec"}:
            self.add((key,), m[key], "only apiVersion, kind, metadata and spec")
        self.fixed(("apiVersion",), "set by the launcher")
        self.fixed(("kind",), "set by the launcher")
        meta = m.get("metadata")
        if not isinstance(meta, dict):
            return self.add(("metadata",), meta, "a map")
        for key in set(meta) - {"name", "namespace", "labels", "annotations"}:
            self.add(
                ("metadata", key),
                meta[key],
                "no such metadata: only labels and annotations may be patched (no finalizers, ownerReferences, ...)",
            )
        self.fixed(("metadata", "name"), "set it with the name or name_prefix input")
        self.fixed(("metadata", "namespace"), "set it with the namespace input")
        for field, label_values in (("labels", True), ("annotations", False)):
            values = meta.get(field, {})
            if not isinstance(values, dict):
                self.add(("metadata", field), values, "a map")
                continue
            base_values = dig(self.base, "metadata", field, default=_ABSENT)
            for key in set(values) | set(base_values if isinstance(base_values, dict) else {}):
                if isinstance(key, str) and (key.startswith(LABEL_PREFIX) or key == LABEL_MANAGED_BY):
                    self.fixed(("metadata", field, key), "the launcher's lineage (adoption and clean-up rely on it)")
            self.errors += rules.check_map(self.name(("metadata", field)), values, label_values=label_values)

    def check_spec(self) -> None:
        spec = self.manifest.get("spec")
        if not isinstance(spec, dict):
            return self.add(("spec",), spec, "a map")
        allowed = _SPEC_KEYS.get(self.api_version or "", _SPEC_KEYS["v2.1"] | _SPEC_KEYS["v2.2"])
        for key in sorted(set(spec) - allowed, key=str):
            if key == "podTemplateOverrides":
                self.add(("spec", key), "...", "runtimePatches (podTemplateOverrides was removed in Trainer v2.2)")
            else:
                self.add(
                    ("spec", key), "...", f"a TrainJob {self.api_version or ''} spec field: {', '.join(sorted(allowed))}".replace("  ", " ")
                )
        self.fixed(("spec", "runtimeRef"), "set it with the runtime and runtime_kind inputs")
        managed, rendered = spec.get("managedBy") or TRAINER_CONTROLLER, dig(self.base, "spec", "managedBy", default=_ABSENT)
        if managed != (TRAINER_CONTROLLER if rendered in (_ABSENT, None, "") else rendered):
            want = rendered if isinstance(rendered, str) else "unset"
            self.add(("spec", "managedBy"), managed, f"{want}: set it with the managed_by input")
        elif managed not in MANAGERS:
            self.add(("spec", "managedBy"), managed, f"unset, {' or '.join(MANAGERS)}")
        if "suspend" in spec and not isinstance(spec["suspend"], bool):
            self.add(("spec", "suspend"), spec["suspend"], "true or false")
        if "activeDeadlineSeconds" in spec and not int_in(spec["activeDeadlineSeconds"], 1, INT64_MAX):
            self.add(("spec", "activeDeadlineSeconds"), spec["activeDeadlineSeconds"], "an integer >= 1")
        self.check_trainer(spec.get("trainer", {}))
        self.check_initializer(spec.get("initializer", {}))
        self.check_runtime_patches(spec.get("runtimePatches", []))
        self.check_pod_template_overrides(spec.get("podTemplateOverrides", []))

    def check_trainer(self, trainer: Any) -> None:
        at = ("spec", "trainer")
        if not isinstance(trainer, dict):
            return self.add(at, trainer, "a map")
        if "numNodes" in trainer and not int_in(trainer["numNodes"], 1, MAX_NODES):
            self.add((*at, "numNodes"), trainer["numNodes"], f"an integer from 1 to {MAX_NODES}")
        if "numProcPerNode" in trainer:
            ppn = trainer["numProcPerNode"]
            words = ("auto", "cpu", "gpu") if self.api_version in ("v2.1", None) else ()
            if not (int_in(ppn, 1, MAX_PROC_PER_NODE) or ppn in words):
                self.add(
                    (*at, "numProcPerNode"), ppn, f"an integer from 1 to {MAX_PROC_PER_NODE}" + (" or auto, cpu, gpu" if words else "")
                )
        if "image" in trainer and not rules.ok(rules.IMAGE, trainer["image"], 500):
            self.add((*at, "image"), trainer["image"], "an image reference, <= 500 characters")
        for key in ("command", "args"):
            if key in trainer:
                items = trainer[key]
                if not isinstance(items, list):
                    self.add((*at, key), items, "a list of strings")
                else:
                    self.errors += rules.check_args(self.name((*at, key)), items)
        if "env" in trainer:
            self.checked_env.add((*at, "env"))
            self.errors += env_rules.check_env(self.name((*at, "env")), trainer["env"], reserved=RESERVED_ENV_PREFIXES, file_refs=False)
        if "resourcesPerNode" in trainer:
            self.errors += rules.check_resources(self.name((*at, "resourcesPerNode")), trainer["resourcesPerNode"])

    def check_initializer(self, initializer: Any) -> None:
        at = ("spec", "initializer")
        if not isinstance(initializer, dict):
            return self.add(at, initializer, "a map")
        for kind, schemes in (("dataset", ("hf", "s3", "cache")), ("model", ("hf", "s3"))):
            item = initializer.get(kind)
            if item is None:
                continue
            if not isinstance(item, dict):
                self.add((*at, kind), item, "a map")
                continue
            allowed = schemes + (("builtin", "file") if self.local else ())
            if "storageUri" in item:
                self.errors += rules.check_uri(self.name((*at, kind, "storageUri")), item["storageUri"], allowed)
            if "env" in item:
                self.checked_env.add((*at, kind, "env"))
                self.errors += env_rules.check_env(self.name((*at, kind, "env")), item["env"], file_refs=False)
            ref = item.get("secretRef")
            if ref is not None and not (isinstance(ref, dict) and rules.ok(rules.DNS_SUBDOMAIN, ref.get("name"), 253)):
                self.add((*at, kind, "secretRef"), ref, "{name: <Secret name>}")

    def check_runtime_patches(self, patches: Any) -> None:
        if not isinstance(patches, list):
            return self.add(("spec", "runtimePatches"), patches, "a list")
        for i, patch in enumerate(patches):
            jobs = dig(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", default=_ABSENT)
            for j, job in enumerate(jobs if isinstance(jobs, list) else []):
                containers = dig(job, "template", "spec", "template", "spec", "containers", default=_ABSENT)
                for k, container in enumerate(containers if isinstance(containers, list) else []):
                    if isinstance(container, dict) and container.get("name") in ("node", *INITIALIZER_JOBS) and container.get("env"):
                        path = ("spec", "runtimePatches", i, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", j,
                                "template", "spec", "template", "spec", "containers", k, "env")  # fmt: skip
                        self.add(path, "...", "no env patch on the node or initializer containers (the Trainer webhook "
                                 "rejects it): use env, dataset_env or model_env")  # fmt: skip

    def check_pod_template_overrides(self, overrides: Any) -> None:
        """Trainer v2.1's webhook refuses env on these containers in podTemplateOverrides too."""
        if not isinstance(overrides, list):
            return self.add(("spec", "podTemplateOverrides"), overrides, "a list")
        for i, override in enumerate(overrides):
            containers = dig(override, "spec", "containers")
            for k, container in enumerate(containers if isinstance(containers, list) else []):
                if isinstance(container, dict) and container.get("name") in ("node", *INITIALIZER_JOBS) and container.get("env"):
                    self.add(("spec", "podTemplateOverrides", i, "spec", "containers", k, "env"), "...",
                             "no env override on the node or initializer containers (the Trainer webhook rejects it): "
                             "use env, dataset_env or model_env")  # fmt: skip

    # ------------------------------------------------------------------ everywhere
    def walk(self, path: Path, value: Any) -> None:
        if len(path) > MAX_DEPTH:
            return self.add(path, "...", f"values nested at most {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            self.check_host_access(path, value)
            for key, sub in value.items():
                if not isinstance(key, str) or rules.CONTROL.search(key):
                    self.add(path, key, "text keys without control characters")
                    continue
                if key == "env" and isinstance(sub, list) and (*path, key) not in self.checked_env:
                    self.errors += env_rules.check_env(self.name((*path, key)), sub)
                    continue
                self.walk((*path, key), sub)
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                self.walk((*path, i), sub)
        elif isinstance(value, str):
            found = rules.check_text(self.name(path), value)
            self.errors += found or rules.check_secret_text(self.name(path), value)
        elif isinstance(value, float) and not math.isfinite(value):
            self.add(path, value, "a finite number")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
            self.add(path, value, "a number within 64 bits")
        elif not isinstance(value, (bool, int, float, type(None))):
            self.add(path, type(value).__name__, "a JSON value: map, list, string, number, boolean or null")

    def check_host_access(self, path: Path, obj: dict[str, Any]) -> None:
        if self.allow_host_access is not False:  # allowed, or not known yet (render decides)
            return
        for where, value in host_settings(obj):
            self.add((*path, *where), value, "unset: " + HOST_ADMIN)

    def check_sizes(self) -> None:
        total = _json_size(self.manifest)
        if total > MAX_MANIFEST_BYTES:
            path, size = _largest(self.manifest)
            self.add(
                path,
                f"{rules.size_text(size)} of {rules.size_text(total)}",
                f"a TrainJob of at most {rules.size_text(MAX_MANIFEST_BYTES)} in all (the API server, etcd and the JobSet, "
                "Jobs and pods the controllers copy it into refuse larger objects): move large content to a volume or ConfigMap",
            )
        for path in _metadata_paths(self.manifest):
            annotations = dig(self.manifest, *path, "annotations", default=_ABSENT)
            if isinstance(annotations, dict):
                size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
                if size > MAX_ANNOTATIONS_BYTES:
                    self.add(
                        (*path, "annotations"),
                        rules.size_text(size),
                        f"annotations of at most {rules.size_text(MAX_ANNOTATIONS_BYTES)} in all",
                    )


def _json_size(value: Any) -> int:
    return len(json.dumps(value, default=str, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _largest(value: Any, path: Path = ()) -> tuple[Path, int]:
    """The path of the largest string (or other leaf) in ``value``, and its size."""
    if isinstance(value, dict):
        found = [_largest(v, (*path, k)) for k, v in value.items()]
    elif isinstance(value, list):
        found = [_largest(v, (*path, i)) for i, v in enumerate(value)]
    else:
        return path, _json_size(value)
    return max(found, key=lambda pair: pair[1], default=(path, 0))


def _metadata_paths(manifest: dict[str, Any]) -> list[Path]:
    paths: list[Path] = [("metadata",)]
    template = ("spec", "runtimePatches")
    patches = dig(manifest, *template)
    for i, patch in enumerate(patches if isinstance(patches, list) else []):
        paths.append((*template, i, "trainingRuntimeSpec", "template", "metadata"))
        jobs = dig(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", default=_ABSENT)
        for j, _ in enumerate(jobs if isinstance(jobs, list) else []):
            paths.append(
                (*template, i, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", j, "template", "spec", "template", "metadata")
            )
    return paths


def check_manifest(
    manifest: dict[str, Any],
    *,
    base: dict[str, Any],
    api_version: str | None,
    allow_host_access: bool | None = False,
    local: bool = False,
) -> list[ValidationError]:
    """Every problem of the merged ``manifest`` (``base``: the same job rendered without the patch).

    ``api_version=None`` leaves out the checks that depend on the Trainer version, and
    ``allow_host_access=None`` the host-access checks (both unknown before the runtime is read).

    Example:
        >>> base = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"},
        ...         "spec": {"runtimeRef": {"name": "torch-distributed"}}}
        >>> patched = {**base, "spec": {**base["spec"], "trainer": {"numNodes": 1000000}}}
        >>> [str(e) for e in check_manifest(patched, base=base, api_version="v2.2")]
        ['patch.spec.trainer.numNodes: got 1000000; expected an integer from 1 to 1024']
    """
    checker = _Checker(manifest, base, api_version, allow_host_access, local)
    checker.check_identity()
    checker.check_spec()
    checker.walk((), manifest)
    checker.check_sizes()
    seen: set[str] = set()
    unique = []
    for error in checker.errors:
        if error.field not in seen:
            seen.add(error.field)
            unique.append(error)
    return unique


__all__ = ["HIDDEN", "check_manifest", "fmt"]
