"""Each KFP internal the components rely on, named in one test: a KFP upgrade that moves one fails here.

The components touch KFP's internals only through :mod:`kfp_trainer.components.kfp_internals`;
this test checks every one of them against the installed KFP, with a real pipeline being built,
and lists all that broke at once.
"""

import inspect
from collections.abc import Callable
from typing import Any

from kfp import components, dsl
from kfp.dsl import pipeline_channel, pipeline_context, utils
from kfp.dsl.base_component import BaseComponent
from kfp.dsl.graph_component import GraphComponent

from kfp_trainer.components import kfp_internals as internals


@dsl.component(base_image="python:3.11")
def _echo(text: str, rate: float = 0.5) -> str:
    return text


def test_every_kfp_internal_the_components_rely_on_is_where_they_expect_it():
    seen: dict[str, Any] = {}

    @dsl.pipeline(name="inner")
    def inner(text: str = "x"):
        seen["inner"] = internals.pipeline_being_built()
        _echo(text=text)

    @dsl.pipeline(name="outer", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi")))
    def outer(text: str = "y"):
        seen["outer"] = internals.pipeline_being_built()
        seen["pipeline"] = internals.default_pipeline()
        first = _echo(text=f"{text}!")
        seen["first"] = first
        seen["channel"] = text
        seen["name"] = internals.unique_task_name(internals.component_name(_echo))
        seen["nested"] = inner(text=text)

    loaded = components.load_component_from_text(
        "name: t\ninputs:\n- {name: a, type: String}\nimplementation:\n  container: {image: busybox, command: [echo]}\n"
    )
    checks: dict[str, Callable[[], bool]] = {
        "GraphComponent.__init__ runs the body with self and pipeline_config among its locals": lambda: (
            {"self", "pipeline_config"} <= set(inspect.signature(GraphComponent.__init__).parameters)
            and seen["outer"][0] is outer and getattr(seen["outer"][1].workspace, "size", None) == "1Gi"
            and seen["inner"][0] is inner and seen["inner"][1] is None
        ),
        "outside a pipeline body no GraphComponent frame is found": lambda: internals.pipeline_being_built() == (None, None),
        "pipeline_context.Pipeline.get_default_pipeline() and its tasks by name": lambda: (
            isinstance(seen["pipeline"], pipeline_context.Pipeline) and "echo" in seen["pipeline"].tasks
            and internals.default_pipeline() is None
        ),
        "pipeline_channel.PipelineChannel is a pipeline parameter": lambda: (
            internals.is_channel(seen["channel"]) and isinstance(seen["channel"], pipeline_channel.PipelineChannel)
            and not internals.is_channel("text")
        ),
        "a channel's text form inside a string": lambda: bool(internals.CHANNEL_TEXT.search(str(seen["first"].inputs["text"]))),
        "dsl.utils.maybe_rename_for_k8s and make_name_unique_by_adding_index": lambda: (
            seen["name"] == "echo-2" and utils.maybe_rename_for_k8s("My_Comp") == "my-comp"
        ),
        "component_spec inputs (default, type), outputs and name": lambda: (
            internals.inputs_of(_echo)["rate"].default == 0.5 and internals.inputs_of(_echo)["rate"].type == "Float"
            and "Output" in internals.outputs_of(_echo) and internals.component_name(_echo) == "echo"
        ),
        "component_spec.implementation.graph is a pipeline's spec": lambda: (
            internals.graph_spec(outer) is outer.pipeline_spec and "echo" in internals.graph_spec(outer).root.dag.tasks
        ),
        "PipelineTask.pipeline_spec of a nested pipeline's task, settable": lambda: (
            internals.task_spec(seen["nested"]) is not None and internals.task_spec(seen["first"]) is None
            and _set_and_read(seen["nested"])
        ),
        "component_spec.task_config_passthroughs, settable on a loaded component": lambda: _passthroughs(loaded),
        "a component's class can be replaced by a subclass overriding __call__ and pipeline_spec": lambda: (
            "__call__" in vars(BaseComponent) and isinstance(vars(GraphComponent).get("pipeline_spec"), property)
            and _extended()
        ),
    }
    broken = []
    for name, check in checks.items():
        try:
            ok = check()
        except Exception as e:  # report every internal that moved, not only the first
            ok, name = False, f"{name} ({type(e).__name__}: {e})"
        if not ok:
            broken.append(name)
    assert broken == [], "KFP internals that moved (see kfp_trainer/components/kfp_internals.py):\n  " + "\n  ".join(broken)


def _set_and_read(task: Any) -> bool:
    spec = internals.task_spec(task)
    internals.set_task_spec(task, spec)
    return internals.task_spec(task) is spec


def _passthroughs(component: Any) -> bool:
    if internals.task_config_passthroughs(component):
        return False  # the YAML loader keeps none: what loading.py restores
    internals.set_task_config_passthroughs(component, [{"field": "RESOURCES"}, {"field": "ENV", "applyToTask": True}])
    got = internals.task_config_passthroughs(component)
    return [(p.field, p.apply_to_task) for p in got] == [(dsl.TaskConfigField.RESOURCES, False), (dsl.TaskConfigField.ENV, True)]


def _extended() -> bool:
    component = components.load_component_from_text(
        "name: u\ninputs:\n- {name: a, type: String}\nimplementation:\n  container: {image: busybox, command: [echo]}\n"
    )
    calls = []
    original = type(component)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original.__call__(self, *args, **kwargs)

    first = internals.extend(component, "_test_mark", {"__call__": __call__})
    again = internals.extend(component, "_test_mark", {"__call__": __call__})

    @dsl.pipeline(name="p")
    def p():
        component(a="b")

    return first and not again and isinstance(component, original) and calls == [{"a": "b"}] and "u" in p.pipeline_spec.root.dag.tasks
