"""Typed, validated settings of the LLM trainer path, named as in the kubeflow SDK 0.5.0. Pure.

``TorchTuneConfig``/``LoraConfig``/``TorchTuneInstructDataset`` become :class:`TorchTuneSettings`,
:class:`LoraSettings` and :class:`InstructDatasetSettings` with the same field names and values;
the dataset/model initializers become :class:`StorageSource`. One difference on purpose: secrets
(Hugging Face tokens, S3 keys) are never values here. Name a Kubernetes Secret in ``secret_ref``
instead; the Trainer passes it to the initializer as ``envFrom``.

:func:`parse` builds any of these from plain values and turns every problem into one
:class:`~kfp_trainer.errors.InvalidSpecErrors` naming the field, the value and what is allowed.

Example:
    >>> s = parse(TorchTuneSettings, dtype="bf16", epochs=2, peft_config={"lora_rank": 8})
    >>> s.peft_config.lora_attn_modules
    ['q_proj', 'v_proj', 'output_proj']
    >>> parse(TorchTuneSettings, dtype="fp16")
    Traceback (most recent call last):
    ...
    kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
      - dtype: got 'fp16'; expected one of 'bf16', 'fp32'
"""

from __future__ import annotations

import keyword
import re
from decimal import Decimal
from typing import Any, ClassVar, Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kfp_trainer.errors import InvalidSpecErrors, ValidationError
from kfp_trainer.quantity import parse_quantity
from kfp_trainer.spec.resources import fractional_devices, is_requirements, whole_devices_text

LOSSES = ("torchtune.modules.loss.CEWithChunkedOutputLoss",)
DATA_FORMATS = ("json", "csv", "parquet", "arrow", "text", "xml")
LORA_ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "output_proj")
LoraAttnModule = Literal["q_proj", "k_proj", "v_proj", "output_proj"]
#: The SDK's default ``ignore_patterns`` of model initializers (weights in other formats).
MODEL_IGNORE_PATTERNS = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
RESERVED_ENV_PREFIXES = ("PET_", "DMLC_", "OMPI_MCA_")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_RESOURCE_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

M = TypeVar("M", bound=BaseModel)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_resources(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """Resources in the SDK's flat shape (name -> quantity) or as a ResourceRequirements dict.

    Whole floats become ints (the API server stores ints); devices (GPUs) must be whole.
    """
    if value is None:
        return None
    if not value:
        raise ValueError("at least one resource, e.g. {'cpu': 4, 'memory': '16Gi', 'gpu': 1}")
    if is_requirements(value):
        out: dict[str, Any] = dict(value)
        for section in ("limits", "requests"):
            if section in value:
                if not isinstance(value[section], dict):
                    raise ValueError(f"{section}: a map of resource name to quantity")
                out[section] = _check_amounts(value[section], prefix=f"{section}.")
        if not (out.get("limits") or out.get("requests")):
            raise ValueError("limits and/or requests, e.g. {'limits': {'nvidia.com/gpu': 1}}")
        return out
    _check_devices(value, flat=True)
    return _check_amounts(value)


def _check_amounts(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    if prefix:
        _check_devices({prefix[:-1]: value}, flat=False)
    out: dict[str, Any] = {}
    for name, q in value.items():
        if not isinstance(name, str) or not _RESOURCE_NAME.match(name):
            raise ValueError(f"resource name {prefix}{name!r} is not a Kubernetes resource name")
        if isinstance(q, bool) or not isinstance(q, (int, float, str)):
            raise ValueError(f"{prefix}{name}: {q!r} is not a quantity (e.g. 4, '500m', '16Gi')")
        try:
            parsed = parse_quantity(q)
        except ValueError:
            raise ValueError(f"{prefix}{name}: {q!r} is not a quantity (e.g. 4, '500m', '16Gi')") from None
        if parsed < 0:
            raise ValueError(f"{prefix}{name}: {q!r} is negative")
        if isinstance(q, float):
            if parsed != parsed.to_integral_value():
                raise ValueError(f"{prefix}{name}: {q!r} is not a whole number; write it as a string, e.g. '{_milli(parsed)}'")
            q = int(q)
        out[name] = q
    return out


def _check_devices(resources: dict[str, Any], *, flat: bool) -> None:
    for section, name, quantity in fractional_devices({"limits": resources} if flat else resources):
        raise ValueError(f"{name if flat else f'{section}.{name}'}: {quantity!r} is not {whole_devices_text(name)}")


def _milli(d: Decimal) -> str:
    return f"{int(d * 1000)}m"


def _default_lora_attn_modules() -> list[LoraAttnModule]:
    return ["q_proj", "v_proj", "output_proj"]


class LoraSettings(_Strict):
    """LoRA / QLoRA / DoRA settings (SDK ``LoraConfig``); ``None`` keeps the runtime config's value."""

    apply_lora_to_mlp: bool | None = None
    apply_lora_to_output: bool | None = None
    lora_attn_modules: list[LoraAttnModule] = Field(default_factory=_default_lora_attn_modules)
    lora_rank: int | None = Field(default=None, ge=1)
    lora_alpha: int | float | None = Field(default=None, gt=0)
    # int kept as int: the SDK writes the value as given (``lora_dropout=0`` -> ``model.lora_dropout=0``)
    lora_dropout: int | float | None = Field(default=None, ge=0, lt=1)
    quantize_base: bool | None = None
    use_dora: bool | None = None

    @field_validator("lora_rank", "lora_alpha", "lora_dropout", mode="before")
    @classmethod
    def _numbers_not_bools(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("a number, not a bool")
        return v

    @field_validator("lora_attn_modules")
    @classmethod
    def _unique_modules(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"modules listed twice: {v}")
        return v


class InstructDatasetSettings(_Strict):
    """How torchtune's ``instruct_dataset`` reads the files (SDK ``TorchTuneInstructDataset``)."""

    source: Literal["json", "csv", "parquet", "arrow", "text", "xml"] | None = None
    split: str | None = None
    train_on_input: bool | None = None
    new_system_prompt: str | None = None
    column_map: dict[str, str] | None = None

    @field_validator("split", "new_system_prompt")
    @classmethod
    def _one_override(cls, v: str | None) -> str | None:
        # torchtune splits each override once on "=": a second one breaks the command line.
        if v is not None and ("=" in v or "\n" in v):
            raise ValueError("text without '=' or line breaks (torchtune reads each override as one key=value)")
        return v

    @field_validator("column_map")
    @classmethod
    def _columns(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        bad = sorted(set(v) - {"input", "output"})
        if bad:
            raise ValueError(f"keys 'input' and/or 'output' (the dataset's column for each), not {bad}")
        for key, col in v.items():
            if not col or any(ch in col for ch in "=,{}'\n"):
                raise ValueError(f"{key}: column name {col!r} must be non-empty, without = , {{ }} ' or line breaks")
        return v


class TorchTuneSettings(_Strict):
    """What a BuiltinTrainer fine-tune changes in the runtime's torchtune config (SDK ``TorchTuneConfig``)."""

    dtype: Literal["bf16", "fp32"] | None = None
    batch_size: int | None = Field(default=None, ge=1)
    epochs: int | None = Field(default=None, ge=1)
    loss: Literal["torchtune.modules.loss.CEWithChunkedOutputLoss"] | None = None
    num_nodes: int | None = Field(default=None, ge=1, le=1024)
    peft_config: LoraSettings | None = None
    dataset_preprocess_config: InstructDatasetSettings | None = None
    resources_per_node: dict[str, Any] | None = None

    @field_validator("loss", mode="before")
    @classmethod
    def _loss_short_name(cls, v: Any) -> Any:
        return f"torchtune.modules.loss.{v}" if v == "CEWithChunkedOutputLoss" else v

    _resources = field_validator("resources_per_node")(classmethod(lambda cls, v: _check_resources(v)))


class StorageSource(_Strict):
    """A dataset or model for the Trainer's initializers: ``hf://`` or ``s3://``, options, a Secret by name.

    ``ignore_patterns`` left out of a model source means the SDK's default patterns
    (:data:`MODEL_IGNORE_PATTERNS`); given as ``None`` it means none, as in the SDK.
    """

    #: Fields for which :func:`parse` keeps an explicit ``None`` (it means something else than leaving them out).
    explicit_none: ClassVar[tuple[str, ...]] = ("ignore_patterns",)

    storage_uri: str
    ignore_patterns: list[str] | None = None
    endpoint: str | None = None
    region: str | None = None
    role_arn: str | None = None
    secret_ref: str | None = None

    @field_validator("storage_uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.+)$", v)
        if not m or m.group(1) not in ("hf", "s3"):
            raise ValueError("an hf://<org>/<name>[/<path>] or s3://<bucket>/<path> URI")
        return v

    @field_validator("secret_ref")
    @classmethod
    def _secret(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 253 or not _DNS_SUBDOMAIN.match(v)):
            raise ValueError("the name of a Secret in the job's namespace (a DNS subdomain)")
        return v

    @field_validator("ignore_patterns")
    @classmethod
    def _patterns(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not p or "," in p for p in v):
            raise ValueError("non-empty glob patterns without commas (the initializer splits them on ',')")
        return v

    @field_validator("endpoint", "region", "role_arn")
    @classmethod
    def _s3_only(cls, v: str | None, info: pydantic.ValidationInfo) -> str | None:
        if v is not None and not str(info.data.get("storage_uri", "s3://")).startswith("s3://"):
            raise ValueError("nothing: it applies to s3:// sources only")
        return v

    @property
    def scheme(self) -> str:
        """``hf`` or ``s3``."""
        return self.storage_uri.split("://", 1)[0]


class FunctionTrainerSettings(_Strict):
    """A training function run as the SDK's ``CustomTrainer`` runs it (source, arguments, packages)."""

    func_source: str
    func_name: str
    func_file: str
    func_args: dict[str, Any] | None = None
    image: str | None = None
    packages_to_install: list[str] | None = None
    pip_index_urls: list[str] = Field(default_factory=lambda: ["https://pypi.org/simple"], min_length=1)
    num_nodes: int | None = Field(default=None, ge=1, le=1024)
    resources_per_node: dict[str, Any] | None = None
    env: dict[str, str] | None = None

    _resources = field_validator("resources_per_node")(classmethod(lambda cls, v: _check_resources(v)))

    @field_validator("func_name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not v.isidentifier() or keyword.iskeyword(v):
            raise ValueError("a Python function name")
        return v

    @field_validator("func_file")
    @classmethod
    def _file(cls, v: str) -> str:
        if not v or "/" in v or any(ch in v for ch in '"$`\\\n') or v in (".", ".."):
            raise ValueError('a file name such as train.py (no /, ", $, `, \\ or line breaks)')
        return v

    @field_validator("func_args")
    @classmethod
    def _kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            bad = [k for k in v if not (isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k))]
            if bad:
                raise ValueError(f"keyword-argument names (the function is called as func(**func_args)); not {bad}")
        return v

    @field_validator("packages_to_install")
    @classmethod
    def _packages(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not p.strip() or "\n" in p for p in v):
            raise ValueError("pip requirement strings, one per item")
        return v

    @field_validator("pip_index_urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not re.match(r"^https?://\S+$", u)]
        if bad:
            raise ValueError(f"http(s) URLs of package indexes, not {bad}")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for name in v or {}:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"{name}: names starting with {', '.join(RESERVED_ENV_PREFIXES)} are set by the Trainer")
        return v

    @pydantic.model_validator(mode="after")
    def _defines_function(self) -> FunctionTrainerSettings:
        import ast

        try:
            tree = ast.parse(self.func_source)
        except SyntaxError as e:
            raise ValueError(f"func_source does not parse as Python: {e.msg} (line {e.lineno})") from None
        if any(line.strip() == "EOM" for line in self.func_source.splitlines()):
            raise ValueError("func_source has a line 'EOM', which ends the shell here-document that carries it into the pod")
        names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if self.func_name not in names:
            raise ValueError(f"func_source defines no top-level function {self.func_name!r} (it defines {names or 'none'})")
        return self

    @classmethod
    def from_function(cls, func: Any, **settings: Any) -> FunctionTrainerSettings:
        """Settings for a Python function, read as the SDK reads it (``inspect.getsource``, file name).

        Example:
            >>> def train(lr):
            ...     print(lr)
            >>> FunctionTrainerSettings.from_function(train, func_args={"lr": 0.1}).func_name
            'train'
        """
        import inspect
        import os
        import textwrap

        if not callable(func):
            raise InvalidSpecErrors([ValidationError("func", type(func).__name__, "a Python function")])
        return parse(
            cls,
            func_source=textwrap.dedent(inspect.getsource(func)),
            func_name=func.__name__,
            func_file=os.path.basename(inspect.getfile(func)),
            **settings,
        )


def _errors(e: pydantic.ValidationError, prefix: str = "") -> list[ValidationError]:
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
        if err["type"] == "extra_forbidden":
            msg = "no such setting (the names follow the kubeflow SDK's)"
        elif err["type"] == "literal_error":
            msg = "one of " + msg.replace(" or ", ", ")
        out.append(ValidationError(prefix + loc if loc else prefix.rstrip(".") or "settings", err.get("input"), msg))
    return out


def parse(model: type[M], prefix: str = "", /, **values: Any) -> M:
    """Build ``model`` from plain values (``None`` = not set, but for the model's ``explicit_none`` fields); every problem in one error.

    Raises:
        InvalidSpecErrors: one :class:`~kfp_trainer.errors.ValidationError` per bad field.
    """
    try:
        keep = getattr(model, "explicit_none", ())
        return model(**{k: v for k, v in values.items() if v is not None or k in keep})
    except pydantic.ValidationError as e:
        raise InvalidSpecErrors(_errors(e, prefix)) from None
