"""A TrainJob run report: one self-contained HTML page (or Markdown). Pure: no I/O.

The KFP UI shows a ``dsl.HTML`` artifact in a sandboxed iframe, so the page carries its
own CSS and draws metric curves as inline SVG: no scripts, no fonts, no CDN. Every piece
of text is escaped and passed through :func:`~kfp_trainer.redaction.redact_text` (so a
credential in a URI, a condition message or a log-derived value never reaches the page),
and long metric series are downsampled so the page stays small whatever the run printed.

The input is plain data (see :func:`outcome_data`), so the report can be rendered from a
launcher :class:`~kfp_trainer.launcher.Outcome` or from JSON saved elsewhere.

Example:
    >>> page = render_html({
    ...     "trainjob": "team-a/train-x1", "runtime": "ClusterTrainingRuntime/torch-distributed",
    ...     "phase": "Succeeded",
    ...     "metrics": {"loss": [{"step": 1, "value": 2.0}, {"step": 2, "value": 1.0}]},
    ... })
    >>> page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script" not in page
    True
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .redaction import redact_text
from .svg import MAX_POINTS, MAX_TEXT, downsample, escape, number, svg_chart
from .timing import PREEMPTED, STATES, duration

MAX_CHARTS = 12
MAX_TIMELINE = 200

_CSS = """
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:16px;color:#202124;font-size:14px}
h1{font-size:18px;margin:0 0 8px}h2{font-size:15px;margin:20px 0 8px;border-bottom:1px solid #dadce0;padding-bottom:4px}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #dadce0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;color:#fff;background:#5f6368}
.Succeeded{background:#188038}.Failed{background:#d93025}.Running{background:#1a73e8}.Deleted{background:#b06000}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #dadce0;border-radius:4px;padding:4px}
.muted{color:#5f6368}pre{white-space:pre-wrap;background:#f8f9fa;padding:8px;border-radius:4px}
svg text{font-size:10px;fill:#5f6368}
"""


def _when(ts: Any) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(ts), tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return escape(ts)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[bool] | None = None) -> str:
    numeric = numeric or [False] * len(headers)
    head = "".join(f"<th>{escape(h)}</th>" for h in headers) if any(headers) else ""
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{number(v)}</td>' if numeric[i] else f"<td>{escape(v)}</td>" for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    head_row = f"<tr>{head}</tr>" if head else ""
    return f"<table>{head_row}{''.join(body)}</table>"


__all__ = ["MAX_POINTS", "downsample", "outcome_data", "render_html", "render_markdown", "svg_chart"]


def _summary_rows(data: Mapping[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = [
        ("TrainJob", data.get("trainjob", "")),
        ("Runtime", data.get("runtime", "")),
        ("Trainer API", data.get("api_version", "")),
        ("Phase", data.get("phase", "")),
    ]
    if data.get("reason") or data.get("message"):
        rows.append(("Reason", f"{data.get('reason', '')}: {data.get('message', '')}".strip(": ")))
    rows.append(("Adopted from an earlier try", "yes" if data.get("adopted") else "no"))
    if data.get("queue"):
        rows.append(("Kueue LocalQueue", data["queue"]))
    times = data.get("times") or {}
    if times:
        rows.append(("Queued / starting / running", " / ".join(duration(float(times.get(k) or 0)) for k in STATES)))
    if PREEMPTED in times:
        rows.append(("Preempted", _preempted(data)))
    for key, label in (("backend", "Backend"), ("duration_seconds", "Duration (s)"), ("log_lines", "Log lines")):
        if data.get(key) not in (None, ""):
            rows.append((label, data[key]))
    return rows


def _final_best(data: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    final = dict(data.get("final") or {})
    best = dict(data.get("best") or {})
    metrics = data.get("metrics") or {}
    names = list(dict.fromkeys([*metrics, *final, *best]))
    rows = []
    for name in names:
        series = [p.get("value") for p in metrics.get(name, []) if isinstance(p.get("value"), (int, float))]
        rows.append((name, final.get(name, series[-1] if series else None), best.get(name)))
    return rows


def _jobs_status(status: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    rows = []
    for job in status.get("jobsStatus") or []:
        if isinstance(job, Mapping):
            rows.append(
                (job.get("name", ""), job.get("active", 0), job.get("ready", 0), job.get("succeeded", 0),
                 job.get("failed", 0), job.get("suspended", 0))
            )
    return rows


def _is_curve(points: Any) -> bool:
    """A series worth a chart: two values or more (a single value is a table row)."""
    return isinstance(points, Sequence) and len(points) >= 2


def render_html(data: Mapping[str, Any]) -> str:
    """Render the run report as one self-contained HTML page.

    Args:
        data: Plain data as :func:`outcome_data` returns it: ``trainjob`` (namespace/name),
            ``runtime``, ``api_version``, ``phase``, ``reason``, ``message``, ``adopted``,
            ``metrics`` (``{name: [{"value", "step", "epoch"}]}``), ``final`` and ``best``
            (``{name: value}``), ``timeline`` (``[(unix_time, event)]``), ``status`` (the
            TrainJob's status; ``jobsStatus`` is shown per replicated job), ``queue`` and
            ``times`` (seconds ``queued``, ``starting``, ``running``), ``progress`` (the
            trainerStatus history: ``[{"seconds", "percent", "eta", "metrics", "updated"}]``)
            and optional ``extra`` (``{label: value}`` rows).

    Returns:
        The HTML document.
    """
    phase = str(data.get("phase", ""))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>TrainJob {escape(data.get('trainjob', ''), 200)}</title><style>{_CSS}</style></head><body>",
        f"<h1>TrainJob {escape(data.get('trainjob', ''), 200)} <span class='badge {escape(phase, 20)}'>{escape(phase, 40)}</span></h1>",
        _table(["", ""], _summary_rows(data)),
    ]
    metrics: Mapping[str, Any] = data.get("metrics") or {}
    parts.append("<h2>Metrics</h2>")
    curves = [(n, p) for n, p in metrics.items() if _is_curve(p)]  # one-off values (no position): table only
    if curves:
        charts = [f"<div class='chart'>{svg_chart(name, points)}</div>" for name, points in curves[:MAX_CHARTS]]
        parts.append(f"<div class='charts'>{''.join(charts)}</div>")
        if len(curves) > MAX_CHARTS:
            parts.append(f"<p class='muted'>{len(curves) - MAX_CHARTS} more metric(s) in the table only.</p>")
    elif not metrics:
        parts.append("<p class='muted'>The trainer printed no metrics.</p>")
    rows = _final_best(data)
    if rows:
        parts.append(_table(["metric", "final", "best"], rows, [False, True, True]))
    parts += _progress_section(data.get("progress") or [])
    times = data.get("times") or {}
    if times:
        shown_states = STATES + ((PREEMPTED,) if PREEMPTED in times else ())
        rows_s = [(k, float(times.get(k) or 0), duration(float(times.get(k) or 0))) for k in shown_states]
        parts.append("<h2>Time</h2>" + _table(["", "seconds", ""], rows_s, [False, True, False]))
        parts.append("<p class='muted'>Queued: suspended, waiting for its queue to admit it; starting: until a trainer "
                     "ran (scheduling, image pulls, initializers); running: from then on"
                     + ("; preempted: suspended again after it ran (Kueue preempted or evicted it), until re-admitted: "
                        "time lost, with the work since its last checkpoint" if PREEMPTED in times else "") + ".</p>")  # fmt: skip
    extra = data.get("extra") or {}
    if extra:
        parts.append("<h2>Details</h2>" + _table(["", ""], list(extra.items())))
    timeline = list(data.get("timeline") or [])
    if timeline:
        shown = timeline if len(timeline) <= MAX_TIMELINE else timeline[: MAX_TIMELINE // 2] + timeline[-MAX_TIMELINE // 2 :]
        start = _first_time(timeline)
        rows_t = [(_when(t), _offset(t, start), e) for t, e in (_pair(item) for item in shown)]
        parts.append("<h2>Timeline</h2>" + _table(["time", "+s", "event"], rows_t, [False, True, False]))
        if len(timeline) > MAX_TIMELINE:
            parts.append(f"<p class='muted'>{len(timeline) - MAX_TIMELINE} event(s) in the middle left out.</p>")
    jobs = _jobs_status(data.get("status") or {})
    if jobs:
        parts.append(
            "<h2>Replicated jobs</h2>"
            + _table(["job", "active", "ready", "succeeded", "failed", "suspended"], jobs, [False] + [True] * 5)
        )
    conditions = (data.get("status") or {}).get("conditions") or []
    if conditions:
        parts.append(
            "<h2>Conditions</h2>"
            + _table(
                ["type", "status", "reason", "message", "last transition"],
                [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"), c.get("lastTransitionTime"))
                 for c in conditions if isinstance(c, Mapping)],
            )
        )
    parts.append("</body></html>")
    return "".join(parts)


def _progress_section(history: Sequence[Any]) -> list[str]:
    """The trainer's own progress reports (``status.trainerStatus``): a chart over time and the last values."""
    points = [p for p in history if isinstance(p, Mapping)]
    if not points:
        return []
    parts = ["<h2>Progress (reported by the trainer)</h2>"]
    curve = [{"seconds": p.get("seconds"), "value": p.get("percent")} for p in points if p.get("percent") is not None]
    if _is_curve(curve):
        parts.append(f"<div class='charts'><div class='chart'>{svg_chart('progress %', curve)}</div></div>")
    last = points[-1]
    rows: list[tuple[str, Any]] = []
    if last.get("percent") is not None:
        rows.append(("progress", f"{number(last['percent'])}%"))
    if last.get("eta") is not None:
        rows.append(("estimated time left", duration(float(last["eta"]))))
    rows.append(("last reported", last.get("updated") or ""))
    rows += [(name, value) for name, value in (last.get("metrics") or {}).items()]
    parts.append(_table(["", ""], rows))
    parts.append(f"<p class='muted'>{len(points)} progress update(s) seen.</p>")
    return parts


def _pair(item: Any) -> tuple[Any, Any]:
    if isinstance(item, Mapping):
        return item.get("time"), item.get("event")
    if isinstance(item, (list, tuple)) and len(item) >= 2:
        return item[0], item[1]
    return None, item


def _first_time(timeline: Sequence[Any]) -> float | None:
    for item in timeline:
        t, _ = _pair(item)
        if isinstance(t, (int, float)):
            return float(t)
    return None


def _offset(t: Any, start: float | None) -> Any:
    if start is None or not isinstance(t, (int, float)):
        return ""
    return round(float(t) - start, 1)


def render_markdown(data: Mapping[str, Any]) -> str:
    """The same report as Markdown (tables only; KFP's Markdown viewer shows no raw HTML).

    Example:
        >>> print(render_markdown({"trainjob": "ns/j", "phase": "Succeeded", "final": {"loss": 0.5}}).splitlines()[0])
        # TrainJob ns/j: Succeeded
    """

    def cell(value: Any) -> str:
        text = number(value) if isinstance(value, (int, float)) else redact_text(str("" if value is None else value))
        return text.replace("|", "\\|").replace("\n", " ")[:MAX_TEXT]

    lines = [f"# TrainJob {cell(data.get('trainjob', ''))}: {cell(data.get('phase', ''))}", "", "| | |", "|---|---|"]
    lines += [f"| {cell(k)} | {cell(v)} |" for k, v in _summary_rows(data)]
    rows = _final_best(data)
    if rows:
        lines += ["", "| metric | final | best |", "|---|---:|---:|"]
        lines += [f"| {cell(n)} | {cell(f)} | {cell(b)} |" for n, f, b in rows]
    timeline = list(data.get("timeline") or [])[:MAX_TIMELINE]
    if timeline:
        lines += ["", "| time | event |", "|---|---|"]
        lines += [f"| {cell(_when(t))} | {cell(e)} |" for t, e in (_pair(i) for i in timeline)]
    jobs = _jobs_status(data.get("status") or {})
    if jobs:
        lines += ["", "| job | active | ready | succeeded | failed | suspended |", "|---|---:|---:|---:|---:|---:|"]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in jobs]
    return "\n".join(lines) + "\n"


def _preempted(data: Mapping[str, Any]) -> str:
    """``1 time(s), 45s suspended`` -- how often the job was preempted and the time it lost waiting."""
    count = int(data.get("preemptions") or 0)
    return f"{count or 'some'} time(s), {duration(float((data.get('times') or {}).get(PREEMPTED) or 0))} suspended until re-admitted"


def outcome_data(outcome: Any, **extra: Any) -> dict[str, Any]:
    """Plain data for :func:`render_html` from a launcher ``Outcome`` (duck-typed).

    Args:
        outcome: An object with ``ref``, ``phase``, ``metrics`` (a ``MetricSeries``),
            ``timeline``, ``status`` and the other ``Outcome`` fields.
        **extra: More top-level keys (e.g. ``extra={...}`` rows, ``backend``).

    Returns:
        A JSON-ready dict.
    """
    metrics = getattr(outcome, "metrics", None)
    phase = getattr(outcome, "phase", "")
    data: dict[str, Any] = {
        "trainjob": str(getattr(outcome, "ref", "")),
        "runtime": getattr(outcome, "runtime", ""),
        "api_version": getattr(outcome, "api_version", ""),
        "phase": getattr(phase, "value", phase),
        "reason": getattr(outcome, "reason", ""),
        "message": getattr(outcome, "message", ""),
        "adopted": bool(getattr(outcome, "adopted", False)),
        "metrics": metrics.to_dict() if metrics is not None else {},
        "final": metrics.final() if metrics is not None else {},
        "best": metrics.best() if metrics is not None else {},
        "timeline": [list(item) for item in getattr(outcome, "timeline", [])],
        "status": dict(getattr(outcome, "status", {}) or {}),
        "log_lines": getattr(outcome, "log_lines", None),
        "times": dict(getattr(outcome, "times", {}) or {}),
        "queue": getattr(outcome, "queue", ""),
        "preemptions": int(getattr(outcome, "preemptions", 0) or 0),
        "progress": list(getattr(outcome, "progress", []) or []),
    }
    timeline = data["timeline"]
    if len(timeline) >= 2:
        data["duration_seconds"] = round(float(timeline[-1][0]) - float(timeline[0][0]), 1)
    data.update(extra)
    return data
