"""Offline models and datasets addressable by ``builtin://`` URIs.

Everything here is generated in code, deterministically, with no network
access, so pipelines can run end to end on a machine without internet:

* ``builtin://datasets/addition``: two-digit addition as an instruction task,
  records like ``{"prompt": "12+7=", "completion": "19"}`` in ``train.jsonl``
  and ``test.jsonl`` (held-out pairs never seen in training).
* ``builtin://models/tiny-char-lm``: a small randomly initialised Llama-style
  causal LM with a character-level tokenizer, saved as a regular Hugging Face
  model directory.
* ``builtin://datasets/addition-preference``: the same sums as preference pairs for DPO,
  ``{"prompt": "12+7=", "chosen": "19", "rejected": "18"}`` (the rejected answer is a
  near miss: off by one or ten, or a digit of the sum dropped or doubled).
* ``builtin://datasets/instruct-sums`` and ``builtin://models/tiny-qwen2.5``,
  ``tiny-llama3.2-1b``, ``tiny-llama3.2-3b``: an instruct dataset and tiny models of
  the Trainer's torchtune runtimes' architectures (:mod:`kfp_trainer.llm.tiny_models`).

The models are written with torch and transformers. An image without them (the component
image) serves builtins written when it was built (:mod:`kfp_trainer.trainers.prebuilt`):
:func:`materialize` copies them from ``$KFP_TRAINER_BUILTINS_DIR`` before it writes anything.

Usage::

    python -m kfp_trainer.trainers.builtin --list
    python -m kfp_trainer.trainers.builtin builtin://datasets/addition /tmp/data
    python -m kfp_trainer.trainers.builtin --prebuild /builtins builtin://models/tiny-char-lm

Only the standard library is imported at module level.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from kfp_trainer.trainers import prebuilt

SCHEME = "builtin"

ADDITION_SEED = 1234
ADDITION_MAX_OPERAND = 99
ADDITION_TEST_SIZE = 500

TINY_MODEL_SEED = 0
PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
# Printable ASCII (space to tilde), plus newline and tab.
CHARACTERS = "\n\t" + "".join(chr(c) for c in range(32, 127))


@dataclass(frozen=True)
class _Builtin:
    kind: str
    name: str
    description: str
    writer: Callable[[Path], None]


def _write_jsonl(path: Path, records: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def addition_records(
    seed: int = ADDITION_SEED,
    max_operand: int = ADDITION_MAX_OPERAND,
    test_size: int = ADDITION_TEST_SIZE,
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Builds the train and test records of the addition task.

    Every ordered pair ``a+b`` with ``0 <= a, b <= max_operand`` appears exactly
    once, in either the train or the test split.

    Args:
        seed: Seed of the shuffle that picks the held-out pairs.
        max_operand: Largest operand.
        test_size: Number of held-out pairs.

    Returns:
        The train records and the test records.
    """
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(pairs)
    records = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a, b in pairs]
    return records[test_size:], records[:test_size]


def near_miss(total: int, rng: random.Random) -> str:
    """A wrong answer close to ``total``: off by one or ten, or a digit dropped or doubled.

    Example:
        >>> sorted({near_miss(19, random.Random(s)) for s in range(40)})
        ['1', '119', '18', '199', '20', '29', '9']
    """
    text = str(total)
    candidates = {str(total + d) for d in (-10, -1, 1, 10) if total + d >= 0}
    if len(text) > 1:
        candidates |= {text[:i] + text[i + 1 :] for i in range(len(text))}
    candidates |= {text[: i + 1] + text[i:] for i in range(len(text))}
    candidates.discard(text)
    return rng.choice(sorted(candidates))


def addition_preference_records(seed: int = ADDITION_SEED) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The addition task's train and test records as preference pairs (the right sum chosen, a near miss rejected).

    Returns:
        The train and the test pairs (the test sums never appear in train).
    """
    rng = random.Random(seed + 1)
    train, test = addition_records(seed)

    def pair(r: dict[str, str]) -> dict[str, str]:
        return {"prompt": r["prompt"], "chosen": r["completion"], "rejected": near_miss(int(r["completion"]), rng)}

    return [pair(r) for r in train], [pair(r) for r in test]


def _write_addition_preference(dest: Path) -> None:
    train, test = addition_preference_records()
    _write_jsonl(dest / "train.jsonl", train)
    _write_jsonl(dest / "test.jsonl", test)
    info = {
        "name": "addition-preference",
        "uri": f"{SCHEME}://datasets/addition-preference",
        "description": "Two-digit addition as preference pairs: the sum chosen, a near miss rejected; test pairs never in train.",
        "format": "jsonl",
        "fields": ["prompt", "chosen", "rejected"],
        "splits": {"train": len(train), "test": len(test)},
        "seed": ADDITION_SEED,
    }
    (dest / "dataset_info.json").write_text(json.dumps(info, indent=2) + "\n")


def _write_addition(dest: Path) -> None:
    train, test = addition_records()
    _write_jsonl(dest / "train.jsonl", train)
    _write_jsonl(dest / "test.jsonl", test)
    info = {
        "name": "addition",
        "uri": f"{SCHEME}://datasets/addition",
        "description": "Two-digit addition as an instruction task; test pairs never appear in train.",
        "format": "jsonl",
        "fields": ["prompt", "completion"],
        "splits": {"train": len(train), "test": len(test)},
        "seed": ADDITION_SEED,
    }
    (dest / "dataset_info.json").write_text(json.dumps(info, indent=2) + "\n")


def build_char_tokenizer() -> object:
    """Builds the character-level tokenizer of the tiny model.

    Each printable ASCII character (plus newline and tab) is one token; other
    characters map to ``<unk>``. Encoding with special tokens prepends
    ``<bos>``.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in CHARACTERS:
        vocab[char] = len(vocab)
    # A BPE model without merges splits text into single characters.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=128,
    )


def _write_tiny_char_lm(dest: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kfp_trainer.trainers._common import save_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(TINY_MODEL_SEED)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.save_pretrained(str(dest), safe_serialization=True)
    save_tokenizer(tokenizer, dest)


def _tiny_torchtune_model(model_key: str) -> Callable[[Path], None]:
    def write(dest: Path) -> None:
        from kfp_trainer.llm import tiny_models

        tiny_models.write_builtin_model(dest, model_key)

    return write


def _write_instruct_sums(dest: Path) -> None:
    from kfp_trainer.llm import tiny_models

    tiny_models.write_builtin_dataset(dest)


_TORCHTUNE_MODELS = (("tiny-qwen2.5", "qwen2_5/1.5B"), ("tiny-llama3.2-1b", "llama3_2/1B"), ("tiny-llama3.2-3b", "llama3_2/3B"))

_REGISTRY: dict[tuple[str, str], _Builtin] = {
    (b.kind, b.name): b
    for b in (
        _Builtin(
            "datasets",
            "addition",
            "two-digit addition, prompt 'a+b=' and completion 'sum' (train/test JSONL)",
            _write_addition,
        ),
        _Builtin(
            "datasets",
            "addition-preference",
            "two-digit addition as preference pairs: prompt 'a+b=', chosen the sum, rejected a near miss (train/test JSONL)",
            _write_addition_preference,
        ),
        _Builtin(
            "models",
            "tiny-char-lm",
            "randomly initialised 4-layer Llama-style causal LM (~0.45M params), character tokenizer",
            _write_tiny_char_lm,
        ),
        _Builtin(
            "datasets",
            "instruct-sums",
            "64 instructions 'What is a+b?' with their sums, as parquet in data/ (what the torchtune runtimes read)",
            _write_instruct_sums,
        ),
        *(
            _Builtin(
                "models",
                name,
                f"randomly initialised 2-layer model of the {key} architecture (torchtune builders, HF safetensors,"
                " the runtime's tokenizer files): what the Trainer's torchtune runtimes train in local mode",
                _tiny_torchtune_model(key),
            )
            for name, key in _TORCHTUNE_MODELS
        ),
    )
}


def list_builtin() -> dict[str, list[str]]:
    """Lists the available builtin datasets and models.

    Returns:
        A mapping from kind (``datasets``, ``models``) to sorted names.
    """
    listing: dict[str, list[str]] = {"datasets": [], "models": []}
    for kind, name in _REGISTRY:
        listing.setdefault(kind, []).append(name)
    return {kind: sorted(names) for kind, names in listing.items()}


def _available() -> str:
    return ", ".join(f"{SCHEME}://{kind}/{name}" for kind, names in list_builtin().items() for name in names)


def parse_uri(uri: str) -> tuple[str, str]:
    """Splits a ``builtin://<kind>/<name>`` URI.

    Args:
        uri: The URI.

    Returns:
        The kind (``datasets`` or ``models``) and the name.

    Raises:
        ValueError: If the URI is malformed or names no builtin.
    """
    parsed = urlparse(uri)
    name = parsed.path.strip("/")
    if parsed.scheme != SCHEME or not parsed.netloc or not name or "/" in name:
        raise ValueError(f"not a builtin URI: {uri!r}; expected {SCHEME}://<datasets|models>/<name>; available: {_available()}")
    if (parsed.netloc, name) not in _REGISTRY:
        raise ValueError(f"unknown builtin {uri!r}; available: {_available()}")
    return parsed.netloc, name


def materialize(uri: str, dest: str | Path) -> Path:
    """Writes a builtin dataset or model into a directory (a copy of its prebuilt files where there are any).

    Args:
        uri: ``builtin://datasets/<name>`` or ``builtin://models/<name>``.
        dest: Directory to write to; created if missing, files in it overwritten.

    Returns:
        The destination directory.

    Raises:
        ValueError: If the URI names no builtin; the message lists the available ones.
        kfp_trainer.trainers.prebuilt.BuiltinUnavailableError: If it is not prebuilt here and its
            writer needs a package this environment lacks; the message names the image to use.
    """
    kind, name = parse_uri(uri)
    path = Path(dest)
    path.mkdir(parents=True, exist_ok=True)
    source = prebuilt.find(kind, name)
    if source is not None:
        shutil.copytree(source, path, dirs_exist_ok=True)
        return path
    try:
        _REGISTRY[(kind, name)].writer(path)
    except ImportError as e:
        raise prebuilt.unavailable(uri, e) from None
    return path


def prebuild(directory: str | Path, uris: list[str]) -> dict[str, object]:
    """Writes each builtin of ``uris`` under ``directory/<kind>/<name>``, and ``prebuilt.json``; returns the latter."""
    root = Path(directory)
    for uri in uris:
        kind, name = parse_uri(uri)
        materialize(uri, root / kind / name)
    prebuilt.make_readable(root)
    return prebuilt.write_info(root)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point.

    Args:
        argv: Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m kfp_trainer.trainers.builtin", description=__doc__.split("\n\n")[0])
    parser.add_argument("uri", nargs="?", help="builtin://datasets/<name> or builtin://models/<name>")
    parser.add_argument("dest", nargs="?", help="directory to write to")
    parser.add_argument("--list", action="store_true", help="print the available builtins as JSON")
    parser.add_argument("--prebuild", nargs="+", metavar=("DIR", "URI"),
                        help=f"write each URI under DIR/<kind>/<name>, with DIR/{prebuilt.INFO} (for ${prebuilt.ENV})")
    args = parser.parse_args(argv)
    if args.list:
        print(json.dumps(list_builtin()))
        return 0
    try:
        if args.prebuild:
            if len(args.prebuild) < 2:
                parser.error("--prebuild takes a directory and at least one URI")
            print(json.dumps(prebuild(args.prebuild[0], args.prebuild[1:])))
            return 0
        if not args.uri or not args.dest:
            parser.error("URI and DEST are required (or --list, --prebuild)")
        path = materialize(args.uri, args.dest)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"uri": args.uri, "path": str(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
