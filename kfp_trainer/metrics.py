"""Training output lines -> metric time series. Pure: no I/O.

Understands the formats trainers print:

* JSON lines: ``{"step": 10, "loss": 0.52, "learning_rate": 0.001}``
* Hugging Face Trainer log dicts: ``{'loss': 0.52, 'grad_norm': 1.3, 'epoch': 0.5}``
* Katib-style ``name=value`` pairs: ``epoch 3: loss=0.52 accuracy=0.91``
* Trainer's ``status.trainerStatus.metrics`` (``[{"name": ..., "value": ...}]``)

``step``, ``epoch`` and ``global_step`` are positions, not metrics: a point carries them.

Example:
    >>> series = MetricSeries()
    >>> series.feed("{'loss': 0.5, 'epoch': 1.0}")
    1
    >>> series.feed("step=20 loss=0.25 accuracy=0.9")
    2
    >>> series.final()
    {'loss': 0.25, 'accuracy': 0.9}
    >>> series.best()["loss"]
    0.25
"""

from __future__ import annotations

import ast
import json
import math
import re
import string
import threading
from collections.abc import Callable, Mapping
from functools import partial
from math import isfinite
from operator import itemgetter
from typing import Any, NamedTuple

POSITION_KEYS = ("step", "global_step", "epoch")
# name=value; the name's first letter comes first (the search skips to letters) and is then checked not to follow
# [\w.-]: the same as a look-behind before it, found faster; possessive where nothing could be given back anyway.
_KATIB = re.compile(r"([A-Za-z](?<![\w.-][A-Za-z])[\w./-]*+)\s*+=\s*+([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])")
_LOWER_IS_BETTER = re.compile(r"(loss|perplexity|ppl|error|err|mse|mae|rmse|wer|cer)", re.IGNORECASE)
# A line's shape: ASCII letters as "a" (e and E as "e", the pattern's exponent), digits as "0", all else kept.
_SHAPE = bytes.maketrans(
    (string.ascii_letters.replace("e", "").replace("E", "") + "eE" + string.digits).encode(), b"a" * 50 + b"ee" + b"0" * 10
)
_PLANS: dict[bytes, _Plan | None] = {}  # by shape; None: no pairs
_POSITIONS = frozenset(POSITION_KEYS)
_SKIP_KEYS = frozenset({"rank", "local_rank", "node_rank", "world_size", "pid", "port"})
_NOT_METRICS = _POSITIONS | _SKIP_KEYS
# Settings and throughput, not results: they have a last value but no "best" one.
_NOT_A_SCORE = re.compile(r"(learning_rate|^lr$|runtime|per_second|grad_norm|epoch|steps?$|batch_size)")


class MetricPoint(NamedTuple):
    """One value of one metric at one position of training (a named tuple: cheap to make per log line)."""

    name: str
    value: float
    step: float | None = None
    epoch: float | None = None


_point = partial(tuple.__new__, MetricPoint)  # MetricPoint((name, value, step, epoch)) without the keyword handling


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _from_mapping(data: dict[str, Any]) -> list[MetricPoint]:
    step = _numeric(data.get("step", data.get("global_step")))
    epoch = _numeric(data.get("epoch"))
    points = []
    for key, raw in data.items():
        if key in _POSITIONS or key in _SKIP_KEYS:  # keys of a printed dict need not be strings
            continue
        value = raw if type(raw) is float and math.isfinite(raw) else _numeric(raw)
        if value is not None:
            points.append(MetricPoint(str(key), value, step, epoch))
    return points


def parse_line(line: str) -> list[MetricPoint]:
    """Metric points in one line of training output (empty when there are none).

    Example:
        >>> parse_line('{"step": 3, "loss": 1.5}')
        [MetricPoint(name='loss', value=1.5, step=3.0, epoch=None)]
        >>> parse_line("{0: 'cat', 1: 0.5}")
        [MetricPoint(name='1', value=0.5, step=None, epoch=None)]
    """
    if "=" not in line and "{" not in line:  # neither name=value pairs nor a mapping: most lines
        return []
    text = line.strip()
    start = text.find("{")
    if start != -1 and text.endswith("}"):
        blob = text[start:]
        for loader in (json.loads, ast.literal_eval):
            try:
                data = loader(blob)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(data, dict):
                return _from_mapping(data)
    return _pair_points(line)


def _pair_points(line: str) -> list[MetricPoint]:
    """The points of the ``name=value`` pairs in ``line`` (as :func:`_from_pairs` of the pattern's matches).

    The pattern tells letters, ``e``/``E`` and digits apart only by those classes, so lines
    of one shape (:data:`_SHAPE`) have their pairs at the same places: the pattern runs once
    per shape (:class:`_Plan`), and each line is cut where its first one matched.
    """
    shape = line.encode("utf-8", "surrogatepass").translate(_SHAPE)
    try:
        plan = _PLANS[shape]
    except KeyError:
        spans = [(m.start(1), m.end(1), m.start(2), m.end(2)) for m in _KATIB.finditer(line)]
        plan = _Plan(line, spans) if spans else None
        if len(_PLANS) >= 4096:
            _PLANS.clear()
        _PLANS[shape] = plan
    return plan.points(line) if plan is not None else []


class _Plan:
    """Where the pairs of one line shape are, and what the first line of that shape named them."""

    __slots__ = ("names", "names_of", "values_of", "metrics", "step", "epoch")

    def __init__(self, line: str, spans: list[tuple[int, int, int, int]]) -> None:
        self.names_of = _cutter([slice(a, b) for a, b, _, _ in spans])
        self.values_of = _cutter([slice(c, d) for _, _, c, d in spans])
        self.names: tuple[str, ...] = self.names_of(line)
        last = {name: i for i, name in enumerate(self.names)}  # first-seen order, last value
        self.metrics = tuple((name, i) for name, i in last.items() if name not in _NOT_METRICS)
        self.step = last.get("step", last.get("global_step"))
        self.epoch = last.get("epoch")

    def points(self, line: str) -> list[MetricPoint]:
        """The points of ``line``, a line of this shape."""
        names = self.names_of(line)
        if names != self.names:  # the same shape, other names
            return _from_pairs(list(zip(names, self.values_of(line), strict=True)))
        values = [float(v) for v in self.values_of(line)]
        step = None if self.step is None else values[self.step]
        epoch = None if self.epoch is None else values[self.epoch]
        if step is not None and not isfinite(step):
            step = None
        if epoch is not None and not isfinite(epoch):
            epoch = None
        return [_point((name, value, step, epoch)) for name, i in self.metrics if isfinite(value := values[i])]


def _cutter(parts: list[slice]) -> Callable[[str], tuple[str, ...]]:
    """A function that cuts a text into these parts (in C: :func:`operator.itemgetter`), always a tuple."""
    if len(parts) == 1:
        part = parts[0]
        return lambda text: (text[part],)
    return itemgetter(*parts)


def _from_pairs(pairs: list[tuple[str, str]]) -> list[MetricPoint]:
    """:func:`_from_mapping` of ``name=value`` pairs (the last value of a name wins), done for many lines a second.

    Every value is a decimal numeral (the pattern says so): ``float`` takes it; only
    infinities (``1e999``) are left out.
    """
    data = {key: float(value) for key, value in pairs}
    step = data.get("step", data.get("global_step"))
    epoch = data.get("epoch")
    if step is not None and not isfinite(step):
        step = None
    if epoch is not None and not isfinite(epoch):
        epoch = None
    return [_point((key, value, step, epoch)) for key, value in data.items() if key not in _NOT_METRICS and isfinite(value)]


def from_trainer_status(status: Mapping[str, Any] | None) -> list[MetricPoint]:
    """Points from a TrainJob's ``status.trainerStatus.metrics`` (values are strings there)."""
    points = []
    for item in ((status or {}).get("trainerStatus") or {}).get("metrics") or []:
        try:
            value = float(item.get("value"))
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and item.get("name"):
            points.append(MetricPoint(str(item["name"]), value))
    return points


def is_score(name: str) -> bool:
    """Whether metric ``name`` is a result with a best value (a loss, an accuracy), not a setting.

    Example:
        >>> is_score("eval_loss"), is_score("learning_rate")
        (True, False)
    """
    return not _NOT_A_SCORE.search(name)


def lower_is_better(name: str) -> bool:
    """Whether smaller values of metric ``name`` are better (losses, errors, perplexity)."""
    return bool(_LOWER_IS_BETTER.search(name))


class MetricSeries:
    """Every metric point seen during one run, in order.

    Lines fed together (:meth:`feed_text`, the log relay's way) are only sorted while the log
    flows: those that may hold a metric are kept as they are and parsed the first time the
    points are read (after the run, by the step's outputs), so a burst of training output
    reaches the step's log at the pace the API server sends it. A kept line takes less memory
    than the points parsed from it.
    """

    def __init__(self, points: list[MetricPoint] | None = None) -> None:
        self._points: list[MetricPoint] = list(points or [])
        self._unparsed: list[str] = []  # lines fed by feed_text, in order, not parsed yet
        self._lock = threading.Lock()  # a relay thread may still feed while the points are read

    def __repr__(self) -> str:
        return f"MetricSeries(points={self.points!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MetricSeries) and self.points == other.points

    @property
    def points(self) -> list[MetricPoint]:
        """All points so far, in the order of the lines that held them."""
        if self._unparsed:
            with self._lock:
                self._parse_kept()
        return self._points

    def _parse_kept(self) -> None:
        lines, self._unparsed = self._unparsed, []
        add = self._points.extend
        for line in lines:
            add(parse_line(line) if "{" in line else _pair_points(line))

    def feed(self, line: str) -> int:
        """Parse one output line now; return how many points it added."""
        found = parse_line(line)
        with self._lock:
            self._parse_kept()
            self._points.extend(found)
        return len(found)

    def feed_text(self, text: str) -> None:
        """Take several output lines joined by newlines, to be parsed as :meth:`feed` would one by one.

        Only the lines that hold a ``=`` or a ``{`` are kept: the others hold no metric.
        """
        if "=" in text or "{" in text:
            kept = [line for line in text.split("\n") if "=" in line or "{" in line]
            with self._lock:
                self._unparsed += kept

    def extend(self, points: list[MetricPoint]) -> None:
        """Add points from another source (e.g. the TrainJob status), after those of the lines fed so far."""
        with self._lock:
            self._parse_kept()
            self._points.extend(points)

    def names(self) -> list[str]:
        """Metric names in first-seen order."""
        return list(dict.fromkeys(p.name for p in self.points))

    def series(self, name: str) -> list[MetricPoint]:
        """All points of one metric."""
        return [p for p in self.points if p.name == name]

    def final(self) -> dict[str, float]:
        """The last value of each metric."""
        return {p.name: p.value for p in self.points}

    def best(self) -> dict[str, float]:
        """The best value of each score (min for losses/errors, max otherwise); settings are left out."""
        out: dict[str, float] = {}
        for p in self.points:
            if not is_score(p.name):
                continue
            if p.name not in out:
                out[p.name] = p.value
            elif lower_is_better(p.name):
                out[p.name] = min(out[p.name], p.value)
            else:
                out[p.name] = max(out[p.name], p.value)
        return out

    def to_dict(self) -> dict[str, list[dict[str, float | None]]]:
        """JSON-ready ``{name: [{"value", "step", "epoch"}, ...]}``."""
        return {name: [{"value": p.value, "step": p.step, "epoch": p.epoch} for p in self.series(name)] for name in self.names()}
