"""TRL post-training settings: the ``trl_finetune`` component's inputs, checked, rendered as trainer arguments. Pure.

The field names are those of the kubeflow SDK's proposed ``TRLConfig`` (KEP-626, config-driven
LLM trainers): ``method`` (``sft``, ``dpo`` or ``grpo``), ``learning_rate``,
``per_device_train_batch_size``, ``num_train_epochs``, ``bf16``, ``use_peft``, ``lora_r``,
``lora_alpha``, ``lora_target_modules``, ``beta`` (DPO) and ``extra_args``; the proposal's
``model_name_or_path`` and ``dataset_name`` are the folders the step hands the trainer. A few
more are TRL's own ``SFTConfig``/``DPOConfig``/``ModelConfig`` names: ``max_steps``,
``lora_dropout``, ``load_in_4bit`` (QLoRA), ``max_length``, ``save_steps``, ``logging_steps``,
``seed``. (TRL 1.x has no ``max_prompt_length``: ``max_length`` bounds prompt and answer.)
GRPO adds TRL's ``GRPOConfig`` names: ``num_generations``, ``max_completion_length``,
``temperature``, ``loss_type``, ``gradient_accumulation_steps``, ``beta`` (the KL weight; 0, TRL's
default, loads no reference model), ``use_vllm`` and ``vllm_mode``, and ``rewards`` (the reward
functions: :mod:`kfp_trainer.llm.rewards`). What TRL checks only when training starts -- at least two
generations, a generation batch (``per_device_train_batch_size`` x processes x
``gradient_accumulation_steps``) made of whole groups of ``num_generations`` -- is checked here,
with the world size when it is known (:func:`grpo_batch_errors`).

:meth:`TRLSettings.to_args` renders them as the proposal does, ``[method, --flag, value, ...]``
(``True`` as a bare flag, lists as several values), which is what the trainer program
:mod:`kfp_trainer.trainers.trl_train` parses with TRL's own argument classes.

Example:
    >>> s = trl_settings(method="dpo", learning_rate=5e-6, beta=0.1, use_peft=True, lora_r=8)
    >>> s.to_args()
    ['dpo', '--learning_rate', '5e-06', '--use_peft', '--lora_r', '8', '--beta', '0.1']
    >>> trl_settings(method="sft", beta=0.1)
    Traceback (most recent call last):
    ...
    kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
      - beta: got 0.1; expected nothing with method='sft' (beta is DPO's and GRPO's: set method='dpo')
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import InvalidSpecErrors, ValidationError

METHODS = ("sft", "dpo", "grpo")
#: Flags the step sets itself: the model, the dataset and where the output goes.
OWNED_FLAGS = ("model_name_or_path", "dataset_name", "output_dir", "resume_from_checkpoint", "dataset_train_split")
_DPO_ONLY = ("beta",)  # DPO's and GRPO's
_GRPO_ONLY = ("num_generations", "max_completion_length", "temperature", "loss_type", "use_vllm", "vllm_mode", "rewards")
#: TRL 1.16's GRPO loss formulations (``GRPOConfig.loss_type``).
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo")
VLLM_MODES = ("colocate", "server")
#: TRL's defaults where the GRPO batch checks need them (``TrainingArguments`` and ``GRPOConfig``).
TRL_DEFAULT_BATCH_SIZE = 8
TRL_DEFAULT_GENERATIONS = 8
_PEFT_ONLY = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
_FLAG = re.compile(r"^--[a-z][a-z0-9_]*(=.*)?$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$|^all-linear$")


@dataclass(frozen=True)
class TRLSettings:
    """Checked TRL settings (``None``: TRL's default); see the module docstring for the names."""

    method: str
    learning_rate: float | None = None
    per_device_train_batch_size: int | None = None
    num_train_epochs: float | None = None
    max_steps: int | None = None
    bf16: bool | None = None
    use_peft: bool | None = None
    lora_r: int | None = None
    lora_alpha: int | None = None
    lora_dropout: float | None = None
    lora_target_modules: list[str] | None = None
    load_in_4bit: bool | None = None
    beta: float | None = None
    max_length: int | None = None
    save_steps: int | None = None
    logging_steps: int | None = None
    seed: int | None = None
    gradient_accumulation_steps: int | None = None
    num_generations: int | None = None
    max_completion_length: int | None = None
    temperature: float | None = None
    loss_type: str | None = None
    use_vllm: bool | None = None
    vllm_mode: str | None = None
    rewards: list[dict[str, Any]] | None = None
    extra_args: list[str] = field(default_factory=list)

    @property
    def adapter(self) -> bool:
        """True when a LoRA (or QLoRA) adapter is trained instead of all weights."""
        return bool(self.use_peft or self.load_in_4bit)

    def to_args(self) -> list[str]:
        """``[method, --flag, value, ...]`` for the trainer (and the TRL command line)."""
        args = [self.method]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("method", "extra_args") or value is None:
                continue
            if f.name == "rewards":
                args += ["--rewards", json.dumps(value, sort_keys=True, separators=(",", ":"))]
            elif value is True:
                args.append(f"--{f.name}")
            elif value is False:
                args += [f"--{f.name}", "false"]
            elif isinstance(value, list):
                args += [f"--{f.name}", *map(str, value)]
            else:
                args += [f"--{f.name}", format(value, "g") if isinstance(value, float) else str(value)]
        return args + list(self.extra_args)

    def summary(self) -> dict[str, Any]:
        """The settings that were set, for the model's metadata and the report."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) not in (None, [])}
        if self.rewards:  # names and weights: the source of a function stays in the TrainJob's arguments
            out["rewards"] = [{"name": r["name"], "kind": r["kind"], "weight": r.get("weight", 1.0)} for r in self.rewards]
        return out

    def generation_batch(self, world_size: int) -> int:
        """GRPO's generation batch: completions sampled per optimizer step over all processes (TRL's rule)."""
        return (self.per_device_train_batch_size or TRL_DEFAULT_BATCH_SIZE) * world_size * (self.gradient_accumulation_steps or 1)


def grpo_batch_errors(settings: TRLSettings, world_size: int | None) -> list[ValidationError]:
    """GRPO's batch rule, as TRL checks it when training starts: whole groups of ``num_generations`` per generation batch.

    Example:
        >>> s = trl_settings(method="grpo", rewards=["exact_answer"], num_generations=3, per_device_train_batch_size=4)
        >>> [e.field for e in grpo_batch_errors(s, 1)], grpo_batch_errors(s, 3)
        (['num_generations'], [])
    """
    if settings.method != "grpo" or world_size is None:
        return []
    generations = settings.num_generations or TRL_DEFAULT_GENERATIONS
    batch = settings.generation_batch(world_size)
    if batch % generations == 0:
        return []
    per = settings.per_device_train_batch_size or TRL_DEFAULT_BATCH_SIZE
    steps = settings.gradient_accumulation_steps or 1
    return [ValidationError("num_generations", generations, (
        f"a divisor of the generation batch, {batch} completions (per_device_train_batch_size {per} x {world_size} "
        f"process{'es' if world_size > 1 else ''} x gradient_accumulation_steps {steps}): each prompt's {generations} "
        "completions must fall in one batch; change num_generations or per_device_train_batch_size"
    ))]  # fmt: skip


def _number(errors: list[ValidationError], name: str, value: Any, *, integer: bool, low: float, allowed: str) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        errors.append(ValidationError(name, value, allowed))
        return None
    if integer:
        if float(value) != int(value):
            errors.append(ValidationError(name, value, allowed))
            return None
        value = int(value)
    if value < low:
        errors.append(ValidationError(name, value, allowed))
        return None
    return value


def trl_settings(*, method: str, extra_args: list[str] | None = None, world_size: int | None = None, **inputs: Any) -> TRLSettings:
    """Check the component's inputs and return them as :class:`TRLSettings`.

    ``None`` (and, from a pipeline, ``0``/``""`` for the numbers and strings that have no
    meaningful zero) means TRL's default. Every problem is reported at once, each naming the
    input, its value and what is allowed. ``world_size`` (processes over all nodes), when
    known, checks GRPO's generation batch.

    Raises:
        InvalidSpecErrors: Any input out of range, a DPO or LoRA setting without DPO or
            ``use_peft``, or an ``extra_args`` item that is not a flag or sets one the step owns.
        TypeError: An input name this function does not know (a programming error).
    """
    names = {f.name for f in fields(TRLSettings)} - {"method", "extra_args"}
    unknown = sorted(set(inputs) - names)
    if unknown:
        raise TypeError(f"unknown TRL inputs: {unknown}")
    errors: list[ValidationError] = []
    if method not in METHODS:
        errors.append(ValidationError("method", method, "sft, dpo or grpo"))
    zero_is_default = ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "max_steps", "lora_r", "lora_alpha",
                       "max_length", "save_steps", "logging_steps", "beta", "gradient_accumulation_steps")  # fmt: skip
    values: dict[str, Any] = {
        k: (None if (v == "" or (k in zero_is_default and v == 0 and not isinstance(v, bool))) else v) for k, v in inputs.items()
    }
    if values.get("seed") is not None and values["seed"] < 0:  # -1: TRL's default seed
        values["seed"] = None
    for name in ("num_generations", "max_completion_length", "temperature"):  # -1: TRL's default (0 is refused)
        if values.get(name) == -1 and not isinstance(values.get(name), bool):
            values[name] = None
    out: dict[str, Any] = {}
    for name, integer, low, allowed in (
        ("learning_rate", False, 1e-12, "a positive number, e.g. 2e-5"),
        ("per_device_train_batch_size", True, 1, "a whole number of examples, at least 1"),
        ("num_train_epochs", False, 1e-9, "a positive number of epochs"),
        ("max_steps", True, 1, "a whole number of optimizer steps, at least 1 (overrides num_train_epochs)"),
        ("lora_r", True, 1, "a whole LoRA rank, at least 1"),
        ("lora_alpha", True, 1, "a whole LoRA alpha, at least 1"),
        ("lora_dropout", False, 0, "a dropout probability from 0 to 1"),
        ("beta", False, 1e-9, "a positive beta (DPO's, e.g. 0.1; GRPO's KL weight, 0 by default)"),
        ("max_length", True, 8, "a whole number of tokens, at least 8"),
        ("save_steps", True, 1, "a whole number of steps between checkpoints, at least 1"),
        ("logging_steps", True, 1, "a whole number of steps between log lines, at least 1"),
        ("seed", True, 0, "a whole number, 0 or more (-1: TRL's default)"),
        ("gradient_accumulation_steps", True, 1, "a whole number of steps, at least 1"),
        ("num_generations", True, 2, "a whole number of completions per prompt, at least 2 (GRPO compares each with its group)"),
        ("max_completion_length", True, 1, "a whole number of tokens per completion, at least 1"),
        ("temperature", False, 1e-6, "a positive sampling temperature, e.g. 1.0"),
    ):
        out[name] = _number(errors, name, values.get(name), integer=integer, low=low, allowed=allowed)
    if out["lora_dropout"] is not None and out["lora_dropout"] >= 1:
        errors.append(ValidationError("lora_dropout", out["lora_dropout"], "a dropout probability from 0 to 1"))
    for name, choices in (("loss_type", LOSS_TYPES), ("vllm_mode", VLLM_MODES)):
        value = values.get(name)
        if value is not None and value not in choices:
            errors.append(ValidationError(name, value, f"one of {', '.join(choices)}"))
            value = None
        out[name] = value
    if values.get("rewards") is not None or method == "grpo":
        from .rewards import check_rewards

        try:
            out["rewards"] = [spec.to_dict() for spec in check_rewards(values.get("rewards"))]
        except InvalidSpecErrors as e:
            if method == "grpo":
                errors += e.errors
            out["rewards"] = None
    for name in ("bf16", "use_peft", "load_in_4bit", "use_vllm"):
        value = values.get(name)
        if value is not None and not isinstance(value, bool):
            errors.append(ValidationError(name, value, "true or false"))
            value = None
        out[name] = value
    modules = values.get("lora_target_modules")
    if modules is not None:
        if not isinstance(modules, list) or not modules or not all(isinstance(m, str) and _MODULE.match(m) for m in modules):
            allowed = 'a list of module names, e.g. ["q_proj", "v_proj"], or ["all-linear"]'
            errors.append(ValidationError("lora_target_modules", modules, allowed))
        out["lora_target_modules"] = modules or None
    if method == "sft":
        errors += [ValidationError(n, values[n], f"nothing with method={method!r} (beta is DPO's and GRPO's: set method='dpo')")
                   for n in _DPO_ONLY if values.get(n) is not None]  # fmt: skip
    if method != "grpo":
        errors += [ValidationError(n, values[n], f"nothing with method={method!r} ({n} is GRPO's: set method='grpo')")
                   for n in _GRPO_ONLY if values.get(n) is not None and values.get(n) is not False]  # fmt: skip
    elif out["vllm_mode"] and not out["use_vllm"]:
        errors.append(ValidationError("vllm_mode", out["vllm_mode"], "nothing without use_vllm=True"))
    if out["load_in_4bit"] and out["use_peft"] is False:
        errors.append(ValidationError("use_peft", False, "true (or unset) with load_in_4bit: QLoRA trains LoRA on the 4-bit base"))
    if not (out["use_peft"] or out["load_in_4bit"]):
        named = {e.field for e in errors}
        errors += [ValidationError(n, values[n], "nothing without use_peft=True (a LoRA setting on a full fine-tune)")
                   for n in _PEFT_ONLY if values.get(n) is not None and n not in named]  # fmt: skip
    extra = list(extra_args or [])
    for i, item in enumerate(extra):
        if not isinstance(item, str):
            errors.append(ValidationError(f"extra_args[{i}]", item, "text"))
            continue
        if item.startswith("--"):
            flag = item[2:].split("=", 1)[0]
            if not _FLAG.match(item):
                errors.append(ValidationError(f"extra_args[{i}]", item, "a TRL flag like --warmup_steps (lower case, underscores)"))
            elif flag in OWNED_FLAGS:
                owned = ", ".join(OWNED_FLAGS)
                errors.append(ValidationError(f"extra_args[{i}]", item, f"a flag the step does not set itself (not {owned})"))
            elif flag in names or flag == "method":
                errors.append(ValidationError(f"extra_args[{i}]", item, f"a flag without an input of its own: set {flag} instead"))
        elif i == 0:
            errors.append(ValidationError("extra_args[0]", item, "a flag (--name), then its values"))
    if errors:
        raise InvalidSpecErrors(errors)
    settings = TRLSettings(method=method, extra_args=extra, **out)
    batch = grpo_batch_errors(settings, world_size)
    if batch:
        raise InvalidSpecErrors(batch)
    return settings
