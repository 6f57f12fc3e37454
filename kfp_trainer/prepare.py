"""The one way from TrainJob inputs to a manifest ready to submit: check, read the runtime, render -- once.

A step makes one :class:`PreparedJob` with :func:`prepare` and hands it to
:meth:`~kfp_trainer.launcher.Launcher.run`; nothing is written before it exists, so every
input problem (the runtime's Trainer version and host-access policy included) fails the
step before a copy, a folder or a TrainJob is made.

1. the inputs are checked with what is known without the cluster (skipped when the caller
   already read the runtime: it checked the inputs before that read);
2. the namespace defaults to the backend's;
3. the runtime is read (once; a typed trainer's step reads it earlier, to configure itself,
   and passes it in);
4. the manifest is rendered for the runtime's Trainer API, name budget, replicated jobs,
   init containers and host-access policy, and checked again with those facts;
5. it is annotated with this launcher as its owner (:mod:`kfp_trainer.backends.owner`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from . import naming, spec
from .backends import owner
from .backends.base import Backend, RuntimeInfo
from .spec import TrainJobInputs


@dataclass(frozen=True)
class PreparedJob:
    """A TrainJob ready to submit: its manifest and what was learned about its runtime."""

    inputs: TrainJobInputs
    manifest: dict[str, Any]
    runtime: RuntimeInfo

    @property
    def api_version(self) -> str:
        """The Trainer API the manifest was rendered for (``v2.2`` or ``v2.1``)."""
        return self.runtime.api_version

    @property
    def runtime_name(self) -> str:
        """``Kind/name`` of the runtime."""
        return f"{self.runtime.kind}/{self.runtime.name}"


def is_local(backend: Backend) -> bool:
    """Whether ``backend`` runs jobs on this machine (then local-only URIs are fine)."""
    return backend.local


def check_inputs(inputs: TrainJobInputs, *, local: bool, api_version: spec.ApiVersion | None = None) -> TrainJobInputs:
    """Step 1 on its own: every check of ``inputs`` that needs no cluster, for a caller that connects only after it.

    ``api_version``: the Trainer API when the caller already knows it (a command-line flag);
    None leaves the version's own checks to the rendering.

    Raises:
        InvalidSpecErrors: Any input is invalid (all problems listed).

    Example:
        >>> check_inputs(TrainJobInputs(num_nodes=0, run_id="r1"), local=False)
        Traceback (most recent call last):
        ...
        kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
          - num_nodes: got 0; expected an integer from 1 to 1024
    """
    return spec.validate(inputs, api_version=api_version, local=local)


def prepare(backend: Backend, inputs: TrainJobInputs, *, runtime: RuntimeInfo | None = None) -> PreparedJob:
    """Check ``inputs``, read their runtime (unless given) and render the manifest, each once.

    Args:
        backend: Where the job will run.
        inputs: What to run.
        runtime: The runtime as the caller read it from ``backend`` for these inputs' runtime
            (a typed trainer's step); it is read here when None or another runtime.

    Raises:
        InvalidSpecErrors: Any input is invalid (all problems listed).
        RuntimeNotFoundError: The runtime does not exist.
    """
    local = is_local(backend)
    known = runtime is not None and (runtime.kind, runtime.name) == (inputs.runtime_kind, inputs.runtime)
    if not known:  # everything checkable before the first API call
        check_inputs(inputs, local=local)
    if not inputs.namespace:
        inputs = inputs.model_copy(update={"namespace": backend.default_namespace()})
    if known:
        assert runtime is not None
        info = _with_nodes(runtime, inputs.num_nodes)
    else:
        info = backend.resolve_runtime(inputs)
    budget = min(naming.max_name_length(), naming.max_name_length(info.replicated_jobs))
    manifest = spec.render(
        inputs, api_version=info.api_version, runtime_jobs=info.job_names, max_name_length=budget, local=local,
        allow_host_access=info.allow_host_access, init_containers=info.init_container_names,
    )  # fmt: skip
    return PreparedJob(inputs=inputs, manifest=owner.annotate(manifest), runtime=info)


def _with_nodes(info: RuntimeInfo, num_nodes: int | None) -> RuntimeInfo:
    """``info`` read without a node count, for a job of ``num_nodes`` trainer nodes (the runtime's when None)."""
    if not num_nodes or info.nodes == num_nodes:
        return info
    jobs = tuple((name, num_nodes if name == "node" else pods) for name, pods in info.replicated_jobs)
    return dataclasses.replace(info, replicated_jobs=jobs)
