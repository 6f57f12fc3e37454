"""Reward functions for GRPO: built-ins by name, the user's own Python functions, checked before anything runs.

A GRPO step (``trl_finetune(method="grpo", rewards=[...])``) scores each sampled completion with
one or more reward functions; TRL adds their weighted values. Each item of ``rewards`` is:

* a **built-in**, by name or as a dict with its settings and ``weight``:

  - ``exact_answer``: 1 when the completion equals the reference in ``column`` (default
    ``answer``, else ``completion``), else 0. Numbers compare as numbers (``"19"``, ``"19.0"``,
    ``" 19 "`` and ``"1,019"`` against ``1019`` all match); text compares case-folded, with
    whitespace collapsed and a trailing full stop dropped;
  - ``format``: 1 when the whole completion (stripped) matches the regular expression
    ``pattern``, else 0;
  - ``length_penalty``: 0 up to ``limit`` characters, then minus the share beyond it
    (``-(length - limit) / limit``, at most -1);

* **the user's own function**, made by :func:`reward` when the pipeline is built: its source
  travels in the step's inputs into the TrainJob (as ``trainjob_component`` ships a training
  function), where it is run as TRL runs any reward function: called with keyword arguments,
  ``completions`` (a list of texts, or of message lists for a conversational dataset) and
  whichever it names of ``prompts``, ``completion_ids``, ``trainer_state``, and the dataset's
  columns (``answer=[...]``, one value per completion), returning one number per completion.

The step checks the list when the pipeline is built (names, settings, weights, the function's
shipping and signature) and again when it starts, against the dataset's columns. In the trainer,
:func:`build` turns it into the callables TRL takes: a user's function that raises, returns the
wrong number of values, or something that is not a finite number fails the step with the
function's name and the sample that broke it.

Only the standard library is imported.

Example:
    >>> specs = check_rewards(["exact_answer", {"name": "format", "pattern": "[0-9]+", "weight": 0.2}])
    >>> [(s.name, s.weight) for s in specs]
    [('exact_answer', 1.0), ('format', 0.2)]
    >>> functions, weights = build(specs, columns={"prompt", "answer"})
    >>> [f(completions=["19", "nineteen"], answer=["19", "19"]) for f in functions]
    [[1.0, 0.0], [1.0, 0.0]]
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import json
import math
import numbers
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import InvalidSpecErrors, UserError, ValidationError

BUILTINS = ("exact_answer", "format", "length_penalty")
#: What TRL passes to a reward function besides the dataset's columns.
TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
#: Columns TRL does not pass to reward functions under their own name; the step hands them on as ``reference_<name>``.
RENAMED_COLUMNS = ("completion", "completion_ids")
#: Top-level modules of the project's trainer image (``deploy/Dockerfile.trainer``: the ``[local]`` extra and what it pulls in).
TRAINER_IMAGE_MODULES = (
    "torch", "transformers", "trl", "peft", "datasets", "accelerate", "safetensors", "tokenizers", "huggingface_hub",
    "numpy", "pandas", "pyarrow", "sklearn", "scipy", "boto3", "botocore", "yaml", "requests", "kfp_trainer",
)  # fmt: skip
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A number as people write answers: digits (thousands grouped by commas or not), a fraction, an exponent; never an exponent alone.
_NUMBER = re.compile(r"^[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?$")
_SETTINGS = {"exact_answer": ("column",), "format": ("pattern",), "length_penalty": ("limit",)}


class RewardError(UserError):
    """A reward function failed in the trainer: its name, the sample, and what went wrong."""


@dataclass(frozen=True)
class RewardSpec:
    """One checked reward: a built-in with its settings, or a shipped function (``kind == "function"``)."""

    name: str
    kind: str
    weight: float = 1.0
    column: str = ""
    pattern: str = ""
    limit: int = 0
    source: str = ""
    function: str = ""
    parameters: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    def columns(self, available: Iterable[str] = ()) -> list[str]:
        """The dataset columns this reward reads (for ``exact_answer`` without a column: ``answer``, else ``completion``)."""
        if self.kind == "exact_answer":
            if self.column:
                return [self.column]
            return ["completion"] if "answer" not in set(available) and "completion" in set(available) else ["answer"]
        return [p for p in self.parameters if p not in TRL_ARGUMENTS]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form the trainer reads back with :func:`check_rewards`."""
        out = {k: v for k, v in asdict(self).items() if v not in ("", 0, (), False) or k == "weight"}
        out["name"] = self.name
        if self.kind == "function":
            out["parameters"], out["modules"] = list(self.parameters), list(self.modules)
        return out


# -- the user's own function, checked when the pipeline is built ---------------------------------


def reward(func: Callable[..., Any], *, weight: float = 1.0, name: str | None = None, modules: Iterable[str] = ()) -> dict[str, Any]:
    """A user's reward function as an item of ``trl_finetune``'s ``rewards``, checked now.

    The function must be shippable like a KFP lightweight component: a plain ``def`` at module
    level (no lambda, no closure over local state, no decorator), with its imports inside its
    body. It must take ``completions``; its other parameters are TRL's (``prompts``,
    ``completion_ids``, ``trainer_state``) or dataset columns, passed by keyword. Modules it
    imports must be in the standard library or the trainer image; name others your image has
    in ``modules``.

    Args:
        func: The reward function.
        weight: Its weight among the rewards.
        name: Name in the logs and metrics (``rewards/<name>/mean``); the function's name by default.
        modules: Modules beyond the trainer image's that its imports need (your own image has them).

    Raises:
        InvalidSpecErrors: Anything that keeps it from being shipped or called, each named.

    Example:
        >>> def shout(completions, **kwargs):
        ...     return [float(c.isupper()) for c in completions]
        >>> item = reward(shout, weight=0.5)
        >>> (item["name"], item["kind"], item["weight"], item["parameters"])
        ('shout', 'function', 0.5, ['completions'])
        >>> reward(lambda completions: [0.0])
        Traceback (most recent call last):
        ...
        kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
          - rewards: got '<lambda>'; expected a function defined with def (a lambda has no source of its own to ship)
    """
    label = getattr(func, "__name__", repr(func))
    where = f"reward {label}"

    def fail(allowed: str) -> InvalidSpecErrors:
        return InvalidSpecErrors([ValidationError("rewards", label, allowed)])

    if not inspect.isfunction(func):
        raise fail("a plain Python function (def ...), not a class, method or callable object")
    if func.__name__ == "<lambda>":
        raise fail("a function defined with def (a lambda has no source of its own to ship)")
    if func.__code__.co_freevars:
        raise fail(f"a function that uses nothing from the function around it; it reads {', '.join(func.__code__.co_freevars)} "
                   "(a closure): define it at module level and pass such values as dataset columns")  # fmt: skip
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as e:
        raise fail(f"a function whose source Python can read (define it in a file, not at an interactive prompt): {e}") from None
    tree = ast.parse(source)
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef):
        raise fail("a function defined with def (async functions and lambdas cannot be shipped)")
    if node.decorator_list:
        raise fail("a function without decorators (only its own source is shipped)")
    spec = RewardSpec(name=name or func.__name__, kind="function", weight=weight, source=source, function=func.__name__,
                      parameters=_parameters(node), modules=tuple(modules))  # fmt: skip
    errors = _function_errors(spec, where=where)
    outside = _free_names(node)
    if outside:
        errors.append(ValidationError("rewards", label, f"a function that imports or defines inside its body what it uses; it reads "
                                      f"{', '.join(outside)} from outside it, which is not shipped with it"))  # fmt: skip
    if errors:
        raise InvalidSpecErrors(errors)
    return spec.to_dict()


def _parameters(node: ast.FunctionDef) -> tuple[str, ...]:
    """The function's named parameters (not ``*args``/``**kwargs``)."""
    return tuple(a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs)


def _free_names(node: ast.FunctionDef) -> list[str]:
    """Names the function reads that neither it nor Python's builtins define (its module's, which stay behind)."""
    bound = {node.name}
    loaded: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.arg):
            bound.add(child.arg)
        elif isinstance(child, ast.Name):
            (loaded if isinstance(child.ctx, ast.Load) else bound).add(child.id)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in child.names)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(child.name)
        elif isinstance(child, ast.ExceptHandler) and child.name:
            bound.add(child.name)
    return sorted(loaded - bound - set(dir(builtins)))


def _definition(spec: RewardSpec) -> ast.FunctionDef:
    """The function's definition in its source (the last one of its name, as Python binds it)."""
    return [n for n in ast.parse(spec.source).body if isinstance(n, ast.FunctionDef) and n.name == spec.function][-1]


def _imports(source: str) -> list[str]:
    """Top-level modules the source imports (absolute imports)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module.split(".")[0])
    return sorted(set(found))


def _function_errors(spec: RewardSpec, *, where: str) -> list[ValidationError]:
    """What keeps a function's source and signature from being called as a reward (without running it)."""
    errors: list[ValidationError] = []
    try:
        tree = ast.parse(spec.source)
    except SyntaxError as e:
        return [ValidationError("rewards", spec.name, f"Python source that parses ({where}: {e.msg}, line {e.lineno})")]
    if not spec.function or not any(isinstance(n, ast.FunctionDef) and n.name == spec.function for n in tree.body):
        return [ValidationError("rewards", spec.name, f"source that defines the function {spec.function or '(none named)'}")]
    args = _definition(spec).args
    if args.posonlyargs or args.vararg:
        errors.append(ValidationError("rewards", spec.name, f"parameters passed by keyword ({where}: TRL calls it with keywords, "
                                      "so no positional-only parameters or *args)"))  # fmt: skip
    names = [a.arg for a in args.args + args.kwonlyargs]
    if "completions" not in names:
        allowed = (f"a parameter named completions ({where}: the sampled completions TRL passes; its other parameters are "
                   "prompts, completion_ids, trainer_state or dataset columns)")  # fmt: skip
        errors.append(ValidationError("rewards", spec.name, allowed))
    unknown = [m for m in _imports(spec.source) if m not in sys.stdlib_module_names and m not in TRAINER_IMAGE_MODULES
               and m not in spec.modules]  # fmt: skip
    if unknown:
        errors.append(ValidationError("rewards", spec.name, f"imports the trainer image has ({where} imports {', '.join(unknown)}; "
                                      "use an image with them and name them in modules=[...])"))  # fmt: skip
    return errors


# -- the list, checked where it is given and where it is read ------------------------------------


def _weight(errors: list[ValidationError], where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        errors.append(ValidationError(f"{where}.weight", value, "a finite number (the reward's weight)"))
        return 1.0
    return float(value)


def check_rewards(items: Any) -> list[RewardSpec]:
    """The ``rewards`` input checked and read as :class:`RewardSpec` s; every problem at once.

    Raises:
        InvalidSpecErrors: No reward, an unknown name, a bad setting or weight, a function
            that cannot be called as a reward, two rewards of one name.
    """
    if isinstance(items, str):
        try:
            items = json.loads(items) if items.strip().startswith("[") else [s for s in items.split(",") if s.strip()]
        except ValueError:
            items = None
    if not isinstance(items, list) or not items:
        raise InvalidSpecErrors([ValidationError("rewards", items, f"a list of rewards: built-in names ({', '.join(BUILTINS)}), "
                                                 "dicts with their settings, or reward(my_function) items")])  # fmt: skip
    errors: list[ValidationError] = []
    specs: list[RewardSpec] = []
    for i, item in enumerate(items):
        where = f"rewards[{i}]"
        if isinstance(item, str):
            item = {"name": item.strip()}
        if not isinstance(item, Mapping):
            errors.append(ValidationError(where, item, "a built-in's name, a dict with its settings, or reward(my_function)"))
            continue
        item = dict(item)
        kind = item.pop("kind", None) or ("function" if "source" in item else item.get("name"))
        name = item.pop("name", None) or item.get("function") or kind
        weight = _weight(errors, where, item.pop("weight", 1.0))
        if not isinstance(name, str) or not _COLUMN.match(name):
            errors.append(ValidationError(f"{where}.name", name, "a name of letters, digits and underscores"))
            continue
        if kind == "function":
            fields = {k: item.pop(k, d) for k, d in (("source", ""), ("function", ""), ("parameters", []), ("modules", []))}
            spec = RewardSpec(name=name, kind="function", weight=weight, source=str(fields["source"]), function=str(fields["function"]),
                              modules=tuple(map(str, fields["modules"] or ())))  # fmt: skip
            found = _function_errors(spec, where=where)
            errors += found
            if not found:  # the parameters as the source says, whatever the item claims
                spec = RewardSpec(**{**asdict(spec), "parameters": _parameters(_definition(spec))})
        elif kind in BUILTINS:
            settings = {k: item.pop(k) for k in _SETTINGS[kind] if k in item}
            spec = RewardSpec(name=name, kind=kind, weight=weight, **settings)
            errors += _builtin_errors(spec, where)
        else:
            errors.append(ValidationError(f"{where}.name", kind, f"a built-in reward ({', '.join(BUILTINS)}) or reward(my_function)"))
            continue
        if item:
            allowed = ", ".join((*_SETTINGS.get(kind, ()), "weight"))
            errors.append(ValidationError(where, sorted(item), f"only the settings of {kind}: {allowed}"
                                          if kind != "function" else "a reward(...) item as made when the pipeline was built"))  # fmt: skip
        if any(s.name == name for s in specs):
            errors.append(ValidationError(f"{where}.name", name, "a name no other reward of the step has (name=... tells them apart)"))
        specs.append(spec)
    if errors:
        raise InvalidSpecErrors(errors)
    return specs


def _builtin_errors(spec: RewardSpec, where: str) -> list[ValidationError]:
    errors = []
    if spec.kind == "exact_answer" and spec.column and (not isinstance(spec.column, str) or not _COLUMN.match(spec.column)):
        errors.append(ValidationError(f"{where}.column", spec.column, "a dataset column name (letters, digits, underscores)"))
    if spec.kind == "format":
        if not isinstance(spec.pattern, str) or not spec.pattern:
            errors.append(ValidationError(f"{where}.pattern", spec.pattern or None, "a regular expression the whole completion must match"))
        else:
            try:
                re.compile(spec.pattern)
            except re.error as e:
                errors.append(ValidationError(f"{where}.pattern", spec.pattern, f"a regular expression Python reads ({e})"))
    if spec.kind == "length_penalty" and (isinstance(spec.limit, bool) or not isinstance(spec.limit, int) or spec.limit < 1):
        errors.append(ValidationError(f"{where}.limit", spec.limit or None, "a whole number of characters, at least 1"))
    return errors


def column_errors(specs: list[RewardSpec], columns: Iterable[str], *, dataset: str) -> list[ValidationError]:
    """Rewards that read a column the dataset lacks (parameters with defaults and ``**kwargs`` functions may go without)."""
    available = set(columns)
    errors = []
    for spec in specs:
        needed = spec.columns(available)
        if spec.kind == "function":
            needed = [p for p in needed if p in _required(spec)]
        missing = [c for c in needed if c not in available]
        if missing:
            errors.append(ValidationError("rewards", spec.name, f"columns the dataset has: it reads {', '.join(missing)}, and {dataset} "
                                          f"has {', '.join(sorted(available)) or 'no columns'}"))  # fmt: skip
    return errors


def _required(spec: RewardSpec) -> list[str]:
    """The function's parameters without a default value."""
    node = _definition(spec)
    positional = node.args.args
    with_defaults = len(node.args.defaults)
    required = [a.arg for a in positional[: len(positional) - with_defaults]]
    required += [a.arg for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True) if d is None]
    return required


# -- in the trainer: callables for TRL ------------------------------------------------------------


def text_of(completion: Any) -> str:
    """A completion's text: the text itself, or the content of its last message (conversational)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content", ""))
    return str(completion)


def normalised(text: Any) -> str | float:
    """``text`` as a number when it reads as one, else case-folded with whitespace collapsed and no trailing full stop."""
    value = " ".join(str(text).split()).casefold().rstrip(".").strip()
    if _NUMBER.match(value):
        return float(value.replace(",", ""))
    return value


def _same(a: str | float, b: str | float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def _exact_answer(column: str) -> Callable[..., list[float]]:
    def exact_answer(completions: list[Any], **columns: Any) -> list[float]:
        return [float(_same(normalised(text_of(c)), normalised(ref))) for c, ref in zip(completions, columns[column], strict=True)]

    return exact_answer


def _format(pattern: str) -> Callable[..., list[float]]:
    compiled = re.compile(pattern, re.DOTALL)

    def format_reward(completions: list[Any], **_: Any) -> list[float]:
        return [float(compiled.fullmatch(text_of(c).strip()) is not None) for c in completions]

    return format_reward


def _length_penalty(limit: int) -> Callable[..., list[float]]:
    def length_penalty(completions: list[Any], **_: Any) -> list[float]:
        return [-min(1.0, max(0, len(text_of(c)) - limit) / limit) for c in completions]

    return length_penalty


def _load_function(spec: RewardSpec) -> Callable[..., Any]:
    for module in _imports(spec.source):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise RewardError(f"reward function {spec.name} imports {module}, which this trainer image lacks ({e}); "
                              "use an image that has it") from None  # fmt: skip
    namespace: dict[str, Any] = {"__name__": f"kfp_trainer_reward_{spec.name}", "__builtins__": builtins}
    exec(compile(spec.source, f"<reward function {spec.name}>", "exec"), namespace)  # noqa: S102 - the pipeline's own code, shipped on purpose
    return namespace[spec.function]  # type: ignore[no-any-return]


@dataclass
class Recorder:
    """The last batch each reward scored, for the sample of completions the step shows (rank 0 keeps it)."""

    keep: int = 16
    prompts: list[Any] = field(default_factory=list)
    completions: list[Any] = field(default_factory=list)
    rewards: dict[str, list[float]] = field(default_factory=dict)
    step: int = 0

    def record(self, name: str, prompts: list[Any], completions: list[Any], values: list[float], step: int) -> None:
        """Keep ``values`` of ``name`` for this batch (a new batch starts over)."""
        if prompts[: self.keep] != self.prompts or completions[: self.keep] != self.completions or step != self.step:
            self.prompts, self.completions, self.rewards, self.step = list(prompts[: self.keep]), list(completions[: self.keep]), {}, step
        self.rewards[name] = [round(v, 6) for v in values[: self.keep]]

    def samples(self) -> list[dict[str, Any]]:
        """The kept completions with each reward's value."""
        return [{"prompt": text_of(p) if not isinstance(p, str) else p, "completion": text_of(c),
                 "rewards": {name: values[i] for name, values in self.rewards.items() if i < len(values)}}
                for i, (p, c) in enumerate(zip(self.prompts, self.completions, strict=False))]  # fmt: skip


def _sample(kwargs: Mapping[str, Any], i: int) -> str:
    prompt = (kwargs.get("prompts") or [None] * (i + 1))[i]
    completion = kwargs["completions"][i]
    return f"sample {i + 1} (prompt {text_of(prompt)[:200]!r}, completion {text_of(completion)[:200]!r})"


def _checked(name: str, fn: Callable[..., Any], wanted: set[str] | None, recorder: Recorder | None) -> Callable[..., list[float]]:
    """``fn`` called with the arguments it takes; its values checked, named by function and sample when wrong."""

    def call(**kwargs: Any) -> list[float]:
        for column in RENAMED_COLUMNS:
            if f"reference_{column}" in kwargs:
                kwargs[column] = kwargs.pop(f"reference_{column}")
        given = {k: v for k, v in kwargs.items() if wanted is None or k in wanted}
        completions = kwargs["completions"]
        try:
            values = fn(**given)
        except Exception as e:  # noqa: BLE001 - any failure of the user's code is reported with its sample
            raise RewardError(f"reward function {name} raised {type(e).__name__}: {e} on {_culprit(fn, given, kwargs)}") from e
        if hasattr(values, "tolist"):
            values = values.tolist()
        if not isinstance(values, (list, tuple)):
            raise RewardError(f"reward function {name} returned {type(values).__name__}; expected a list of {len(completions)} numbers, "
                              f"one per completion (first: {_sample(kwargs, 0)})")  # fmt: skip
        if len(values) != len(completions):
            raise RewardError(f"reward function {name} returned {len(values)} values for {len(completions)} completions; expected one "
                              f"per completion (first: {_sample(kwargs, 0)})")  # fmt: skip
        for i, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise RewardError(f"reward function {name} returned {value!r} for {_sample(kwargs, i)}; expected a finite number")
        out = [float(v) for v in values]
        if recorder is not None:
            state = kwargs.get("trainer_state")
            recorder.record(name, list(kwargs.get("prompts") or []), list(completions), out, int(getattr(state, "global_step", 0) or 0))
        return out

    call.__name__ = name  # what TRL logs it as: rewards/<name>/mean
    return call


def _culprit(fn: Callable[..., Any], given: Mapping[str, Any], kwargs: Mapping[str, Any]) -> str:
    """The first sample that makes ``fn`` raise alone, or the batch when none does."""
    n = len(kwargs["completions"])
    for i in range(n):
        one = {k: ([v[i]] if isinstance(v, list) and len(v) == n else v) for k, v in given.items()}
        try:
            fn(**one)
        except Exception:  # noqa: BLE001 - looking for the sample that breaks it
            return _sample(kwargs, i)
    return f"a batch of {n} completions (no single one of them fails alone; first: {_sample(kwargs, 0)})"


def build(
    specs: list[RewardSpec], *, columns: Iterable[str], recorder: Recorder | None = None
) -> tuple[list[Callable[..., Any]], list[float]]:
    """The reward callables TRL takes, and their weights.

    ``columns`` are the dataset's; a reward reading ``completion`` gets it from ``reference_completion``
    (TRL keeps its own ``completion`` for itself).

    Raises:
        RewardError: A shipped function that cannot be loaded (an import the image lacks, its
            source does not run).
    """
    available = set(columns)
    functions: list[Callable[..., Any]] = []
    for spec in specs:
        if spec.kind == "exact_answer":
            fn: Callable[..., Any] = _exact_answer(spec.columns(available)[0])
        elif spec.kind == "format":
            fn = _format(spec.pattern)
        elif spec.kind == "length_penalty":
            fn = _length_penalty(spec.limit)
        else:
            try:
                fn = _load_function(spec)
            except RewardError:
                raise
            except Exception as e:  # noqa: BLE001 - the shipped source did not run
                raise RewardError(f"reward function {spec.name} could not be loaded: {type(e).__name__}: {e}") from e
        takes_all = spec.kind != "function" or any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
        wanted = None if takes_all else set(inspect.signature(fn).parameters)
        functions.append(_checked(spec.name, fn, wanted, recorder))
    return functions, [s.weight for s in specs]


def prompt_records(
    dataset: Any, split: str, specs: list[RewardSpec], *, log: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The prompts and the columns the rewards read, as GRPO gets them; the dataset's columns.

    A column TRL keeps for itself (``completion``) comes as ``reference_<name>``, which the
    reward's wrapper hands back under its own name.

    Raises:
        kfp_trainer.data.DatasetError: No prompt column, an unreadable dataset.
        InvalidSpecErrors: A reward reads a column the dataset lacks.
    """
    from ..data import load_prompt_split

    rows = load_prompt_split(dataset, split, columns=None, log=log)
    available = list(rows[0])
    errors = column_errors(specs, available, dataset=f"the dataset's {split} split")
    if errors:
        raise InvalidSpecErrors(errors)
    needed = sorted({c for s in specs for c in s.columns(available) if c in available and c != "prompt"})
    keys = {c: f"reference_{c}" if c in RENAMED_COLUMNS else c for c in needed}
    return [{"prompt": row["prompt"], **{keys[c]: row.get(c) for c in needed}} for row in rows], available


def to_json(specs: list[RewardSpec]) -> str:
    """The checked rewards as the trainer's ``--rewards`` flag carries them."""
    return json.dumps([s.to_dict() for s in specs], sort_keys=True, separators=(",", ":"))
