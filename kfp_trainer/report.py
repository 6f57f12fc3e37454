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
import urllib.parse as _urlparse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .redaction import redact_text, shorten
from .svg import MAX_POINTS, MAX_TEXT, downsample, escape, number, svg_chart
from .timing import PREEMPTED, STATES, duration

MAX_CHARTS = 12
MAX_TIMELINE = 200

# Made for the frame the KFP UI gives an HTML artifact: in the run details' side panel
# 427 x 598 px. Nothing may be wider than that: every text may wrap anywhere (a 120-character
# image name or URL too; ``anywhere``, unlike ``break-word``, also lets a table shrink to
# fit), numbers and our own times keep their digits together, key/value tables give their
# labels a third, charts (SVG with a viewBox) scale down, and narrow frames get less padding.
_CSS = """
*{box-sizing:border-box}
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:16px;color:#202124;font-size:14px;line-height:1.35;
word-break:break-word;overflow-wrap:anywhere}
h1{font-size:18px;margin:0 0 8px}h2{font-size:15px;margin:20px 0 8px;border-bottom:1px solid #dadce0;padding-bottom:4px}
table{border-collapse:collapse;margin:4px 0;max-width:100%}table.wide{width:100%}
td,th{border:1px solid #dadce0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f1f3f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.t span{white-space:nowrap}table.kv td:first-child{width:34%}td.msg{border-top:0;color:#3c4043}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;color:#fff;background:#5f6368}
.Succeeded{background:#188038}.Failed{background:#d93025}.Running{background:#1a73e8}.Deleted{background:#b06000}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #dadce0;border-radius:4px;padding:4px;width:370px;max-width:100%}
.chart svg{display:block;width:100%;height:auto}.chart .name{font-size:12px;font-weight:600;padding:0 4px 0 8px}
.muted{color:#5f6368}pre{white-space:pre-wrap;background:#f8f9fa;padding:8px;border-radius:4px}
code{font-size:12px;background:#f1f3f4;padding:0 3px;border-radius:3px}.full{font-size:12px;margin:0 0 8px}
svg text{font-size:10px;fill:#5f6368}
@media (max-width:600px){body{margin:8px;font-size:13px}h1{font-size:16px}h2{font-size:14px;margin:14px 0 6px}
td,th{padding:2px 5px}.charts{gap:8px}}
"""


def _when(ts: Any, zone: str = " UTC") -> str:
    """A unix time as ``2026-01-01 00:00:05 UTC`` (``zone`` after it); anything else as short text (not escaped)."""
    try:
        return _dt.datetime.fromtimestamp(float(ts), tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") + zone
    except (TypeError, ValueError, OverflowError, OSError):
        return shorten("" if ts is None else str(ts), 30)


def _since(value: Any) -> str:
    """A condition's ``lastTransitionTime`` (``2026-01-01T00:41:40Z``) as ``2026-01-01 00:41:40`` (UTC)."""
    text = "" if value is None else str(value)
    try:
        when = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return shorten(text, 30)
    if when.tzinfo is not None:
        when = when.astimezone(_dt.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _time_cell(value: Any) -> str:
    """A time (``2026-01-01 00:41:40``) that wraps, in a narrow column, between date and time only."""
    words = "" if value is None else str(value)
    return '<td class="t">' + " ".join(f"<span>{escape(word)}</span>" for word in words.split(" ")) + "</td>"


def _table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    numeric: Sequence[bool] | None = None,
    *,
    cls: str = "",
    times: Sequence[bool] | None = None,
) -> str:
    """A table; ``numeric`` columns right-aligned, ``times`` columns (our own times) broken only at spaces."""
    numeric = numeric or [False] * len(headers)
    times = times or [False] * len(headers)
    head = "".join(f"<th>{escape(h)}</th>" for h in headers) if any(headers) else ""
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{number(v)}</td>' if numeric[i] else _time_cell(v) if times[i] else f"<td>{escape(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    head_row = f"<tr>{head}</tr>" if head else ""
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}>{head_row}{''.join(body)}</table>"


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


_COUNTS = ("active", "ready", "succeeded", "failed", "suspended")
_INITIALIZERS = ("dataset-initializer", "model-initializer")


def _count(value: Any) -> int:
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def _noun(name: str, count: int) -> str:
    """``2 nodes`` for the trainer's ``node`` replicated job, ``1 pod`` for the others."""
    unit = "node" if name == "node" else "pod"
    return f"{count} {unit}{'' if count == 1 else 's'}"


def _pods(data: Mapping[str, Any]) -> tuple[str, list[str], str, list[tuple[str, ...]]]:
    """The pods of each replicated job: (section title, headers, note, rows).

    ``status.jobsStatus`` is JobSet's count of *Jobs* per replicated job, and in Trainer v2
    each replicated job is one Job whose parallelism is its pod count (``node``: one Job of
    ``numNodes`` pods), so "succeeded 1" there means every node succeeded. With
    ``pods_per_job`` (pods in each Job of a replicated job) the counts become pods: a
    succeeded or ready Job has all its pods succeeded or ready, an active one runs them, a
    failed one has failed as a whole. Without it (data saved before it existed) the counts
    stay Jobs and say so.

    Example:
        >>> _pods({"status": {"jobsStatus": [{"name": "node", "succeeded": 1}]}, "pods_per_job": {"node": 2}})[3]
        [('node', '2 nodes', 'succeeded 2')]
        >>> _pods({"status": {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}]}})[1:4:2]
        (['replicated job', 'Jobs'], [('node', 'active 1, ready 1')])
    """
    per_job = data.get("pods_per_job") or {}
    per_job = per_job if isinstance(per_job, Mapping) else {}
    jobs = [job for job in (data.get("status") or {}).get("jobsStatus") or [] if isinstance(job, Mapping)]
    rows: list[tuple[str, ...]] = []
    for job in jobs:
        name = str(job.get("name", ""))
        counts = [(key, _count(job.get(key))) for key in _COUNTS]
        pods = _count(per_job.get(name))
        if not per_job:
            rows.append((name, ", ".join(f"{key} {n}" for key, n in counts if n) or "none yet"))
        elif pods:
            rows.append((name, _noun(name, pods), ", ".join(f"{key} {n * pods}" for key, n in counts if n) or "none yet"))
        else:  # a replicated job the launcher did not size: its Jobs
            rows.append((name, "? pods", ", ".join(f"{key} {n} Job{'' if n == 1 else 's'}" for key, n in counts if n) or "none yet"))
    if not per_job:
        return ("Replicated jobs (counted in Jobs, not pods)", ["replicated job", "Jobs"],
                "JobSet's counts of Jobs: each replicated job runs as one Job of one or more pods "
                "(node: one Job of all the nodes), so succeeded 1 can mean that every node succeeded.", rows)  # fmt: skip
    only_ours = all(row[0] == "node" or row[0] in _INITIALIZERS for row in rows)
    title = "Nodes and initializers" if only_ours else "Nodes and other pods"
    note = ("Counted from JobSet's Jobs: each replicated job runs as one Job of that many pods; "
            "a Job that failed counts all its pods as failed.")  # fmt: skip
    return title, ["replicated job", "size", "pods"], note, rows


# Where the report can be seen full size. KFP 2.17's UI shows it in
# <iframe sandbox="allow-scripts" srcdoc=...> (frontend/src/components/viewers/HTMLViewer.tsx):
# no allow-popups, no allow-top-navigation, no allow-downloads. So a click on a link in the
# report cannot open a tab (target=_blank is blocked), cannot leave the frame for the UI's
# whole page, and a link in the frame only shows the same page in the same 427 px; a data:
# URL of the page is no way out either (Chrome and Firefox refuse top-level data: pages).
# What does work: the browser's own "Open link in new tab" (a right-click: the user's
# navigation, not the frame's) on a link to the KFP UI's download route for this artifact,
# artifacts/<minio|s3|gcs>/<bucket>/<key>?namespace=<ns> (frontend/src/lib/Apis.ts
# buildReadFileUrl, served by frontend/server/app.ts). It is relative: a srcdoc document's
# base URL is the UI page's, so it resolves under the UI's own address and base path
# (/pipeline/ in Kubeflow). The artifact's URI is also shown as text to copy; the UI's
# artifact view links to the same download.
_SOURCES = {"minio": "minio", "s3": "s3", "gs": "gcs"}


def _full_size(data: Mapping[str, Any]) -> str:
    """A line with a link to the report itself in the KFP UI (``report_uri``); empty without one.

    Example:
        >>> line = _full_size({"report_uri": "minio://mlpipeline/v2/artifacts/p/r/t/1/report", "trainjob": "team-a/j"})
        >>> 'href="artifacts/minio/mlpipeline/v2/artifacts/p/r/t/1/report?namespace=team-a" target="_blank"' in line
        True
    """
    uri = redact_text(str(data.get("report_uri") or ""))
    if not uri:
        return ""
    scheme, _, rest = uri.partition("://")
    bucket, _, key = rest.partition("/")
    source = _SOURCES.get(scheme)
    if not (source and bucket and key) or "***" in uri:
        return f"<p class='full muted'>This report's artifact: <code>{escape(uri)}</code></p>"
    trainjob = str(data.get("trainjob", ""))
    namespace = str(data.get("report_namespace") or (trainjob.partition("/")[0] if "/" in trainjob else ""))
    query = f"?{_urlparse.urlencode({'namespace': namespace})}" if namespace else ""
    href = f"artifacts/{source}/{_urlparse.quote(bucket, safe='')}/{_urlparse.quote(key, safe='/')}{query}"
    return (f"<p class='full muted'>Full size: right-click <a href=\"{escape(href)}\" target=\"_blank\" rel=\"noopener\">this report</a> "
            f"and open it in a new tab; its artifact: <code>{escape(uri)}</code></p>")  # fmt: skip


def _chart(name: str, points: Any) -> str:
    """One chart: the metric's name above it (wrapping when long), the SVG scaled to the page's width."""
    label = escape(name, 200).replace("_", "_<wbr>").replace("/", "/<wbr>")  # a long name wraps at its _ and /
    return f"<div class='chart'><div class='name'>{label}</div>{svg_chart(name, points, title=False)}</div>"


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
            trainerStatus history: ``[{"seconds", "percent", "eta", "metrics", "updated"}]``),
            ``pods_per_job`` (``{replicated job: pods in each of its Jobs}``: the replicated
            jobs' counts shown in pods and nodes), optional ``report_uri`` (this report's
            artifact URI: a link to it full size) and ``report_namespace``, optional
            ``extra`` (``{label: value}`` rows), and optional ``tables`` (``[{"title",
            "headers", "rows", "note"}]``: what a trainer adds, e.g. GRPO's sampled completions).

    Returns:
        The HTML document.
    """
    phase = str(data.get("phase", ""))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>TrainJob {escape(data.get('trainjob', ''), 200)}</title><style>{_CSS}</style></head><body>",
        f"<h1>TrainJob {escape(data.get('trainjob', ''), 200)} <span class='badge {escape(phase, 20)}'>{escape(phase, 40)}</span></h1>",
        _full_size(data),
        _table(["", ""], _summary_rows(data), cls="kv"),
    ]
    metrics: Mapping[str, Any] = data.get("metrics") or {}
    parts.append("<h2>Metrics</h2>")
    curves = [(n, p) for n, p in metrics.items() if _is_curve(p)]  # one-off values (no position): table only
    if curves:
        charts = [_chart(name, points) for name, points in curves[:MAX_CHARTS]]
        parts.append(f"<div class='charts'>{''.join(charts)}</div>")
        if len(curves) > MAX_CHARTS:
            parts.append(f"<p class='muted'>{len(curves) - MAX_CHARTS} more metric(s) in the table only.</p>")
    elif not metrics:
        parts.append("<p class='muted'>The trainer printed no metrics.</p>")
    rows = _final_best(data)
    if rows:
        parts.append(_table(["metric", "final", "best"], rows, [False, True, True], cls="wide"))
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
        parts.append("<h2>Details</h2>" + _table(["", ""], list(extra.items()), cls="kv"))
    for table in data.get("tables") or []:
        parts.append(f"<h2>{escape(table.get('title', ''))}</h2>" + _table(table.get("headers") or [], table.get("rows") or [], cls="wide"))
        if table.get("note"):
            parts.append(f"<p class='muted'>{escape(table['note'])}</p>")
    timeline = list(data.get("timeline") or [])
    if timeline:
        shown = timeline if len(timeline) <= MAX_TIMELINE else timeline[: MAX_TIMELINE // 2] + timeline[-MAX_TIMELINE // 2 :]
        start = _first_time(timeline)
        rows_t = [(_when(t, ""), _offset(t, start), e) for t, e in (_pair(item) for item in shown)]
        parts.append("<h2>Timeline</h2>" + _table(["time (UTC)", "+s", "event"], rows_t, [False, True, False], cls="wide",
                                                  times=[True, False, False]))
        if len(timeline) > MAX_TIMELINE:
            parts.append(f"<p class='muted'>{len(timeline) - MAX_TIMELINE} event(s) in the middle left out.</p>")
    title, headers, note, pods = _pods(data)
    if pods:
        parts.append(f"<h2>{escape(title)}</h2>" + _table(headers, pods, cls="wide"))
        parts.append(f"<p class='muted'>{escape(note)}</p>")
    parts += _conditions((data.get("status") or {}).get("conditions") or [])
    parts.append("</body></html>")
    return "".join(parts)


def _conditions(conditions: Sequence[Any]) -> list[str]:
    """The TrainJob's conditions: one row each, its message on a full-width row below it (long, it wraps there)."""
    rows = []
    for c in conditions:
        if not isinstance(c, Mapping):
            continue
        rows.append("<tr>" + "".join(f"<td>{escape(c.get(k))}</td>" for k in ("type", "status", "reason"))
                    + _time_cell(_since(c.get("lastTransitionTime"))) + "</tr>")  # fmt: skip
        if c.get("message"):
            rows.append(f'<tr><td class="msg" colspan="4">{escape(c.get("message"))}</td></tr>')
    if not rows:
        return []
    head = "<tr><th>type</th><th>status</th><th>reason</th><th>since (UTC)</th></tr>"
    return [f"<h2>Conditions</h2><table class=\"wide\">{head}{''.join(rows)}</table>"]


def _progress_section(history: Sequence[Any]) -> list[str]:
    """The trainer's own progress reports (``status.trainerStatus``): a chart over time and the last values."""
    points = [p for p in history if isinstance(p, Mapping)]
    if not points:
        return []
    parts = ["<h2>Progress (reported by the trainer)</h2>"]
    curve = [{"seconds": p.get("seconds"), "value": p.get("percent")} for p in points if p.get("percent") is not None]
    if _is_curve(curve):
        parts.append(f"<div class='charts'>{_chart('progress %', curve)}</div>")
    last = points[-1]
    rows: list[tuple[str, Any]] = []
    if last.get("percent") is not None:
        rows.append(("progress", f"{number(last['percent'])}%"))
    if last.get("eta") is not None:
        rows.append(("estimated time left", duration(float(last["eta"]))))
    rows.append(("last reported", last.get("updated") or ""))
    rows += [(name, value) for name, value in (last.get("metrics") or {}).items()]
    parts.append(_table(["", ""], rows, cls="kv"))
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
    for table in data.get("tables") or []:
        headers = list(table.get("headers") or [])
        lines += ["", f"**{cell(table.get('title', ''))}**", ""]
        lines += ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.get("rows") or []]
    timeline = list(data.get("timeline") or [])[:MAX_TIMELINE]
    if timeline:
        lines += ["", "| time | event |", "|---|---|"]
        lines += [f"| {cell(_when(t))} | {cell(e)} |" for t, e in (_pair(i) for i in timeline)]
    title, headers, note, pods = _pods(data)
    if pods:
        lines += ["", f"**{title}**", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in pods]
        lines += ["", note]
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
        "pods_per_job": dict(getattr(outcome, "pods_per_job", {}) or {}),
    }
    timeline = data["timeline"]
    if len(timeline) >= 2:
        data["duration_seconds"] = round(float(timeline[-1][0]) - float(timeline[0][0]), 1)
    data.update(extra)
    return data
