"""Metric parsing: JSON lines, HF Trainer dicts, Katib name=value, trainerStatus."""

from __future__ import annotations

import math
import random
import re
import threading

import pytest

from kfp_trainer import metrics
from kfp_trainer.metrics import MetricPoint, MetricSeries, from_trainer_status, lower_is_better, parse_line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"step": 10, "loss": 0.5, "learning_rate": 0.001}', [("loss", 0.5, 10, None), ("learning_rate", 0.001, 10, None)]),
        (
            "{'loss': 2.31, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.25}",
            [("loss", 2.31, None, 0.25), ("grad_norm", 1.5, None, 0.25), ("learning_rate", 5e-05, None, 0.25)],
        ),
        (
            "{'train_runtime': 12.5, 'train_samples_per_second': 80.1, 'train_loss': 0.9, 'epoch': 1.0}",
            [("train_runtime", 12.5, None, 1.0), ("train_samples_per_second", 80.1, None, 1.0), ("train_loss", 0.9, None, 1.0)],
        ),
        ("epoch 3: loss=0.52 accuracy=0.91", [("loss", 0.52, None, None), ("accuracy", 0.91, None, None)]),
        ("step=20 loss=1e-3 val/acc=0.5", [("loss", 0.001, 20, None), ("val/acc", 0.5, 20, None)]),
        ("INFO rank=0 world_size=4 loss=0.3", [("loss", 0.3, None, None)]),
        ('[rank0]: {"step": 1, "loss": 3.0}', [("loss", 3.0, 1, None)]),
        ("plain text line", []),
        ('{"loss": NaN}', []),
        ('{"loss": "n/a", "ok": true, "acc": 0.7}', [("acc", 0.7, None, None)]),
        ("Downloading model=bert-base", []),
        ("x==3 and y = z", []),
        ("", []),
    ],
)
def test_parse_line(line, expected):
    got = [(p.name, p.value, p.step, p.epoch) for p in parse_line(line)]
    assert got == expected


def test_series_final_best_and_dict():
    s = MetricSeries()
    for line in ['{"step": 1, "loss": 3.0, "acc": 0.1}', '{"step": 2, "loss": 1.0, "acc": 0.8}', '{"step": 3, "loss": 2.0, "acc": 0.5}']:
        s.feed(line)
    assert s.final() == {"loss": 2.0, "acc": 0.5}
    assert s.best() == {"loss": 1.0, "acc": 0.8}
    assert s.names() == ["loss", "acc"]
    assert s.to_dict()["loss"][1] == {"value": 1.0, "step": 2.0, "epoch": None}


def test_trainer_status_metrics():
    status = {"trainerStatus": {"metrics": [{"name": "loss", "value": "0.25"}, {"name": "bad", "value": "x"}], "lastUpdatedTime": "t"}}
    assert from_trainer_status(status) == [MetricPoint("loss", 0.25)]
    assert from_trainer_status(None) == [] and from_trainer_status({}) == []


def test_direction():
    assert lower_is_better("eval_loss") and lower_is_better("perplexity") and lower_is_better("wer")
    assert not lower_is_better("accuracy") and not lower_is_better("exact_match")


def test_best_is_kept_for_scores_only():
    s = MetricSeries()
    for line in ['{"step": 1, "loss": 2.0, "learning_rate": 0.001, "batch_size": 16}', '{"step": 2, "loss": 1.0, "learning_rate": 0.0005}']:
        s.feed(line)
    assert s.best() == {"loss": 1.0}
    assert s.final() == {"loss": 1.0, "learning_rate": 0.0005, "batch_size": 16.0}


def test_a_printed_dict_with_non_string_keys_is_parsed_not_raised():
    # e.g. a label map printed by the trainer; raising here would stop the log relay
    s = MetricSeries()
    assert s.feed("{0: 'cat', 1: 'dog'}") == 0
    assert s.feed("{0: 0.25, 'loss': 1.5}") == 2
    assert s.final() == {"0": 0.25, "loss": 1.5}


def test_lines_without_pairs_or_mappings_carry_no_metrics():
    assert parse_line("Epoch 3 finished in 12.5 s") == []
    assert parse_line("note:\tÜbung — données ✓ 7919") == []


def test_name_value_pairs_are_those_a_name_not_following_a_word_character_dot_or_dash_starts():
    # The rule written plainly (a look-behind before the name); the module's pattern is a faster spelling of it.
    plain = re.compile(r"(?<![\w.-])([A-Za-z][\w./-]*)\s*=\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])")
    rng = random.Random(11)
    alphabet = "ab Z9=.-+eE_/\t{}ü:,1"
    for _ in range(20000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert metrics._KATIB.findall(line) == plain.findall(line), line


def test_pairs_give_points_as_a_mapping_of_them_would():
    line = "epoch=2 step=10 loss=0.5 loss=0.25 rank=0 lr=3e-4 big=1e999 global_step=9"
    assert parse_line(line) == [MetricPoint("loss", 0.25, 10.0, 2.0), MetricPoint("lr", 3e-4, 10.0, 2.0)]
    assert parse_line("global_step=9 epoch=1e999 acc=0.5") == [MetricPoint("acc", 0.5, 9.0, None)]


def plainly(line: str) -> list[MetricPoint]:
    """The points of a line's name=value pairs by the rule written plainly: every match, the last value of a name."""
    pattern = re.compile(r"(?<![\w.-])([A-Za-z][\w./-]*)\s*=\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])")
    data = {key: float(value) for key, value in pattern.findall(line.strip())}
    step, epoch = data.get("step", data.get("global_step")), data.get("epoch")
    step = step if step is not None and math.isfinite(step) else None
    epoch = epoch if epoch is not None and math.isfinite(epoch) else None
    skip = {"step", "global_step", "epoch", "rank", "local_rank", "node_rank", "world_size", "pid", "port"}
    return [MetricPoint(k, v, step, epoch) for k, v in data.items() if k not in skip and math.isfinite(v)]


def test_lines_of_one_shape_with_other_names_or_values_give_their_own_points():
    rng = random.Random(13)
    words = ["step", "stop", "epoch", "eppch", "loss", "lass", "lr", "ab", "global_step", "rank", "x.y", "a-b", "tok/s", "Übung", "e"]
    numbers = ["0", "7", "12", "3.5", "1e5", "1E5", "1a5", "2F5", "-2", "+.5", "1e999", "9" * 400, "1.", "5x", "0.1.2"]
    seps = ["=", " = ", "= ", ":", "=="]
    for _ in range(20000):
        line = rng.choice(["", " ", "note: "]) + rng.choice([" ", "\t", ", "]).join(
            rng.choice(words) + rng.choice(seps) + rng.choice(numbers) for _ in range(rng.randint(1, 5)))  # fmt: skip
        assert parse_line(line) == plainly(line), line
    lines = [f"step={i} loss={1 / (i + 1):.4f} lr=3e-4" if i % 3 else f"stop={i} lass={i}.5 lr=1e999" for i in range(300)]
    series = MetricSeries()
    series.feed_text("\n".join(lines))
    assert series.points == [p for line in lines for p in plainly(line)]


def test_lines_fed_together_and_alone_and_points_added_keep_their_order():
    series = MetricSeries()
    series.feed_text("step=1 loss=2.0\nno metric here\n{'loss': 1.5}")
    series.feed("step=2 loss=1.0")
    series.extend([MetricPoint("eval_loss", 0.9)])
    series.feed_text("step=3 loss=0.5")
    assert [(p.name, p.value) for p in series.points] == [("loss", 2.0), ("loss", 1.5), ("loss", 1.0), ("eval_loss", 0.9), ("loss", 0.5)]
    assert series.final() == {"loss": 0.5, "eval_loss": 0.9}


def test_points_read_while_a_relay_thread_feeds_lose_and_repeat_nothing():
    series = MetricSeries()
    batches = [f"step={i} loss={i}.5\nnote {i}" for i in range(20000)]

    def feed():
        for text in batches:
            series.feed_text(text)

    thread = threading.Thread(target=feed)
    thread.start()
    seen = 0
    while thread.is_alive():
        now = len(series.points)
        assert now >= seen
        seen = now
    thread.join()
    assert [p.step for p in series.points] == [float(i) for i in range(20000)]
