"""kfp_trainer.data: every record shape in every file format, the split layouts, the held-out slice, the errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kfp_trainer.data import DatasetError, chat_renderer, discover, load_split
from kfp_trainer.data.splits import holdout

ALPACA_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\nAdd the numbers.\n\n"
    "### Input:\n2 and 3\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\nSay hi.\n\n### Response:\n"
)
MULTI_TURN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "1+1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "thanks"},
]

# shape -> (records, the examples they must give)
SHAPES: dict[str, tuple[list[dict[str, Any]], list[dict[str, str]]]] = {
    "prompt_completion": (
        [{"prompt": "12+7=", "completion": "19", "id": "a"}, {"prompt": "1+1=", "completion": "2", "id": "b"}],
        [{"prompt": "12+7=", "completion": "19"}, {"prompt": "1+1=", "completion": "2"}],
    ),
    "alpaca": (
        [
            {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5", "text": "ignored"},
            {"instruction": "Say hi.", "input": "", "output": "hi", "text": "ignored"},
        ],
        [{"prompt": ALPACA_INPUT, "completion": "5"}, {"prompt": ALPACA_NO_INPUT, "completion": "hi"}],
    ),
    "dolly": (
        [
            {"instruction": "Add the numbers.", "context": "2 and 3", "response": "5", "category": "math"},
            {"instruction": "Say hi.", "context": "", "response": "hi", "category": "chat"},
        ],
        [{"prompt": ALPACA_INPUT, "completion": "5"}, {"prompt": ALPACA_NO_INPUT, "completion": "hi"}],
    ),
    "messages": (
        [
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "2+3?"},
                    {"role": "assistant", "content": "5"},
                ]
            },
            {"messages": MULTI_TURN},
        ],
        [
            {"prompt": "<|system|>\nBe brief.\n<|user|>\n2+3?\n<|assistant|>\n", "completion": "5"},
            {"prompt": "<|user|>\nHi\n<|assistant|>\nHello\n<|user|>\n1+1?\n<|assistant|>\n", "completion": "2"},
        ],
    ),
    "sharegpt": (
        [
            {"conversations": [{"from": "human", "value": "2+3?"}, {"from": "gpt", "value": "5"}]},
            {
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "Hi"},
                    {"from": "gpt", "value": "Hello"},
                ]
            },
        ],
        [
            {"prompt": "<|user|>\n2+3?\n<|assistant|>\n", "completion": "5"},
            {"prompt": "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n", "completion": "Hello"},
        ],
    ),
    "conversational_prompt_completion": (
        [
            {"prompt": [{"role": "user", "content": "2+3?"}], "completion": [{"role": "assistant", "content": "5"}]},
            {"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello"}]},
        ],
        [
            {"prompt": "<|user|>\n2+3?\n<|assistant|>\n", "completion": "5"},
            {"prompt": "<|user|>\nHi\n<|assistant|>\n", "completion": "Hello"},
        ],
    ),
    "question_answer": (
        [{"question": "2+3?", "answer": "5"}, {"question": "Capital of France?", "answer": "Paris"}],
        [
            {"prompt": "Question: 2+3?\nAnswer: ", "completion": "5"},
            {"prompt": "Question: Capital of France?\nAnswer: ", "completion": "Paris"},
        ],
    ),
    "input_output": (
        [{"input": "2+3=", "output": "5"}, {"input": "1+1=", "output": "2"}],
        [{"prompt": "2+3=", "completion": "5"}, {"prompt": "1+1=", "completion": "2"}],
    ),
}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})


def write_arrow_stream(path: Path, rows: list[dict[str, Any]]) -> None:
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def write_save_to_disk(folder: Path, rows: list[dict[str, Any]]) -> None:
    """A folder laid out as ``datasets.Dataset.save_to_disk`` leaves it."""
    folder.mkdir(parents=True)
    write_arrow_stream(folder / "data-00000-of-00001.arrow", rows)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))


FORMATS = {
    "jsonl": lambda d, split, rows: write_jsonl(d / f"{split}.jsonl", rows),
    "json_list": lambda d, split, rows: (d / f"{split}.json").write_text(json.dumps(rows, indent=1)),
    "json_data": lambda d, split, rows: (d / f"{split}.json").write_text(json.dumps({"data": rows})),
    "json_lines_named_json": lambda d, split, rows: write_jsonl(d / f"{split}.json", rows),
    "csv": lambda d, split, rows: write_csv(d / f"{split}.csv", rows),
    "parquet": lambda d, split, rows: pq.write_table(pa.Table.from_pylist(rows), d / f"{split}.parquet"),
    "save_to_disk": lambda d, split, rows: write_save_to_disk(d / split, rows),
}


def quiet(_: str) -> None:
    pass


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_in_every_format(tmp_path: Path, shape: str, fmt: str) -> None:
    rows, expected = SHAPES[shape]
    FORMATS[fmt](tmp_path, "train", rows)
    FORMATS[fmt](tmp_path, "test", rows[::-1])
    if fmt == "save_to_disk":
        (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert load_split(tmp_path, "train", log=quiet) == expected
    assert load_split(tmp_path, "test", log=quiet) == expected[::-1]


def alpaca_rows(n: int) -> list[dict[str, str]]:
    return [
        {"instruction": f"Add {i} and {i + 1}.", "input": "" if i % 3 else f"{i}", "output": str(2 * i + 1), "text": "t"} for i in range(n)
    ]


def hub_snapshot(root: Path, rows: list[dict[str, Any]]) -> Path:
    """What ``snapshot_download(repo_type="dataset", local_dir=root)`` leaves for a one-split parquet dataset."""
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "data" / "train-00000-of-00001-a09b74b3ef9c3b56.parquet")
    (root / "README.md").write_text("---\nlicense: cc-by-nc-4.0\n---\n")
    (root / ".gitattributes").write_text("*.parquet filter=lfs\n")
    meta = root / ".cache" / "huggingface" / "download" / "data"
    meta.mkdir(parents=True)
    (meta / "train-00000-of-00001-a09b74b3ef9c3b56.parquet.metadata").write_text("abc\n")
    (root / ".cache" / "huggingface" / "stray.jsonl").write_text('{"prompt": "x", "completion": "y"}\n')
    return root


def test_hub_snapshot_without_test_split_holds_out_a_slice_of_train(tmp_path: Path) -> None:
    rows = alpaca_rows(200)
    hub_snapshot(tmp_path, rows)
    lines: list[str] = []
    train = load_split(tmp_path, "train", log=lines.append)
    test = load_split(tmp_path, "test", log=lines.append)
    assert (len(train), len(test)) == (190, 10)
    prompts = {e["prompt"] for e in train}
    assert not prompts & {e["prompt"] for e in test}
    assert len(prompts | {e["prompt"] for e in test}) == 200
    assert any("holding out a slice of train" in line for line in lines)
    assert any("no 'test' or validation split" in line and "held out" in line for line in lines)
    assert load_split(tmp_path, "test", log=quiet) == test  # deterministic
    assert sorted(discover(tmp_path).splits) == ["train"]


def test_holdout_depends_on_the_records_not_their_order_and_keeps_duplicates_together() -> None:
    rows = [{"prompt": str(i), "completion": str(i)} for i in range(100)]
    held = {rows[i]["prompt"] for i in holdout(rows)}
    reversed_rows = rows[::-1]
    assert {reversed_rows[i]["prompt"] for i in holdout(reversed_rows)} == held and len(held) == 5
    doubled = rows + rows
    assert len(holdout(doubled)) == 10 and {doubled[i]["prompt"] for i in holdout(doubled)} == held
    assert len(holdout([{"a": str(i)} for i in range(100_000)])) == 1000
    assert holdout([{"a": "1"}]) == set() and len(holdout([{"a": "1"}, {"a": "2"}])) == 1


def test_validation_split_stands_in_for_a_missing_test_split(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a", "completion": "1"}, {"prompt": "b", "completion": "2"}])
    (tmp_path / "dev").mkdir()
    write_jsonl(tmp_path / "dev" / "part-0.jsonl", [{"prompt": "c", "completion": "3"}])
    lines: list[str] = []
    assert load_split(tmp_path, "test", log=lines.append) == [{"prompt": "c", "completion": "3"}]
    assert any("reading the validation split instead" in line for line in lines)
    assert len(load_split(tmp_path, "train", log=quiet)) == 2  # nothing held out: there is a validation split
    assert load_split(tmp_path, "validation", log=quiet) == [{"prompt": "c", "completion": "3"}]


def test_split_subfolders_and_shards_are_read_together_in_name_order(tmp_path: Path) -> None:
    for split, count in (("train", 3), ("test", 1)):
        (tmp_path / "default" / split).mkdir(parents=True)
        for shard in range(count):
            rows = [{"prompt": f"{split}{shard}", "completion": str(shard)}]
            pq.write_table(pa.Table.from_pylist(rows), tmp_path / "default" / split / f"{shard:04d}.parquet")
    assert [e["prompt"] for e in load_split(tmp_path, "train", log=quiet)] == ["train0", "train1", "train2"]
    assert [e["prompt"] for e in load_split(tmp_path, "test", log=quiet)] == ["test0"]


def test_hub_splits_of_any_name(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    for split in ("train_sft", "test_sft", "train_gen"):
        rows = [{"messages": [{"role": "user", "content": split}, {"role": "assistant", "content": "ok"}]}]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / f"{split}-00000-of-00001.parquet")
    assert sorted(discover(tmp_path).splits) == ["test_sft", "train_gen", "train_sft"]
    assert load_split(tmp_path, "train_sft", log=quiet) == [{"prompt": "<|user|>\ntrain_sft\n<|assistant|>\n", "completion": "ok"}]


def test_a_lone_file_of_any_name_is_the_train_split(tmp_path: Path) -> None:
    (tmp_path / "alpaca_data.json").write_text(json.dumps(alpaca_rows(40)))
    train, test = load_split(tmp_path, "train", log=quiet), load_split(tmp_path, "test", log=quiet)
    assert (len(train), len(test)) == (38, 2)


def test_a_lone_save_to_disk_dataset_is_the_train_split(tmp_path: Path) -> None:
    write_save_to_disk(tmp_path / "ds", alpaca_rows(20))
    assert len(load_split(tmp_path / "ds", "train", log=quiet)) == 19
    assert len(load_split(tmp_path / "ds", "test", log=quiet)) == 1


def test_a_file_given_directly_is_read_whole_for_any_split(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "mine.jsonl", [{"question": "q", "answer": "a"}])
    expected = [{"prompt": "Question: q\nAnswer: ", "completion": "a"}]
    assert load_split(tmp_path / "mine.jsonl", "train", log=quiet) == load_split(tmp_path / "mine.jsonl", "test", log=quiet) == expected


def test_builtin_addition_dataset_reads_as_before(tmp_path: Path) -> None:
    from kfp_trainer.trainers import builtin

    builtin.materialize("builtin://datasets/addition", tmp_path)
    for split in ("train", "test"):
        raw = [json.loads(line) for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
        assert load_split(tmp_path, split, log=quiet) == raw


def test_builtin_instruct_sums_dataset_evaluates_on_its_test_jsonl(tmp_path: Path) -> None:
    from kfp_trainer.trainers import builtin

    builtin.materialize("builtin://datasets/instruct-sums", tmp_path)
    raw_test = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert load_split(tmp_path, "test", log=quiet) == raw_test
    raw_train = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    assert load_split(tmp_path, "train", log=quiet) == [{"prompt": r["input"], "completion": r["output"]} for r in raw_train]


def test_chat_prompts_use_the_tokenizer_chat_template_without_a_second_bos() -> None:
    class Tokenizer:
        chat_template = "{{ whatever }}"
        bos_token = "<s>"

        def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
            assert not tokenize and add_generation_prompt
            return "<s>" + "".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]"

    render = chat_renderer(Tokenizer())
    assert render is not None
    assert render([{"role": "user", "content": "Hi"}]) == "[user]Hi[assistant]"
    Tokenizer.chat_template = None
    assert chat_renderer(Tokenizer()) is None


def test_chat_renderer_reaches_the_records(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", SHAPES["messages"][0])
    write_jsonl(tmp_path / "test.jsonl", SHAPES["messages"][0])
    examples = load_split(tmp_path, "train", render_chat=lambda turns: "|".join(t["role"] for t in turns), log=quiet)
    assert examples == [{"prompt": "system|user", "completion": "5"}, {"prompt": "user|assistant|user", "completion": "2"}]


SECRET = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def test_columns_of_no_accepted_shape_are_named_but_never_their_values(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist([{"text": SECRET, "label": 1}]), tmp_path / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(DatasetError) as e:
        load_split(tmp_path, "train", log=quiet)
    message = str(e.value)
    assert "data/train-00000-of-00001.parquet" in message and "['text', 'label']" in message
    assert "instruction+output" in message and "messages" in message and "prompt+completion" in message
    assert SECRET not in message


def test_a_missing_split_names_the_splits_files_and_columns_found(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": SECRET, "completion": "x"}])
    with pytest.raises(DatasetError) as e:
        load_split(tmp_path, "validation", log=quiet)
    message = str(e.value)
    assert "no 'validation' split" in message and "['train']" in message and "train.jsonl" in message
    assert "['prompt', 'completion']" in message and SECRET not in message


def test_a_folder_without_data_files_lists_what_it_holds(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0")
    (tmp_path / "dataset_info.json").write_text("{}")
    with pytest.raises(DatasetError) as e:
        load_split(tmp_path, "train", log=quiet)
    message = str(e.value)
    assert "no data files" in message and "weights.bin" in message and "prompt+completion" in message


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([{"prompt": "p", "completion": {"secret": SECRET}}], "train.jsonl, record 1: column 'completion' is a dict; expected text"),
        ([{"prompt": "p", "completion": "c"}, {"prompt": None, "completion": "c"}], "record 2: column 'prompt' is missing"),
        ([{"messages": [{"role": "user", "content": SECRET}]}], "record 1: column 'messages' has no assistant turn"),
        ([{"messages": [{"role": "user", "text": SECRET}]}], "record 1: messages[0] needs a text role/from and content/value"),
        ([{"messages": SECRET}], "record 1: column 'messages' must be a non-empty list"),
    ],
)
def test_bad_records_name_the_record_and_column_but_not_the_value(tmp_path: Path, rows: list[dict[str, Any]], needle: str) -> None:
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "p", "completion": "c"}])
    with pytest.raises(DatasetError) as e:
        load_split(tmp_path, "train", log=quiet)
    assert needle in str(e.value) and SECRET not in str(e.value)


def test_malformed_files_name_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "' + SECRET + "\n")
    with pytest.raises(DatasetError, match=r"train.jsonl, line 2: not valid JSON") as e:
        load_split(tmp_path, "train", log=quiet)
    assert SECRET not in str(e.value)
    (tmp_path / "train.jsonl").unlink()
    (tmp_path / "train.parquet").write_bytes(b"not parquet " + SECRET.encode())
    with pytest.raises(DatasetError, match=r"train.parquet: cannot be read as parquet") as e:
        load_split(tmp_path, "train", log=quiet)
    assert SECRET not in str(e.value)
    with pytest.raises(DatasetError, match="no such file or directory"):
        load_split(tmp_path / "nope", "train", log=quiet)


def test_the_reader_imports_neither_torch_nor_pyarrow() -> None:
    code = "import sys, kfp_trainer.data; print(sorted({'torch', 'pyarrow', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
