"""Training output lines -> metric time series. Pure: no I/O.

Understands the formats trainers print:

* JSON lines: ``{"step": 10, "loss": 0.52, "learning_rate": 0.001}``
* Hugging Face Trainer log dicts: ``{'loss': 0.52, 'grad_norm': 1.3, 'epoch': 0.5}``
* Katib-style ``name=value`` pairs: ``epoch 3: loss=0.52 accuracy=0.91``
* Trainer's ``status.trainerStatus.metrics`` (``[{"name": ..., "value": ...}]``)

``step``, ``epoch`` and ``global_step`` are positions, not metrics: a point carries them.
Names that describe the distributed setup (``rank``, ``world_size``, ``master_port``,
``nranks``, ...) are never metrics.

Lines that libraries and runtimes log (:func:`is_log_line`) hold no metric, whatever
``name=value`` pairs or mappings they carry: a log-level prefix (``INFO:root:``,
``[INFO|trainer.py:2134]``, ``2026-12-07 04:18:12,985 - INFO -``, ``NCCL INFO``,
``NCCL WARN``), a glog / c10 stamp (``[W1207 04:18:16.154876372 socket.cpp:207]``, after a
``[rank0]:`` prefix too), a Python warning or exception (``x.py:186: UserWarning:``,
``RuntimeError:``), source code quoted by a traceback or a warning, the repr of a config
(``Namespace(lr=0.1, ...)``, a ``learning_rate=5e-05,`` line of a multi-line repr) and the
settings Hugging Face's Trainer prints as prose (``  Num examples = 1,000``). So a c10d
warning's ``err=-3`` or NCCL's ``nranks`` never becomes a metric.

A :class:`MetricFilter` keeps only some metrics (``MetricSeries(keep="loss,re:eval_.*")``).

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
# A line's shape: ASCII lower-case letters as "a", upper-case ones as "A" (e and E as themselves, the pattern's exponent),
# digits as "0", all else kept. The pattern sees only letter / e / digit, so the case is a finer cut it does not need;
# the log-line check does (:data:`_MAY_BE_LOG`).
_LOWER, _UPPER = string.ascii_lowercase.replace("e", ""), string.ascii_uppercase.replace("E", "")
_SHAPE = bytes.maketrans((_LOWER + _UPPER + "eE" + string.digits).encode(), b"a" * 25 + b"A" * 25 + b"eE" + b"0" * 10)
_PLANS_KEPT = 4096  # line shapes a series keeps the plan of (MetricSeries._plans), at most
_POSITIONS = frozenset(POSITION_KEYS)
# The distributed setup (torchrun's rendezvous result, NCCL's communicator), not results.
_SKIP_KEYS = frozenset({
    "rank", "local_rank", "node_rank", "world_size", "pid", "port", "group_rank", "group_world_size", "role_rank",
    "role_world_size", "local_world_size", "master_port", "restart_count", "nranks", "nnodes", "nproc_per_node",
})  # fmt: skip
_NOT_METRICS = _POSITIONS | _SKIP_KEYS
# Settings and throughput, not results: they have a last value but no "best" one.
_NOT_A_SCORE = re.compile(r"(learning_rate|^lr$|runtime|per_second|grad_norm|epoch|steps?$|batch_size)")
# A decimal numeral as a string: Hugging Face's progress callback prints its floats so ({'loss': '0.5234'}).
_NUMERAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")

# --- Lines that libraries log (is_log_line). Searched for in a line's text before its first "=" or "{":
_LEVEL = r"(?:DEBUG|INFO|WARN(?:ING)?|ERROR|CRITICAL|FATAL|TRACE)"
_LOG_MARK = re.compile(
    rf"\b{_LEVEL}(?:[:\]|)]| +[-|]| +\d)"  # INFO:root:, WARNING:torch.x:, [KFP Executor .. INFO]:, - INFO -, | INFO |, INFO 12-07
    rf"|[\[|] *{_LEVEL}\b"  # [INFO], [WARNING|trainer.py:1633], [2026-..] torch.distributed.run: [WARNING]
    rf"|(?:\bNCCL|\d\d:\d\d:\d\d[,.\d]*) +{_LEVEL}\b"  # host:pid:tid [0] NCCL INFO, NCCL WARN; 2026/12/07 04:18:12 INFO (MLflow)
    r"|\b[DIWEFVC]\d{3,4} +\d\d:\d\d:\d\d"  # glog, c10, absl: [W1207 04:18:16.154876372 socket.cpp:207], [W724 18:22:38.9 ..
    r"|\[[DIWEF] [\w./-]+:\d+\]"  # older c10: [W socket.cpp:464]
    r"|[a-z](?:Warning|Error|Exception):"  # /x.py:186: UserWarning:, RuntimeError:, torch.OutOfMemoryError:
)
# ... a call or repr with keyword arguments ("Namespace(lr=0.1, ...)", "WorkNCCL(SeqNum=7, ...)"): its first "=" follows
# "name(" and a name (looked for from the last "(" before that "=")
_KEYWORD_ARGUMENT = re.compile(r" *[A-Za-z_]\w*\Z")
# ... and whole lines that are source code, a repr or a printed setting rather than results:
_NOT_RESULTS = re.compile(
    r"""(?:\[\w+\]:)?(?:  # torchrun's [default0]: / PyTorch's [rank0]:
      [ \t]+[A-Z][a-z]*\ [^=]*?[^ =]\ +=\ *\d  # "  Num examples = 1,000": settings printed as prose (HF Trainer)
    | [ \t]*[A-Za-z_]\w*=[^\s,]*,\s*$  # "learning_rate=5e-05,": one field of a repr printed across lines
    | [ \t]{2,}\S.*?\w\(.*?[(,]\ *[A-Za-z_]\w*=  # "    x = f(a, p=0.1)": code quoted by a traceback or warning
    )""",
    re.VERBOSE,
)
# The shapes of lines that one of those may match (levels, glog stamps and Warning: keep their upper case in a shape);
# a line of another shape is none of them, and is not checked.
_MAY_BE_LOG = re.compile(rb"[AE]{4}|[AE]0{3,4} |\[[AE] |[AE][ae]+:|\(|,\s*$|^(?:\[\w+\]:)?\s")
_TORCHELASTIC_EVENT = '{"name": "torchelastic.'  # events torch.distributed.elastic logs as JSON lines


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


def _numeral(value: Any) -> float | None:
    """A number, or a string that is a decimal numeral (``'5e-05'``), as a finite float; else None."""
    if type(value) is str and _NUMERAL.fullmatch(value):
        value = float(value)
        return value if math.isfinite(value) else None
    return _numeric(value)


def _from_mapping(data: dict[str, Any], numerals: bool = False) -> list[MetricPoint]:
    """The points of a printed mapping; with ``numerals``, values that are numerals as strings count as their numbers."""
    number = _numeral if numerals else _numeric
    step = number(data.get("step", data.get("global_step")))
    epoch = number(data.get("epoch"))
    points = []
    for key, raw in data.items():
        if key in _POSITIONS or key in _SKIP_KEYS:  # keys of a printed dict need not be strings
            continue
        value = raw if type(raw) is float and math.isfinite(raw) else number(raw)
        if value is not None:
            points.append(MetricPoint(str(key), value, step, epoch))
    return points


_OUR_NOTICE = "[kfp-trainer] "  # what this package's trainers and steps say about themselves (tracking, errors)


def is_log_line(line: str) -> bool:
    """Whether ``line`` is one that a library or runtime logs, or code, a repr or a printed setting: it holds no metric.

    What decides is the line's text before its first ``=`` or ``{``: a log level in capitals
    as loggers print it (``INFO:``, ``[INFO``, ``INFO]``, ``- INFO -``, ``| INFO |``, ``NCCL INFO``,
    ``12:00:00 INFO``), a glog / c10 / absl stamp (``W1207 04:18:16``, ``[W socket.cpp:464]``) or a
    Python warning or exception (``UserWarning:``, ``RuntimeError:``), or the end of
    a call or repr with keyword arguments (``Namespace(lr=0.1, ...)``, ``WorkNCCL(SeqNum=7, ...)``);
    or the whole line's form: an indented ``Capitalised words = number`` (Hugging Face Trainer's
    ``  Num examples = 1,000``), a ``name=value,`` line of a multi-line repr,
    source code with keyword arguments quoted by a traceback or a warning (indented), or a
    torch.distributed.elastic event (``{"name": "torchelastic...``). A ``[rank0]:`` or
    ``[default0]:`` prefix is looked through. ``INFO`` followed by a plain word is not a log
    level (``INFO loss=0.3``: a trainer's own words).

    Example:
        >>> is_log_line("[W1207 04:18:16.154876372 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3")
        True
        >>> is_log_line("host-0:57:80 [0] NCCL INFO Channel 00/02 : 0 1 nranks=2"), is_log_line("epoch 3: loss=0.52 accuracy=0.91")
        (True, False)
        >>> is_log_line("[kfp-trainer] MLflow run r1: params not logged (lr=0.2 was logged before)")  # this package's own notices
        True
    """
    if line.startswith(_OUR_NOTICE):
        return True
    cut = line.find("=")
    brace = line.find("{")
    if brace != -1 and (cut == -1 or brace < cut):
        cut = brace
        if line.lstrip().startswith(_TORCHELASTIC_EVENT):
            return True
    if cut == -1:
        cut = len(line)
    if _LOG_MARK.search(line, 0, cut) is not None:
        return True
    paren = line.rfind("(", 0, cut)
    if paren > 0 and (line[paren - 1].isalnum() or line[paren - 1] == "_") and _KEYWORD_ARGUMENT.match(line, paren + 1, cut):
        return True
    return _NOT_RESULTS.match(line) is not None


def parse_line(line: str) -> list[MetricPoint]:
    """Metric points in one line of training output (empty when there are none, or when it is a log line).

    Example:
        >>> parse_line('{"step": 3, "loss": 1.5}')
        [MetricPoint(name='loss', value=1.5, step=3.0, epoch=None)]
        >>> parse_line("{0: 'cat', 1: 0.5}")
        [MetricPoint(name='1', value=0.5, step=None, epoch=None)]
        >>> parse_line("{'loss': '0.5234', 'learning_rate': '5e-05', 'epoch': '0.5'}")  # transformers' progress callback
        [MetricPoint(name='loss', value=0.5234, step=None, epoch=0.5), MetricPoint(name='learning_rate', value=5e-05, step=None, epoch=0.5)]
        >>> parse_line("[W1207 04:18:16.154876372 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3")
        []
    """
    return _parse(line, None, {})


def _parse(line: str, names: frozenset[str] | None, plans: dict[bytes, _Plan | None]) -> list[MetricPoint]:
    """:func:`parse_line`; from a log line, the points named in ``names`` (none when None)."""
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
                # What comes before the mapping is most often nothing (a JSON line) or a prefix: looked at only then.
                if (start or text.startswith(_TORCHELASTIC_EVENT)) and is_log_line(text):
                    return [p for p in _from_mapping(data, loader is not json.loads) if p.name in names] if names else []
                return _from_mapping(data, loader is not json.loads)  # a printed dict's numerals count (HF's '0.5234')
    return _pair_points(line, names, plans)


def _pair_points(line: str, names: frozenset[str] | None, plans: dict[bytes, _Plan | None]) -> list[MetricPoint]:
    """The points of the ``name=value`` pairs in ``line`` (as :func:`_from_pairs` of the pattern's matches).

    The pattern tells letters, ``e``/``E`` and digits apart only by those classes, so lines
    of one shape (:data:`_SHAPE`) have their pairs at the same places: the pattern runs once
    per shape (:class:`_Plan`, kept in ``plans`` by shape; None: no pairs), and each line is cut
    where its first one matched. Whether a
    shape may be a log line's is known once per shape too: only lines of those shapes are
    checked (:func:`is_log_line`), and give only the points named in ``names`` when they are.
    """
    shape = line.encode("utf-8", "surrogatepass").translate(_SHAPE)
    try:
        plan = plans[shape]
    except KeyError:
        spans = [(m.start(1), m.end(1), m.start(2), m.end(2)) for m in _KATIB.finditer(line)]
        plan = _Plan(line, spans, _MAY_BE_LOG.search(shape) is not None) if spans else None
        if len(plans) >= _PLANS_KEPT:
            plans.clear()
        plans[shape] = plan
    if plan is None:
        return []
    if plan.suspect and is_log_line(line):
        return [p for p in plan.points(line) if p.name in names] if names else []
    return plan.points(line)


class _Plan:
    """Where the pairs of one line shape are, what the first line of that shape named them, whether it may be a log line."""

    __slots__ = ("names", "names_of", "values_of", "metrics", "step", "epoch", "suspect")

    def __init__(self, line: str, spans: list[tuple[int, int, int, int]], suspect: bool = False) -> None:
        self.suspect = suspect
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


METRIC_FILTER_SYNTAX = (
    "comma-separated metric names and re:REGEX patterns that the whole name must match, e.g. loss,eval_loss,re:eval_.* "
    "(empty: every metric)"
)


class MetricFilter:
    r"""Which metrics a step keeps, from the text a user gives (``metric_names``, ``--metrics``).

    The text is a comma-separated list of items, spaces around them ignored:

    * a name keeps the metric of exactly that name (``loss``, ``eval/accuracy``) -- read also
      from log lines (:func:`is_log_line`), so a trainer that logs its metrics with
      ``logging.info("loss=%f", loss)`` can name them;
    * ``re:REGEX`` keeps every metric whose whole name the Python regular expression matches
      (``re:eval_.*``, ``re:(train|eval)_loss``); a comma inside ``()``, ``[]`` or ``{}``
      belongs to the pattern (``re:x{1,3}``), elsewhere write it ``\,``.

    Empty (the default) keeps every metric, from every line that is not a log line. The filter
    applies to every source: training output lines and the TrainJob's ``trainerStatus`` metrics.
    A pattern that does not compile raises :class:`ValueError`.

    Example:
        >>> keep = MetricFilter("loss, re:eval_.*")
        >>> keep("loss"), keep("eval_accuracy"), keep("train_loss"), keep("err")
        (True, True, False, False)
        >>> MetricFilter("").everything
        True
        >>> MetricFilter("re:eval_(")
        Traceback (most recent call last):
        ...
        ValueError: re:eval_( is not a regular expression: missing ), unterminated subpattern at position 5
    """

    __slots__ = ("text", "names", "patterns", "_kept")

    def __init__(self, text: str | None = "") -> None:
        self.text = text or ""
        names, patterns = [], []
        for item in _items(self.text):
            if item.startswith("re:"):
                if not item[3:].strip():
                    raise ValueError(f"{item} has no pattern after re:")
                try:
                    patterns.append(re.compile(item[3:]))
                except re.error as e:
                    raise ValueError(f"{item} is not a regular expression: {e}") from None
            else:
                names.append(item)
        self.names = frozenset(names)
        self.patterns = tuple(patterns)
        self._kept: dict[str, bool] = {}  # by name: the answer, once worked out

    def __repr__(self) -> str:
        return f"MetricFilter({self.text!r})"

    @property
    def everything(self) -> bool:
        """Whether it keeps every metric (nothing named, no pattern)."""
        return not self.names and not self.patterns

    def __call__(self, name: str) -> bool:
        """Whether metric ``name`` is kept."""
        try:
            return self._kept[name]
        except KeyError:
            kept = name in self.names or any(p.fullmatch(name) for p in self.patterns)
            if len(self._kept) < 4096:
                self._kept[name] = kept
            return kept


def _items(text: str) -> list[str]:
    r"""The comma-separated items of ``text``, stripped, empty ones left out; commas inside brackets or escaped stay.

    Example:
        >>> _items(r" loss, re:x{1,3}|y[,], re:a\,b ,,")
        ['loss', 're:x{1,3}|y[,]', 're:a\\,b']
    """
    items, depth, start, i = [], 0, 0, 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 1  # the next character is escaped
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        i += 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def metric_filter_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a :class:`MetricFilter`'s text (None or text that compiles: nothing).

    Example:
        >>> metric_filter_problem("loss,re:val_.*") is None, metric_filter_problem(3) == METRIC_FILTER_SYNTAX
        (True, True)
    """
    if value is None:
        return None
    if not isinstance(value, str):
        return METRIC_FILTER_SYNTAX
    try:
        MetricFilter(value)
    except ValueError as e:
        return f"{METRIC_FILTER_SYNTAX}; {e}"
    return None


class MetricSeries:
    r"""Every metric point seen during one run, in order.

    Lines fed together (:meth:`feed_text`, the log relay's way) are only sorted while the log
    flows: those that may hold a metric are kept as they are and parsed the first time the
    points are read (after the run, by the step's outputs), so a burst of training output
    reaches the step's log at the pace the API server sends it. A kept line takes less memory
    than the points parsed from it.

    ``keep`` (a :class:`MetricFilter` or its text) leaves out the metrics it does not keep,
    whatever their source; a name it lists is read from log lines too.

    Example:
        >>> series = MetricSeries(keep="loss")
        >>> series.feed_text("step=1 loss=2.0 accuracy=0.5\nINFO:__main__:step=2 loss=1.5")
        >>> series.extend(from_trainer_status({"trainerStatus": {"metrics": [{"name": "eval_loss", "value": "1.2"}]}}))
        >>> [(p.name, p.value, p.step) for p in series.points]
        [('loss', 2.0, 1.0), ('loss', 1.5, 2.0)]
    """

    def __init__(self, points: list[MetricPoint] | None = None, keep: MetricFilter | str | None = None) -> None:
        wanted = keep if isinstance(keep, MetricFilter) else MetricFilter(keep)
        self._keep = None if wanted.everything else wanted  # None: every metric, nothing to check
        self._names = wanted.names or None  # named metrics: read from log lines too
        self._points: list[MetricPoint] = self._kept(list(points or []))
        self._unparsed: list[str] = []  # lines fed by feed_text, in order, not parsed yet
        self._plans: dict[bytes, _Plan | None] = {}  # where the pairs of each line shape are (_pair_points)
        self._lock = threading.Lock()  # a relay thread may still feed while the points are read

    def _kept(self, points: list[MetricPoint]) -> list[MetricPoint]:
        keep = self._keep
        return points if keep is None or not points else [p for p in points if keep(p.name)]

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
        names, plans = self._names, self._plans
        found: list[MetricPoint] = []
        add = found.extend
        for line in lines:
            add(_parse(line, names, plans) if "{" in line else _pair_points(line, names, plans))
        self._points.extend(self._kept(found))

    def feed(self, line: str) -> int:
        """Parse one output line now; return how many points it added."""
        found = self._kept(_parse(line, self._names, self._plans))
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
        points = self._kept(list(points))
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
