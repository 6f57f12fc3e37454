"""Lines that libraries and runtimes log are never metrics; the lines trainers print their metrics in still are.

The corpus (``tests/data/library_log_lines.txt``) holds lines of torchrun / torch.distributed.elastic,
c10d, gloo, NCCL (``NCCL_DEBUG=INFO``), ProcessGroupNCCL, Python logging and warnings, tracebacks,
transformers, TRL, PEFT, DeepSpeed, torchtune and Lightning, many with ``name=value`` pairs or a
mapping in them: before log lines were told apart, most of them gave metrics (a c10d warning's
``err=-3``, NCCL's ``nranks``, torchrun's ``master_port``, a ``Namespace(...)``'s ``lr``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kfp_trainer import metrics
from kfp_trainer.metrics import MetricSeries, is_log_line, parse_line

CORPUS = Path(__file__).resolve().parents[1] / "data" / "library_log_lines.txt"


def corpus() -> list[str]:
    """The corpus's lines (comments, ``## ``, and blank lines left out)."""
    return [line for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip() and not line.startswith("## ")]


def test_the_corpus_is_large_and_its_lines_are_traps():
    lines = corpus()
    assert len(lines) >= 80
    assert sum(("=" in line or "{" in line) for line in lines) >= 80  # most would be parsed, were they not told apart


@pytest.mark.parametrize("line", corpus())
def test_no_library_log_line_gives_a_metric(line):
    assert parse_line(line) == []
    series = MetricSeries()
    assert series.feed(line) == 0
    series.feed_text(line)
    assert series.points == []


def test_no_library_log_line_gives_a_metric_fed_together_and_twice():
    # The second time every line's shape has its plan: the cached path must decide as the first one did.
    lines = corpus()
    series = MetricSeries()
    for _ in range(2):
        series.feed_text("\n".join(lines))
        assert series.points == [], [p for p in series.points]
    # Each line that would give points were it not told apart is a log line (torchrun's "  master_port=29400": a name
    # that is never a metric).
    traps = [line for line in lines if metrics._from_pairs(metrics._KATIB.findall(line)) or "{" in line]
    assert len(traps) >= 80 and [line for line in traps if not is_log_line(line)] == []


def test_the_c10d_warning_of_a_two_node_job_gives_no_err_metric():
    # From the run that showed "err = -3" as a metric in the KFP UI: every node printed it.
    warning = "[W1207 04:18:16.154876372 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3"
    series = MetricSeries()
    series.feed_text("\n".join([warning, '{"step": 1, "loss": 2.0}', warning, '{"step": 2, "loss": 1.0}']))
    assert series.names() == ["loss"] and series.best() == {"loss": 1.0}


# (line, [(name, value, step, epoch), ...]) -- what trainers print their metrics in
METRIC_LINES = [
    ('{"epoch": 1, "loss": 2.1}', [("loss", 2.1, None, 1.0)]),
    ('{"step": 10, "loss": 0.5, "learning_rate": 0.001}', [("loss", 0.5, 10.0, None), ("learning_rate", 0.001, 10.0, None)]),
    (
        "{'loss': 0.52, 'grad_norm': 1.3, 'learning_rate': 5e-05, 'epoch': 0.5}",
        [("loss", 0.52, None, 0.5), ("grad_norm", 1.3, None, 0.5), ("learning_rate", 5e-05, None, 0.5)],
    ),
    # transformers' ProgressCallback (4.5x/5.x) prints its floats formatted, as strings
    (
        "{'loss': '0.5234', 'grad_norm': '1.3', 'learning_rate': '5e-05', 'epoch': '0.5'}",
        [("loss", 0.5234, None, 0.5), ("grad_norm", 1.3, None, 0.5), ("learning_rate", 5e-05, None, 0.5)],
    ),
    # ... through tqdm.write when the progress bar shares the stream: the bar is on the same line
    (
        "\r 10%|#         | 3/30 [00:01<00:10,  2.50it/s]{'loss': '0.5234', 'epoch': '0.1'}",
        [("loss", 0.5234, None, 0.1)],
    ),
    ("{'eval_loss': 0.4, 'eval_runtime': 1.2, 'epoch': 1.0}", [("eval_loss", 0.4, None, 1.0), ("eval_runtime", 1.2, None, 1.0)]),
    (
        "{'train_runtime': 12.3, 'train_samples_per_second': 24.4, 'train_loss': 0.61, 'epoch': 3.0}",
        [("train_runtime", 12.3, None, 3.0), ("train_samples_per_second", 24.4, None, 3.0), ("train_loss", 0.61, None, 3.0)],
    ),
    # TRL: DPO's rewards and log-probabilities, SFT's token accuracy
    (
        "{'loss': 0.6931, 'rewards/chosen': 0.0, 'rewards/margins': 0.0, 'logps/chosen': -100.5, 'epoch': 0.1}",
        [
            ("loss", 0.6931, None, 0.1),
            ("rewards/chosen", 0.0, None, 0.1),
            ("rewards/margins", 0.0, None, 0.1),
            ("logps/chosen", -100.5, None, 0.1),
        ],
    ),
    (
        "{'loss': 1.2, 'num_tokens': 4096.0, 'mean_token_accuracy': 0.55, 'epoch': 0.2}",
        [("loss", 1.2, None, 0.2), ("num_tokens", 4096.0, None, 0.2), ("mean_token_accuracy", 0.55, None, 0.2)],
    ),
    # transformers' Trainer.log_metrics block (printed, not logged)
    ("  train_loss               =     2.1234", [("train_loss", 2.1234, None, None)]),
    ("epoch 3: loss=0.52 accuracy=0.91", [("loss", 0.52, None, None), ("accuracy", 0.91, None, None)]),
    ("step=20 loss=0.25", [("loss", 0.25, 20.0, None)]),
    (
        "epoch=0 step=10 loss=0.5 lr=3.0e-04 tokens/s=123",
        [("loss", 0.5, 10.0, 0.0), ("lr", 3e-04, 10.0, 0.0), ("tokens/s", 123.0, 10.0, 0.0)],
    ),
    # torchrun's per-rank prefix (--tee / log_line_prefix_template) and PyTorch's [rank0]:
    ("[default0]:step=20 loss=0.25", [("loss", 0.25, 20.0, None)]),
    ('[rank0]: {"step": 1, "loss": 3.0}', [("loss", 3.0, 1.0, None)]),
    # Lightning's progress bar carries the logged metrics
    (
        "Epoch 1: 100%|##########| 30/30 [00:10<00:00, 2.90it/s, v_num=0, train_loss=0.52]",
        [("v_num", 0.0, None, None), ("train_loss", 0.52, None, None)],
    ),
    # a trainer's own words in capitals are not a log level
    ("INFO rank=0 world_size=4 loss=0.3", [("loss", 0.3, None, None)]),
    ("EVAL: acc=0.91 f1=0.88", [("acc", 0.91, None, None), ("f1", 0.88, None, None)]),
    ("Epoch(1/3) loss=0.52", [("loss", 0.52, None, None)]),
]


@pytest.mark.parametrize(("line", "expected"), METRIC_LINES)
def test_metric_lines_still_parse(line, expected):
    got = [(p.name, p.value, p.step, p.epoch) for p in parse_line(line)]
    assert got == expected
    assert not is_log_line(line.strip())
    series = MetricSeries()
    series.feed_text(f"{line}\n{line}")  # the second line of that shape takes the cached plan
    assert [(p.name, p.value, p.step, p.epoch) for p in series.points] == expected * 2


def test_torchtune_metric_lines_are_name_colon_value_and_are_read_from_its_log_files():
    # torchtune's StdoutLogger and DiskLogger print "Step N | name:value ..." (no "="): the stream does not parse them;
    # torchtune_finetune reads them from the DiskLogger's files (kfp_trainer.llm.tune_output).
    from kfp_trainer.llm.tune_output import points_in

    line = "Step 10 | loss:1.2345 lr:2e-05 tokens_per_second_per_gpu:812.5 peak_memory_alloc:2.35"
    assert parse_line(line) == []
    assert [(p.name, p.value, p.step) for p in points_in(line)][:2] == [("loss", 1.2345, 10.0), ("learning_rate", 2e-05, 10.0)]


def test_a_json_line_with_numerals_as_strings_keeps_them_out():
    # Only a printed Python dict (transformers' formatting) has its numerals counted; JSON keeps its types.
    assert [(p.name, p.value) for p in parse_line('{"run": "42", "loss": 0.5}')] == [("loss", 0.5)]


def test_distributed_setup_names_are_never_metrics():
    line = "  restart_count=0 master_port=29400 group_rank=1 group_world_size=2 local_world_size=1 nranks=2 loss=0.5"
    assert [p.name for p in parse_line(line)] == ["loss"]
    assert [p.name for p in parse_line('{"group_rank": 0, "nnodes": 2, "nproc_per_node": 8, "acc": 0.5}')] == ["acc"]


def test_lines_of_one_shape_are_told_apart_by_their_words():
    # "INFO:" and "LOSS:" have one shape: the shape says "check", the words decide.
    series = MetricSeries()
    series.feed_text("INFO:root:step=1 loss=2.0\nLOSS:xyzz:step=1 loss=2.0\nWARN:root:step=2 loss=1.0\nEVAL:part:step=2 loss=1.0")
    assert [(p.name, p.value, p.step) for p in series.points] == [("loss", 2.0, 1.0), ("loss", 1.0, 2.0)]


def test_the_shape_check_never_lets_a_log_line_through():
    # Lines of one shape share a plan, and only shapes that may be a log line's are checked: whatever the words, the points
    # of a line are those of its pairs unless it is a log line, the first time its shape is seen and every time after.
    import random

    rng = random.Random(7)
    heads = ["", "  ", "[rank0]:", "[default1]: ", "INFO:root:", "INFO ", "LOSS:", "W1207 04:18:16.1 x.py:1] ",
             "[W x.cpp:2] ", "h:1:2 [0] NCCL INFO ", "Eval ", "EVAL: ", "Note(", "x.py:3: UserWarning: ", "  Num Epochs ",
             "- INFO - ", "f(a, "]  # fmt: skip
    pairs = ["loss=0.5", "acc = 0.9", "step=3", "lr=1e-4", "k=2,", "Val=1", "x(y=2)", "n=7)"]
    for _ in range(5000):
        line = rng.choice(heads) + " ".join(rng.choice(pairs) for _ in range(rng.randint(1, 3)))
        expected = [] if is_log_line(line) else metrics._from_pairs(metrics._KATIB.findall(line))
        assert parse_line(line) == expected, line
        assert parse_line(line) == expected, line  # the cached plan
