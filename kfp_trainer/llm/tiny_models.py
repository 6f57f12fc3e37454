"""Tiny, offline stand-ins for the torchtune runtimes' models, tokenizers and datasets.

Each torchtune ClusterTrainingRuntime fine-tunes one model (Qwen 2.5 1.5B, Llama 3.2 1B/3B)
from ``/workspace/model`` on an instruct dataset in ``/workspace/dataset/data``. Local mode
has no model hub, so this module builds a model of the *same architecture* with torchtune's
own builders (2 layers, dim 64, the real vocabulary size so the fixed special-token ids stay
valid), saves it the way the Hub ships it (HF safetensors + ``config.json``, with the
tokenizer files the runtime's command names), and writes a small parquet instruct dataset.
The runtime's own ``tune run`` command then trains it, given :func:`tiny_model_overrides`.

Heavy imports (torch, torchtune, pyarrow) happen inside the functions.

Example:
    >>> arch = architecture_for_config("qwen2_5/1.5B_full")
    >>> (arch.model_key, arch.vocab_size, arch.tokenizer_kind)
    ('qwen2_5/1.5B', 151936, 'bpe')
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Written next to the weights: what :func:`tiny_model_overrides` needs to rebuild the model.
MARKER_FILE = "kfp_trainer_tiny_model.json"


@dataclass(frozen=True)
class TinyArchitecture:
    """A shrunken copy of one torchtune model family, keyed like the runtimes' configs."""

    model_key: str
    builder: str
    lora_builder: str
    model_type: str
    tokenizer_kind: str
    vocab_size: int
    checkpoint_files: tuple[str, ...]
    hf_model_type: str
    norm_eps: float
    rope_base: float
    dims: dict[str, int] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)

    def builder_kwargs(self) -> dict[str, object]:
        """Keyword arguments for the torchtune component builder (full or LoRA)."""
        return {
            "vocab_size": self.vocab_size,
            **self.dims,
            "norm_eps": self.norm_eps,
            "rope_base": self.rope_base,
            "tie_word_embeddings": True,
            **self.extra,
        }


_DIMS = {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 128, "max_seq_len": 512}
#: QLoRA quantizes every frozen linear to NF4 in blocks of 64 x 256 values: each weight needs a
#: multiple of 16,384 elements, which dim 64 with grouped-query attention cannot give.
QLORA_DIMS = {"num_layers": 2, "num_heads": 4, "num_kv_heads": 4, "embed_dim": 128, "intermediate_dim": 256, "max_seq_len": 512}
_QWEN: dict[str, Any] = {
    "builder": "torchtune.models.qwen2.qwen2",
    "lora_builder": "torchtune.models.qwen2.lora_qwen2",
    "model_type": "QWEN2",
    "tokenizer_kind": "bpe",
    "vocab_size": 151_936,
    "hf_model_type": "qwen2",
    "norm_eps": 1e-6,
    "rope_base": 1_000_000.0,
}
_LLAMA: dict[str, Any] = {
    "builder": "torchtune.models.llama3_2.llama3_2",
    "lora_builder": "torchtune.models.llama3_2.lora_llama3_2",
    "model_type": "LLAMA3_2",
    "tokenizer_kind": "tiktoken",
    "vocab_size": 128_256,
    "hf_model_type": "llama",
    "norm_eps": 1e-5,
    "rope_base": 500_000.0,
    "extra": {"scale_factor": 32},
}
#: Architectures of the models the Trainer v2.3 torchtune runtimes fine-tune; checkpoint file
#: names as the runtimes' torchtune configs list them.
ARCHITECTURES: dict[str, TinyArchitecture] = {
    "qwen2_5/1.5B": TinyArchitecture(model_key="qwen2_5/1.5B", checkpoint_files=("model.safetensors",), dims=_DIMS, **_QWEN),
    "llama3_2/1B": TinyArchitecture(model_key="llama3_2/1B", checkpoint_files=("model.safetensors",), dims=_DIMS, **_LLAMA),
    "llama3_2/3B": TinyArchitecture(
        model_key="llama3_2/3B",
        checkpoint_files=("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
        dims=_DIMS,
        **_LLAMA,
    ),
}


def architecture_for_config(config_name: str) -> TinyArchitecture:
    """The tiny architecture for a torchtune config name such as ``llama3_2/1B_lora``.

    Raises:
        ValueError: no tiny model exists for that config's model.
    """
    family, _, rest = config_name.partition("/")
    key = f"{family}/{rest.split('_', 1)[0]}"
    if key not in ARCHITECTURES:
        raise ValueError(f"no tiny model for torchtune config {config_name!r} (model {key!r}); known: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[key]


def tiny_model_overrides(arch: TinyArchitecture, *, lora: bool) -> list[str]:
    """``tune run`` overrides that make a runtime's config build the tiny model.

    The LoRA configs keep their own LoRA settings (rank, alpha, modules); only the builder and
    its size change.

    Example:
        >>> tiny_model_overrides(ARCHITECTURES["llama3_2/1B"], lora=False)[:2]
        ['model._component_=torchtune.models.llama3_2.llama3_2', 'model.vocab_size=128256']
    """
    builder = arch.lora_builder if lora else arch.builder
    return [f"model._component_={builder}"] + [f"model.{k}={v}" for k, v in arch.builder_kwargs().items()]


# --- the model --------------------------------------------------------------------------------


def _hf_config(arch: TinyArchitecture) -> dict[str, object]:
    d = arch.dims
    cfg: dict[str, object] = {
        "architectures": ["Qwen2ForCausalLM" if arch.hf_model_type == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch.hf_model_type,
        "vocab_size": arch.vocab_size,
        "hidden_size": d["embed_dim"],
        "intermediate_size": d["intermediate_dim"],
        "num_hidden_layers": d["num_layers"],
        "num_attention_heads": d["num_heads"],
        "num_key_value_heads": d["num_kv_heads"],
        "head_dim": d["embed_dim"] // d["num_heads"],
        "max_position_embeddings": d["max_seq_len"],
        "rms_norm_eps": arch.norm_eps,
        "rope_theta": arch.rope_base,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if arch.hf_model_type == "llama":
        cfg.update(
            bos_token_id=128000,
            eos_token_id=128009,
            rope_scaling={
                "factor": float(arch.extra["scale_factor"]),  # type: ignore[arg-type]
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
        )
    else:
        cfg.update(bos_token_id=151643, eos_token_id=151645, use_sliding_window=False)
    return cfg


def _hf_state_dict(arch: TinyArchitecture, seed: int) -> dict[str, Any]:
    import torch
    from torchtune import config as tt_config
    from torchtune.models import convert_weights
    from torchtune.models.qwen2 import qwen2_tune_to_hf

    torch.manual_seed(seed)
    model = tt_config._utils._get_component_from_path(arch.builder)(**arch.builder_kwargs())
    with torch.no_grad():
        model.tok_embeddings.weight.normal_(mean=0.0, std=0.02)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    d = arch.dims
    hf: dict[str, Any]
    if arch.model_type == "QWEN2":
        hf = qwen2_tune_to_hf(sd, num_heads=d["num_heads"], num_kv_heads=d["num_kv_heads"], dim=d["embed_dim"], tie_word_embeddings=True)
    else:
        hf = convert_weights.tune_to_hf(sd, num_heads=d["num_heads"], num_kv_heads=d["num_kv_heads"], dim=d["embed_dim"])
    return hf


def write_model(model_dir: str | Path, arch: TinyArchitecture, *, seed: int = 0) -> Path:
    """Write the tiny model as the Hub ships it: safetensors shard(s), index, ``config.json``."""
    from safetensors.torch import save_file

    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = _hf_state_dict(arch, seed)
    keys = sorted(hf)
    n = len(arch.checkpoint_files)
    shards = [keys[i * len(keys) // n : (i + 1) * len(keys) // n] for i in range(n)]
    weight_map = {}
    for fname, shard_keys in zip(arch.checkpoint_files, shards, strict=True):
        save_file({k: hf[k] for k in shard_keys}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard_keys})
    if n > 1:
        total = sum(t.numel() * t.element_size() for t in hf.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(_hf_config(arch), indent=2))
    (out / MARKER_FILE).write_text(json.dumps({"model_key": arch.model_key, "dims": arch.dims, "seed": seed}))
    return out


# --- tokenizers -------------------------------------------------------------------------------


def _train_bpe(texts: list[str], pattern: str, num_merges: int) -> Any:
    """A byte-level BPE learnt by the ``tokenizers`` library: text split by ``pattern``, then bytes.

    Returns the trained ``tokenizers.Tokenizer``; its vocabulary is the 256 byte symbols (in
    GPT-2's byte-to-unicode alphabet, GPT-2's order) followed by up to ``num_merges`` merged tokens.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) + num_merges, initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def write_bpe_tokenizer(model_dir: str | Path, texts: list[str], *, num_merges: int = 64) -> None:
    """``vocab.json`` + ``merges.txt`` (GPT-2 byte-level BPE, as Qwen ships them), learnt from ``texts``."""
    from torchtune.models.qwen2._tokenizer import PRETOKENIZE_REGEX

    _train_bpe(texts, PRETOKENIZE_REGEX, num_merges).model.save(str(model_dir))


def write_tiktoken_tokenizer(model_dir: str | Path, texts: list[str], *, num_merges: int = 64) -> None:
    """``original/tokenizer.model``: a tiktoken rank file (base64 token, rank), as Llama 3 ships it.

    Ranks 0-255 are the single bytes; the merged tokens follow in the order they were learnt.
    """
    from torchtune.models.llama3._tokenizer import CL100K_PATTERN
    from torchtune.models.qwen2._tokenizer import bytes_to_unicode

    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    learnt = _train_bpe(texts, CL100K_PATTERN, num_merges).get_vocab()
    ranks = [bytes([b]) for b in range(256)]
    for token in sorted(learnt, key=learnt.__getitem__)[256:]:
        ranks.append(bytes(byte_of[c] for c in token))
    path = Path(model_dir) / "original" / "tokenizer.model"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{base64.b64encode(tok).decode()} {rank}\n" for rank, tok in enumerate(ranks)))


# --- the dataset ------------------------------------------------------------------------------


def addition_examples(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """Instruct rows (``input``/``output`` columns, as ``instruct_dataset`` expects): 2-digit sums.

    Example:
        >>> addition_examples(1)[0]
        {'input': 'What is 59+63?', 'output': '122'}
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"input": f"What is {a}+{b}?", "output": str(a + b)})
    return rows


def write_dataset(data_dir: str | Path, rows: list[dict[str, str]]) -> Path:
    """Write ``rows`` as ``train.parquet`` in ``data_dir`` (the runtimes read ``dataset.data_dir``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(data_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, out / "train.parquet")
    return out / "train.parquet"


def write_workspace(workspace: str | Path, config_name: str, *, rows: int = 128, seed: int = 0, qlora: bool = False) -> TinyArchitecture:
    """Lay out ``<workspace>/model`` and ``<workspace>/dataset/data`` as a runtime's initializers would.

    ``qlora=True`` builds the model with :data:`QLORA_DIMS` so NF4 quantization can split it.

    Example (not run: it imports torch and torchtune):
        >>> write_workspace("/tmp/ws", "qwen2_5/1.5B_full")  # doctest: +SKIP
    """
    arch = architecture_for_config(config_name)
    if qlora:
        arch = dataclasses.replace(arch, dims=QLORA_DIMS)
    ws = Path(workspace)
    examples = addition_examples(rows, seed=seed)
    write_dataset(ws / "dataset" / "data", examples)
    model_dir = ws / "model"
    write_model(model_dir, arch, seed=seed)
    texts = [f"{r['input']} {r['output']}" for r in examples]
    if arch.tokenizer_kind == "bpe":
        write_bpe_tokenizer(model_dir, texts)
    else:
        write_tiktoken_tokenizer(model_dir, texts)
    return arch


#: Rows of the builtin instruct dataset: 16 optimizer steps of ``qwen2_5/1.5B_full`` on two ranks,
#: one of ``llama3_2/1B_full`` (batch 4, 8 accumulated batches).
BUILTIN_DATASET_ROWS = 64


def write_builtin_model(dest: str | Path, model_key: str, *, seed: int = 0) -> None:
    """A tiny model of ``model_key`` (e.g. ``qwen2_5/1.5B``) with its tokenizer, as a model initializer fetches it.

    The tokenizer's merges are learnt from the builtin instruct dataset's text.
    """
    arch = ARCHITECTURES[model_key]
    write_model(dest, arch, seed=seed)
    texts = [f"{r['input']} {r['output']}" for r in addition_examples(BUILTIN_DATASET_ROWS, seed=seed)]
    if arch.tokenizer_kind == "bpe":
        write_bpe_tokenizer(dest, texts)
    else:
        write_tiktoken_tokenizer(dest, texts)


def write_builtin_dataset(dest: str | Path, *, rows: int = BUILTIN_DATASET_ROWS, test_rows: int = 64, seed: int = 0) -> None:
    """The instruct dataset the torchtune runtimes read, with held-out rows for evaluation.

    ``data/train.parquet`` has ``input``/``output`` columns (``instruct_dataset``); ``test.jsonl``
    has ``prompt``/``completion`` records (what ``evaluate_model`` reads).
    """
    examples = addition_examples(rows + test_rows, seed=seed)
    write_dataset(Path(dest) / "data", examples[:rows])
    with open(Path(dest) / "test.jsonl", "w", encoding="utf-8") as f:
        for row in examples[rows:]:
            f.write(json.dumps({"prompt": row["input"] + " ", "completion": row["output"]}) + "\n")


def overrides_for(model_dir: str | Path, config_name: str) -> list[str]:
    """The tiny-model overrides for ``config_name`` if ``model_dir`` holds a tiny model, else ``[]``.

    Reads the marker :func:`write_model` leaves next to the weights; a real model has none.
    """
    marker = Path(model_dir) / MARKER_FILE
    if not marker.is_file():
        return []
    info = json.loads(marker.read_text())
    arch = dataclasses.replace(ARCHITECTURES[info["model_key"]], dims=info.get("dims") or _DIMS)
    return tiny_model_overrides(arch, lora="lora" in config_name.split("/")[-1])
