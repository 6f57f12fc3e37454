"""A log handled a piece at a time relays exactly what handling it line by line relayed, byte for byte."""

from __future__ import annotations

import io
import random

from kfp_trainer.backends.base import LogLine
from kfp_trainer.backends.kube.bodylines import batches, each_line
from kfp_trainer.backends.kube.client import Stream
from kfp_trainer.backends.kube.logs import _Cursor, _text
from kfp_trainer.metrics import MetricSeries, parse_line
from kfp_trainer.relay import Printer
from kfp_trainer.timestamps import parse_timestamp

# Instants in the kubelet's form and in others; some that only look like one (a 31st of April, second 60).
STAMPS = [
    b"2026-05-01T10:00:01.000000001Z",
    b"2026-05-01T10:00:01.000000002Z",
    b"2026-05-01T10:00:01.5Z",
    b"2026-05-01T10:00:01.500000000Z",
    b"2026-05-01T10:00:01Z",
    b"2026-05-01T10:00:02.000000000Z",
    b"2026-05-01T09:59:59.999999999Z",
    b"2026-04-31T10:00:01.000000000Z",  # the same second as May 1st for the parser, not in bytes order
    b"2026-05-01T09:59:60.000000000Z",
    b"2026-05-01T10:00:0x.000000000Z",
    b"2026-13-01T10:00:01.000000000Z",
    b"2026-05-01T10:00:01.00000000aZ",
]
TEXTS = [b"loss=0.5 step=3", b"{'loss': 0.25, 'epoch': 1}", b"plain \t text", "Übung ✓".encode(), b"bad \xff\xfe utf-8 \xe2\x82",
         b"", b"ends in cr\r", b"two crs\r\r", b"mid\rcr", b"  ", b"x=1e999 y=2"]  # fmt: skip


def a_line(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.08:
        return rng.choice([b"", b" ", b"\r", b" \t\r"])  # blank
    if kind < 0.15:
        return rng.choice(TEXTS)  # no timestamp
    stamp = rng.choice(STAMPS[:3]) if rng.random() < 0.5 else rng.choice(STAMPS)
    return stamp + rng.choice([b" ", b"\r", b""]) + rng.choice(TEXTS) if rng.random() < 0.1 else stamp + b" " + rng.choice(TEXTS)


def line_by_line(reads: list[list[bytes]]) -> tuple[list[str], object]:
    """What the follower relayed when it took one line at a time (its former code, kept here as the reference)."""
    last, at_last, out = None, 0, []
    for read in reads:
        seen_at: dict = {}
        for raw in read:
            if not raw.strip():
                continue
            text = raw.rstrip(b"\r")
            stamp, _, rest = text.partition(b" ")
            ts = parse_timestamp(stamp)
            line = rest if ts is not None else text
            if ts is not None:
                seen_at[ts] = seen_at.get(ts, 0) + 1
                if last is None or ts > last:
                    last, at_last = ts, seen_at[ts]
                elif ts == last and seen_at[ts] > at_last:
                    at_last = seen_at[ts]
                else:
                    continue
            out.append(line.decode("utf-8", errors="replace"))
    return out, last


def in_pieces(reads: list[list[bytes]], rng: random.Random) -> tuple[list[str], object]:
    cursor, out = _Cursor(), []
    for read in reads:
        cursor.start_read()
        at = 0
        while at < len(read):
            size = rng.choice([1, 2, 5, 50])
            kept = cursor.take(read[at : at + size])
            at += size
            if kept:
                out.extend(_text(kept).split("\n"))
    return out, cursor.last


def test_lines_taken_a_piece_at_a_time_are_those_taken_one_by_one():
    rng = random.Random(7)
    for _ in range(3000):
        log = [a_line(rng) for _ in range(rng.randint(1, 12))]
        reads = [log]
        for _ in range(rng.randint(0, 2)):  # read again from some point on, as a resume from sinceTime does
            reads.append(log[rng.randint(0, len(log)) :] + [a_line(rng) for _ in range(rng.randint(0, 3))])
        assert in_pieces(reads, rng) == line_by_line(reads), reads


def test_a_resumed_read_in_the_kubelets_form_skips_exactly_the_lines_shown():
    stamp = b"2026-05-01T10:00:01.000000001Z "
    cursor = _Cursor()
    cursor.start_read()
    assert _text(cursor.take([stamp + b"a", stamp + b"b"])) == "a\nb"
    cursor.start_read()  # sinceTime has whole seconds: a and b come again
    assert _text(cursor.take([stamp + b"a", stamp + b"b", stamp + b"c", b"2026-05-01T10:00:02.000000000Z d"])) == "c\nd"
    assert cursor.last == (1777629602, 0)


class Body:
    def __init__(self, pieces):
        self.pieces = pieces

    def stream(self, amt=None, decode_content=True):
        yield from self.pieces


def test_a_body_in_any_pieces_gives_the_same_lines():
    rng = random.Random(3)
    for _ in range(500):
        body = b"".join(rng.choice([b"a", b"bc", b"\n", b" ", b"\r\n", b"\xff", b"{x=1}\n"]) for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.sample(range(len(body) + 1), min(len(body) + 1, rng.randint(0, 6))))
        pieces = [body[i:j] for i, j in zip([0, *cuts], [*cuts, len(body)], strict=True) if body[i:j]]
        expected = [line for line in body.split(b"\n") if line.strip()]
        assert list(each_line(Stream(Body(pieces), "GET /log"))) == expected
        assert [line for batch in batches(Stream(Body(pieces), "GET /log")) for line in batch if line.strip()] == expected


def test_metrics_of_lines_fed_together_are_those_fed_one_by_one():
    lines = ["epoch=0 step=1 loss=1.5 lr=3e-4", "note: no metric", "{'loss': 0.5, 'epoch': 1.0}", '{"step": 3, "acc": 0.9}', "", "=",
             "a = 1 b= .5 c=-2 x=1e999", "{", "rank=0 pid=7 loss=2", "trailing {'loss': 1}", "Übung=3 ü=4 tok/s=5"]  # fmt: skip
    rng = random.Random(5)
    for _ in range(300):
        picked = [rng.choice(lines) for _ in range(rng.randint(1, 8))]
        one_by_one = [point for line in picked for point in parse_line(line)]
        together = MetricSeries()
        together.feed_text("\n".join(picked))
        assert together.points == one_by_one


def test_a_batch_prints_what_its_lines_printed_one_by_one():
    texts = ["step=1 loss=0.5", "", "Übung ✓", "{'loss': 0.25}"]
    for prefix in (False, True):
        one, many = io.StringIO(), io.StringIO()
        single, batched = Printer(one, MetricSeries(), prefix, lambda: None), Printer(many, MetricSeries(), prefix, lambda: None)
        for text in texts:
            single(LogLine("node-1", text))
        batched(LogLine("node-1", "\n".join(texts[:2]), 2))
        batched(LogLine("node-1", "\n".join(texts[2:]), 2))
        single.close()
        batched.close()
        assert many.getvalue() == one.getvalue() and batched.count == single.count == 4
        assert batched.metrics.points == single.metrics.points
