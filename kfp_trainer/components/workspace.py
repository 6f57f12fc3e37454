"""A pipeline workspace that a KFP backend accepts and a TrainJob's pods can share.

The KFP backend (2.15+) creates the workspace PVC per run and refuses to compile a run
whose PVC spec has no ``accessModes`` (unless its admin set a default), or whose
``storageClassName`` is ``""``; 2.15 and 2.16 also want a storage class named unless
the admin's default names one. The TrainJob's trainer pods mount the same claim, from
several nodes at once when ``num_nodes > 1``: ``ReadWriteMany``.

Example:
    >>> config = workspace_config("10Gi")
    >>> config.workspace.get_workspace()["kubernetes"]["pvcSpecPatch"]
    {'accessModes': ['ReadWriteMany']}
"""

from __future__ import annotations

from collections.abc import Sequence

from kfp import dsl

ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def workspace_config(
    size: str, *, access_modes: str | Sequence[str] = ("ReadWriteMany",), storage_class: str | None = None
) -> dsl.PipelineConfig:
    """``dsl.PipelineConfig`` with a workspace whose PVC spec the KFP backend accepts.

    Args:
        size: Size of the per-run workspace PVC, e.g. ``"10Gi"``.
        access_modes: PVC access mode(s), one as a string or several in a list;
            ``ReadWriteMany`` (the default) lets trainer pods on several nodes mount it with
            the pipeline's steps.
        storage_class: Storage class of the PVC (one that supports the access modes); the
            cluster's default class when unset. ``kfp-trainer compile --storage-class``
            sets it in compiled YAML.

    Raises:
        ValueError: An empty size or storage class, or an unknown access mode.
    """
    if not size or not str(size).strip():
        raise ValueError("workspace size: give a Kubernetes quantity such as '10Gi'")
    modes = [access_modes] if isinstance(access_modes, str) else list(access_modes)  # one mode, not its letters
    bad = [m for m in modes if m not in ACCESS_MODES]
    if not modes or bad:
        raise ValueError(f"workspace access_modes {modes!r}: use one or more of {', '.join(ACCESS_MODES)}")
    patch: dict[str, object] = {"accessModes": modes}
    if storage_class is not None:
        if not storage_class.strip():
            raise ValueError("workspace storage_class '': the KFP backend refuses an empty storageClassName; omit it instead")
        patch["storageClassName"] = storage_class
    return dsl.PipelineConfig(
        workspace=dsl.WorkspaceConfig(size=size, kubernetes=dsl.KubernetesWorkspaceConfig(pvcSpecPatch=patch))
    )
