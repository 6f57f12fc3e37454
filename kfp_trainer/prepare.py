"""The one way from TrainJob inputs to a manifest ready to submit: check, read the runtime, configure, render.

A step (or ``kfp-trainer launch``) makes one :class:`PreparedJob` with :func:`prepare` and hands
it to :meth:`~kfp_trainer.launcher.Launcher.run`; nothing is written before it exists, so every
input problem (the runtime's Trainer version and host-access policy included) fails the step
before a copy, a folder or a TrainJob is made. In order, each once:

1. the inputs are checked with what is known without the cluster (before any API request: a
   bad namespace or runtime name never reaches a URL);
2. the namespace defaults to the backend's;
3. the runtime is read;
4. a typed trainer (:class:`Configurer`) completes the inputs for that runtime;
5. the manifest is rendered for the runtime's Trainer API, name budget, replicated jobs,
   init containers and host-access policy -- every check again, now with those facts -- and
6. annotated with this launcher as its owner (:mod:`kfp_trainer.backends.owner`).

Example:
    >>> from kfp_trainer.backends.local import LocalBackend
    >>> job = prepare(LocalBackend(), TrainJobInputs(runtime="torch-distributed", run_id="r1", task_name="train"))
    >>> job.runtime_name, job.manifest["kind"]
    ('ClusterTrainingRuntime/torch-distributed', 'TrainJob')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from . import naming, spec
from .backends import owner
from .backends.base import Backend, RuntimeInfo
from .cancel import Stop
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


class Configurer(Protocol):
    """What completes the inputs once the runtime is known (a typed trainer's step)."""

    def configure(self, runtime: RuntimeInfo, inputs: TrainJobInputs) -> TrainJobInputs:
        """The inputs to render for ``runtime``: ``inputs`` completed; reads only, writes nothing."""


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


def prepare(backend: Backend, inputs: TrainJobInputs, *, trainer: Configurer | None = None, stop: Stop | None = None) -> PreparedJob:
    """Check ``inputs``, read their runtime, let ``trainer`` complete them, and render the manifest, each once.

    Args:
        backend: Where the job will run.
        inputs: What to run (a typed trainer's: what the step was given).
        trainer: Completes the inputs for the runtime read (see :class:`Configurer`).
        stop: The run's stop token: a stop requested before or while the runtime is read ends
            the preparation there (:class:`~kfp_trainer.errors.CancelledError`).

    Raises:
        InvalidSpecErrors: Any input is invalid (all problems listed).
        RuntimeNotFoundError: The runtime does not exist.
    """
    stop = stop if stop is not None else Stop()
    local = backend.local
    check_inputs(inputs, local=local)  # everything checkable before the first API call
    if not inputs.namespace:
        inputs = inputs.model_copy(update={"namespace": backend.default_namespace()})
    stop.check()
    info = backend.resolve_runtime(inputs)
    stop.check()
    if trainer is not None:
        inputs = trainer.configure(info, inputs)
        info = _with_nodes(info, inputs.num_nodes)
    budget = min(naming.max_name_length(), naming.max_name_length(info.replicated_jobs))
    manifest = spec.render(
        inputs, api_version=info.api_version, runtime_jobs=info.job_names, max_name_length=budget, local=local,
        allow_host_access=info.allow_host_access, init_containers=info.init_container_names,
    )  # fmt: skip
    return PreparedJob(inputs=inputs, manifest=owner.annotate(manifest), runtime=info)


def _with_nodes(info: RuntimeInfo, num_nodes: int | None) -> RuntimeInfo:
    """``info`` for a job of ``num_nodes`` trainer nodes (unchanged when None or already so)."""
    if not num_nodes or info.nodes == num_nodes:
        return info
    jobs = tuple((name, num_nodes if name == "node" else pods) for name, pods in info.replicated_jobs)
    return dataclasses.replace(info, replicated_jobs=jobs)
