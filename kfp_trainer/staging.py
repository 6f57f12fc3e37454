"""Where a TrainJob reads its input artifacts and writes the trained model. Pure: no I/O.

The ``train_job`` component lets ``command``, ``args`` and ``env`` values name three
places with placeholders:

* ``{dataset}`` -- the ``dataset`` input artifact (a directory);
* ``{model}`` -- the ``model`` input artifact (the model to start from);
* ``{output_model}`` -- the directory the trainer must write the trained model to.

Where they point depends on where the trainer runs:

* **local backend**: the trainer runs on this machine, so the placeholders are the
  artifacts' own paths and the trainer writes straight into the output artifact;
* **cluster**: the TrainJob's pods cannot see the launcher's artifact paths. Both sides
  mount a shared volume -- the KFP pipeline workspace (``/kfp-workspace``, passed through
  to the TrainJob by the ``KUBERNETES_VOLUMES`` task-config passthrough), or any PVC
  mounted on the task with ``kfp.kubernetes.mount_pvc``. The launcher copies the input
  artifacts into ``<shared>/.kfp-trainer/<task>-<digest>/`` before it submits the job, the
  trainer writes to ``.../output-model`` there, and after success the launcher copies that
  into the output artifact, which KFP then uploads to the pipeline root.

Example:
    >>> plan = plan_paths(
    ...     {"args": ["--data", "{dataset}", "--out", "{output_model}"]},
    ...     local=False, artifacts={"dataset": "/minio/b/dataset"}, output_model="/minio/b/out",
    ...     shared_root="/kfp-workspace", key="train-abc")
    >>> plan.values["args"]
    ['--data', '/kfp-workspace/.kfp-trainer/train-abc/dataset', '--out', '/kfp-workspace/.kfp-trainer/train-abc/output-model']
    >>> plan.stage_in
    [('/minio/b/dataset', '/kfp-workspace/.kfp-trainer/train-abc/dataset')]
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ValidationError

NAMES = ("dataset", "model", "output_model")
STAGING_DIR = ".kfp-trainer"
_PLACEHOLDER = re.compile(r"\{(dataset|model|output_model)\}")
_FIELDS = ("command", "args", "env")


@dataclass
class PathPlan:
    """What the launcher does with the artifacts around one TrainJob."""

    values: dict[str, Any]  # command/args/env with placeholders replaced
    paths: dict[str, str] = field(default_factory=dict)  # placeholder name -> trainer-side path
    stage_in: list[tuple[str, str]] = field(default_factory=list)  # (artifact path, shared path) before submit
    stage_out: tuple[str, str] | None = None  # (shared path, output artifact path) after success
    used: set[str] = field(default_factory=set)  # placeholders that appear


def _strings(inputs: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key in _FIELDS:
        value = inputs.get(key)
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, Mapping):
            out.extend(str(v) for v in value.values())
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    out.append(item)
                elif isinstance(item, Mapping) and isinstance(item.get("value"), str):
                    out.append(item["value"])
    return out


def placeholders_used(inputs: Mapping[str, Any]) -> set[str]:
    """Placeholder names that appear in ``command``, ``args`` or ``env`` values.

    Example:
        >>> sorted(placeholders_used({"command": ["train", "{model}"], "env": {"OUT": "{output_model}/x"}}))
        ['model', 'output_model']
    """
    return {m.group(1) for text in _strings(inputs) for m in _PLACEHOLDER.finditer(text)}


def substitute(inputs: Mapping[str, Any], paths: Mapping[str, str]) -> dict[str, Any]:
    """Replace ``{dataset}``, ``{model}`` and ``{output_model}`` in command, args and env values."""

    def sub(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: paths.get(m.group(1), m.group(0)), text)

    out = {k: copy.deepcopy(v) for k, v in inputs.items()}
    for key in _FIELDS:
        value = out.get(key)
        if isinstance(value, str):
            out[key] = sub(value)
        elif isinstance(value, dict):
            out[key] = {k: sub(v) if isinstance(v, str) else v for k, v in value.items()}
        elif isinstance(value, list):
            out[key] = [
                sub(item) if isinstance(item, str)
                else ({**item, "value": sub(item["value"])} if isinstance(item, dict) and isinstance(item.get("value"), str) else item)
                for item in value
            ]
    return out


def plan_paths(
    inputs: Mapping[str, Any],
    *,
    local: bool,
    artifacts: Mapping[str, str | None],
    output_model: str,
    shared_root: str | None,
    key: str,
    shared_artifacts: Mapping[str, str] | None = None,
) -> PathPlan:
    """Decide the trainer-side path of each placeholder and the copies around the job.

    Args:
        inputs: The TrainJob inputs (only ``command``, ``args`` and ``env`` are read).
        local: The trainer runs on this machine (the local backend).
        artifacts: Local paths of the connected input artifacts (``dataset``, ``model``);
            ``None`` or missing when not connected.
        output_model: Local path of the output model artifact.
        shared_root: A directory on a volume mounted both here and in the TrainJob's pods
            (cluster only); ``None`` when there is none.
        key: A name for this job's staging folder, unique per task and inputs.
        shared_artifacts: Input artifacts already on the shared volume (path there), used
            as they are instead of copying.

    Returns:
        The plan.

    Raises:
        ValidationError: A placeholder names an input that is not connected, or (cluster)
            no shared volume is available to carry the files.
    """
    used = placeholders_used(inputs)
    for name in ("dataset", "model"):
        if name in used and not artifacts.get(name):
            raise ValidationError(
                f"{{{name}}}",
                "not connected",
                f"the {name} input connected (e.g. {name}=<task>.outputs[...]) when command/args/env use {{{name}}}",
            )
    plan = PathPlan(values={}, used=used)
    if local:
        plan.paths = {n: str(artifacts[n]) for n in ("dataset", "model") if artifacts.get(n)}
        plan.paths["output_model"] = output_model
    elif used:
        if not shared_root:
            raise ValidationError(
                "workspace_path",
                "",
                "a volume shared by this step and the TrainJob to carry {dataset}/{model}/{output_model}: configure the "
                "pipeline workspace (dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size=...))) and pass "
                "workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, or mount a PVC on the task with kfp.kubernetes.mount_pvc",
            )
        base = f"{shared_root.rstrip('/')}/{STAGING_DIR}/{key}"
        for name in ("dataset", "model"):
            if name in used:
                ready = (shared_artifacts or {}).get(name)
                if ready:
                    plan.paths[name] = ready
                else:
                    plan.paths[name] = f"{base}/{name}"
                    plan.stage_in.append((str(artifacts[name]), plan.paths[name]))
        plan.paths["output_model"] = f"{base}/output-model"
        if "output_model" in used:
            plan.stage_out = (plan.paths["output_model"], output_model)
    plan.values = substitute({k: inputs.get(k) for k in _FIELDS if inputs.get(k) is not None}, plan.paths)
    return plan


def choose_shared_root(workspace_path: str, volume_mounts: list[dict[str, Any]] | None, volumes: list[dict[str, Any]] | None) -> str | None:
    """The shared directory: the workspace if it is a passed-through mount, else the first PVC mount.

    Example:
        >>> choose_shared_root("/kfp-workspace", [{"name": "kfp-workspace", "mountPath": "/kfp-workspace"}],
        ...                    [{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "w"}}])
        '/kfp-workspace'
        >>> choose_shared_root("", [{"name": "data", "mountPath": "/data"}],
        ...                    [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}])
        '/data'
        >>> choose_shared_root("/kfp-workspace", [], []) is None
        True
    """
    from .taskconfig import mount_covering

    mounts = [m for m in volume_mounts or [] if isinstance(m, Mapping)] if isinstance(volume_mounts, list) else []
    if isinstance(workspace_path, str) and workspace_path.startswith("/") and ".." not in workspace_path.split("/"):
        if mount_covering(workspace_path, mounts) is not None:
            return workspace_path.rstrip("/") or "/"
    volumes = volumes if isinstance(volumes, list) else []
    pvcs = {v.get("name") for v in volumes if isinstance(v, Mapping) and v.get("persistentVolumeClaim") and isinstance(v.get("name"), str)}
    for mount in mounts:
        path = mount.get("mountPath")
        named = isinstance(mount.get("name"), str) and mount["name"] in pvcs
        if named and not mount.get("readOnly") and isinstance(path, str) and path.startswith("/") and ".." not in path.split("/"):
            return path.rstrip("/")
    return None
