"""The tiny models' tokenizers: learnt by the ``tokenizers`` library, read by torchtune's own tokenizers.

The torchtune runtimes load ``vocab.json`` + ``merges.txt`` (Qwen 2.5) or ``original/tokenizer.model``
(Llama 3.2) from the model folder; a tiny model's files must load there and encode the builtin
dataset's text into fewer tokens than bytes, and decode it back unchanged.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from kfp_trainer.llm import tiny_models

TEXTS = [f"{r['input']} {r['output']}" for r in tiny_models.addition_examples(tiny_models.BUILTIN_DATASET_ROWS)]
SAMPLE = "What is 12+7? 19"


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen")
    tiny_models.write_bpe_tokenizer(out, TEXTS)
    return out


@pytest.fixture(scope="module")
def tiktoken_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("llama")
    tiny_models.write_tiktoken_tokenizer(out, TEXTS)
    return out


def test_the_bpe_vocabulary_starts_with_the_bytes_in_gpt2_order_as_qwen_ships_it(bpe_dir: Path) -> None:
    vocab = json.loads((bpe_dir / "vocab.json").read_text(encoding="utf-8"))
    # Qwen 2.5's (and GPT-2's) vocab.json: "!" is 0, "Ā" (byte 0) is 188, "Ġ" (space) is 220.
    assert (vocab["!"], vocab["Ā"], vocab["Ġ"]) == (0, 188, 220)
    merges = (bpe_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0] == "#version: 0.2"
    learnt = [line.replace(" ", "") for line in merges[1:]]
    assert learnt and all(vocab[token] >= 256 for token in learnt)
    assert "What" in vocab and "Ġis" in vocab


def test_torchtune_reads_the_bpe_files_as_the_tokenizers_library_does(bpe_dir: Path) -> None:
    from torchtune.models.qwen2_5 import qwen2_5_tokenizer

    theirs = qwen2_5_tokenizer(path=str(bpe_dir / "vocab.json"), merges_file=str(bpe_dir / "merges.txt"))
    ids = theirs.encode(SAMPLE, add_bos=False, add_eos=False)
    assert theirs.decode(ids) == SAMPLE
    assert len(ids) < len(SAMPLE.encode())
    ours = Tokenizer(models.BPE.from_file(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt")))
    ours.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert ours.encode(SAMPLE).ids == ids


def test_torchtune_reads_the_tiktoken_ranks_and_round_trips_the_text(tiktoken_dir: Path) -> None:
    from torchtune.models.llama3 import llama3_tokenizer

    lines = (tiktoken_dir / "original" / "tokenizer.model").read_text().splitlines()
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines)}
    assert all(ranks[bytes([b])] == b for b in range(256)) and len(ranks) == len(lines) > 256
    assert ranks[b" is"] > 255 and ranks[b"What"] > 255
    tokenizer = llama3_tokenizer(str(tiktoken_dir / "original" / "tokenizer.model"))
    ids = tokenizer.encode(SAMPLE, add_bos=False, add_eos=False)
    assert tokenizer.decode(ids) == SAMPLE
    assert ranks[b"What"] in ids and len(ids) < len(SAMPLE.encode())
