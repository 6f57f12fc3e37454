"""The launcher's log printer: every relayed line reaches the step's log, a burst in few writes."""

from __future__ import annotations

import threading
import time

from kfp_trainer.backends.base import LogLine
from kfp_trainer.metrics import MetricSeries
from kfp_trainer.relay import Printer


class Pipe:
    """A text stream that records what was flushed, and how often."""

    def __init__(self) -> None:
        self.buffer: list[str] = []
        self.flushed = ""
        self.flushes = 0

    def write(self, text: str) -> int:
        self.buffer.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushes += 1
        self.flushed += "".join(self.buffer)
        self.buffer.clear()


def wait_for(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_a_lone_line_reaches_the_log_without_waiting_for_the_end():
    pipe = Pipe()
    printer = Printer(pipe, MetricSeries(), False, lambda: None)
    printer(LogLine("node-0", "epoch 1 loss=0.5"))
    assert wait_for(lambda: "epoch 1 loss=0.5\n" in pipe.flushed)
    printer.close()


def test_a_burst_of_lines_is_written_in_few_flushes_and_close_flushes_the_rest():
    pipe = Pipe()
    metrics = MetricSeries()
    printer = Printer(pipe, metrics, True, lambda: None)
    lines = [f"step={i} loss={1 / (i + 1):.4f}" for i in range(10_000)]
    for line in lines:
        printer(LogLine("node-1", line))
    printer.close()
    assert pipe.flushed == "".join(f"[node-1] {line}\n" for line in lines)
    assert pipe.flushes < 1_000
    assert printer.count == 10_000 and len(metrics.series("loss")) == 10_000


def test_close_leaves_no_flushing_thread_behind():
    before = set(threading.enumerate())
    printer = Printer(Pipe(), MetricSeries(), False, lambda: None)
    printer(LogLine("node-0", "x"))
    printer.close()
    assert [t.name for t in set(threading.enumerate()) - before] == []
