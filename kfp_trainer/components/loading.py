"""Load a compiled component YAML without losing its TaskConfig passthroughs or run context.

``kfp.components.load_component_from_file/url`` (KFP 2.17) drops the component's
``taskConfigPassthroughs`` when it reads the YAML back, so a pipeline built from the
loaded ``train_job`` would apply the task's resources, tolerations, node selector and
affinity to the launcher pod instead of the TrainJob, and hand the TrainJob no volumes or
env. Its tasks would also not get the run id, task name and workspace placeholders
(:mod:`.context`). :func:`load_component_from_file` and :func:`load_component_from_url`
restore both.

Example:
    >>> train_job = load_component_from_file("components/train_job/component.yaml")  # doctest: +SKIP
"""

from typing import Any

import yaml
from kfp import components

from .calls import with_run_context
from .kfp_internals import set_task_config_passthroughs, task_config_passthroughs


def restore_passthroughs(component: Any, text: str) -> Any:
    """Set the passthroughs listed in the component YAML ``text`` on the loaded ``component``, and its run context."""
    doc = next(iter(yaml.safe_load_all(text)))
    entries = None
    for spec in (doc.get("components") or {}).values():
        if spec.get("taskConfigPassthroughs"):
            entries = spec["taskConfigPassthroughs"]
    entries = entries or doc.get("root", {}).get("taskConfigPassthroughs")
    if entries and not task_config_passthroughs(component):
        set_task_config_passthroughs(component, entries)
    return with_run_context(component)  # run context, build-time checks, launcher defaults


def load_component_from_file(path: str) -> Any:
    """Like ``kfp.components.load_component_from_file``, keeping TaskConfig passthroughs."""
    with open(path) as f:
        text = f.read()
    return restore_passthroughs(components.load_component_from_text(text), text)


def load_component_from_url(url: str) -> Any:
    """Like ``kfp.components.load_component_from_url``, keeping TaskConfig passthroughs."""
    import urllib.request

    with urllib.request.urlopen(url) as response:  # noqa: S310 - the caller's URL, as in kfp
        text = response.read().decode()
    return restore_passthroughs(components.load_component_from_text(text), text)
