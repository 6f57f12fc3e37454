"""A Python function run as the kubeflow SDK 0.5.0's ``CustomTrainer`` runs it: its TrainJob inputs. Pure.

``train(runtime, initializer, CustomTrainer(func, func_args, packages_to_install, ...))``:
the command writes the function's source to its file in the pod (after installing the
packages) and starts it with the runtime's launcher, calling ``func(**func_args)``;
:func:`render_function` gives those inputs, which the one renderer
(:func:`kfp_trainer.spec.render`) turns into the SDK's TrainJob.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any

from kfp_trainer.errors import InvalidSpecErrors, ValidationError
from kfp_trainer.llm.inputs import FunctionTrainerSettings, StorageSource
from kfp_trainer.llm.render import Rendered, initializer_inputs, resources_per_node, runtime_trainer
from kfp_trainer.llm.runtimes import RuntimeTrainer

MPI_USER_HOME = "/home/mpiuser"

_FUNC_SCRIPT = '\nread -r -d \'\' SCRIPT << EOM\n\n{func_code}\nEOM\nprintf "%s" "$SCRIPT" > "{func_file}"\n{entrypoint} "{func_file}"'


def _pip_script(packages: list[str], index_urls: list[str], log_file: str) -> str:
    """Shell that installs ``packages`` (user site first, then system), as the SDK writes it."""
    pkgs = " ".join(shlex.quote(p) for p in packages)
    opts = " ".join([f"--index-url {shlex.quote(index_urls[0])}"] + [f"--extra-index-url {shlex.quote(u)}" for u in index_urls[1:]])
    pip = "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install --quiet \\\n    --no-warn-script-location"
    lines = [
        "",
        'if ! [ -x "$(command -v pip)" ]; then',
        "    python -m ensurepip || python -m ensurepip --user || apt-get install python-pip",
        "fi",
        "",
        "",
        f"PACKAGES=({pkgs})",
        f"PIP_OPTS=({opts})",
        f'LOG_FILE="{log_file}"',
        'rm -f "$LOG_FILE"',
        "",
        f'if {pip} "${{PIP_OPTS[@]}}" --user "${{PACKAGES[@]}}" >"$LOG_FILE" 2>&1; then',
        '    echo "Successfully installed Python packages (user): ${PACKAGES[*]}"',
        f'elif {pip} "${{PIP_OPTS[@]}}" "${{PACKAGES[@]}}" >>"$LOG_FILE" 2>&1; then',
        '    echo "Successfully installed Python packages (system-wide): ${PACKAGES[*]}"',
        "else",
        '    echo "ERROR: Failed to install Python packages: ${PACKAGES[*]}" >&2',
        '    cat "$LOG_FILE" >&2',
        "    exit 1",
        "fi",
        "",
        "",
    ]
    return "\n".join(lines)


def function_command(rt: RuntimeTrainer, settings: FunctionTrainerSettings) -> list[str]:
    """``spec.trainer.command`` for a function: write it to a file in the pod, run it with the runtime's launcher."""
    entry = rt.entrypoint[0]
    call = f"{settings.func_name}()" if settings.func_args is None else f"{settings.func_name}(**{settings.func_args})"
    code = f"{settings.func_source}\n{call}\n"
    func_file, log_file = settings.func_file, "pip_install.log"
    if entry == "mpirun":
        func_file = posixpath.join(MPI_USER_HOME, func_file)
        log_file = posixpath.join(MPI_USER_HOME, "pip_install.log")
    script = _FUNC_SCRIPT.format(func_code=code, func_file=func_file, entrypoint="torchrun" if entry == "torchrun" else "python")
    if settings.packages_to_install:
        script = _pip_script(settings.packages_to_install, settings.pip_index_urls, log_file) + script
    prefix = ["mpirun", "--hostfile", "/etc/mpi/hostfile"] if entry == "mpirun" else []
    return prefix + ["bash", "-c", script]


def render_function(
    runtime: dict[str, Any] | RuntimeTrainer,
    settings: FunctionTrainerSettings,
    *,
    dataset: StorageSource | None = None,
    model: StorageSource | None = None,
) -> Rendered:
    """The TrainJob inputs of ``train(runtime, initializer, CustomTrainer(func, func_args, packages_to_install, ...))``.

    Raises:
        InvalidSpecErrors: the runtime is a torchtune runtime, or the resources are invalid.
    """
    rt = runtime_trainer(runtime)
    if rt.is_torchtune:
        raise InvalidSpecErrors(
            [
                ValidationError(
                    "runtime",
                    rt.name,
                    "a runtime that runs training functions (torch, MPI, ...); torchtune runtimes take torchtune settings",
                )
            ]
        )
    job: dict[str, Any] = {"runtime": rt.name, "runtime_kind": rt.kind}
    if settings.num_nodes:
        job["num_nodes"] = settings.num_nodes
    if settings.resources_per_node:
        try:
            job["resources_per_node"] = resources_per_node(settings.resources_per_node)
        except ValidationError as e:
            raise InvalidSpecErrors([e]) from None
    job["command"] = function_command(rt, settings)
    if settings.image:
        job["image"] = settings.image
    if settings.env:
        job["env"] = dict(settings.env)
    job.update(initializer_inputs(dataset, model))
    return Rendered(inputs=job)
