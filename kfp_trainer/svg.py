"""Inline SVG line charts for the run report: self-contained, escaped, downsampled. Pure.

Example:
    >>> svg_chart("loss", [{"step": 1, "value": 2.0}, {"step": 2, "value": 1.0}]).startswith("<svg")
    True
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .redaction import shorten

MAX_POINTS = 400  # per curve, after downsampling
MAX_TEXT = 2000  # characters of one value shown in a chart or the report


def escape(value: Any, limit: int = MAX_TEXT) -> str:
    """``value`` as text safe in HTML and SVG (an attribute too), shortened to ``limit`` characters.

    Example:
        >>> escape('<b a="1">')
        '&lt;b a=&quot;1&quot;&gt;'
    """
    text = "" if value is None else shorten(str(value), limit)
    return html.escape(text, quote=True)


def number(value: Any) -> str:
    """A number as a chart or table shows it (whole numbers without ``.0``, others to 6 digits); anything else escaped.

    Example:
        >>> number(3.0), number(0.123456789), number(float("nan")), number(True)
        ('3', '0.123457', 'nan', 'True')
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return escape(value)
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def downsample(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Keep at most ``limit`` points: the first, the last, and each bucket's min and max.

    Keeping extremes (not every n-th point) preserves spikes a plain stride would hide.

    Example:
        >>> len(downsample([(float(i), float(i % 7)) for i in range(10_000)], limit=100))
        100
    """
    pts = list(points)
    if len(pts) <= limit:
        return pts
    if limit < 4:
        return [pts[0], pts[-1]][:limit]
    buckets = (limit - 2) // 2
    inner = pts[1:-1]
    size = len(inner) / buckets
    out = [pts[0]]
    for b in range(buckets):
        chunk = inner[int(b * size) : max(int((b + 1) * size), int(b * size) + 1)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}, key=lambda p: p[0]) if lo != hi else [lo])
    out.append(pts[-1])
    return out[:limit]


def _axis(value: float) -> str:
    """A short axis label: at most 4 significant digits."""
    return escape(f"{value:.4g}")


def _series_xy(points: Iterable[Mapping[str, Any]]) -> tuple[list[tuple[float, float]], str]:
    """(x, y) pairs of one metric and the x axis label: step, else epoch, else seconds, else index."""
    rows = [p for p in points if isinstance(p.get("value"), (int, float)) and math.isfinite(float(p["value"]))]
    for key in ("step", "epoch", "seconds"):
        if rows and all(isinstance(p.get(key), (int, float)) for p in rows):
            return [(float(p[key]), float(p["value"])) for p in rows], key
    return [(float(i), float(p["value"])) for i, p in enumerate(rows)], "point"


def svg_chart(name: str, points: Iterable[Mapping[str, Any]], *, width: int = 360, height: int = 200, title: bool = True) -> str:
    """An inline SVG line chart of one metric (x: step, epoch, seconds or point index).

    ``width`` x ``height`` is its natural size; its viewBox lets a narrower page scale it down
    (the report's CSS: ``max-width:100%; height:auto``). ``title=False`` leaves the metric's
    name out (the report puts it above the chart, where a long name wraps instead of being cut off).

    Example:
        >>> 'viewBox="0 0 360 200"' in svg_chart("loss", [{"step": 1, "value": 2.0}, {"step": 2, "value": 1.0}])
        True
    """
    xy, xlabel = _series_xy(points)
    xy = downsample(xy)
    left, right, top, bottom = 60, 10, 20 if title else 10, 28
    w, h = width - left - right, height - top - bottom
    heading = f'<text x="{left}" y="13" style="font-size:12px;fill:#202124;font-weight:600">{escape(name, 80)}</text>' if title else ""
    if not xy:
        empty = f'<text x="{left}" y="{top + 20}">no values</text>'
        size = f'width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        return f'<svg xmlns="http://www.w3.org/2000/svg" {size}>{heading}{empty}</svg>'
    xs, ys = [p[0] for p in xy], [p[1] for p in xy]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * h

    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in xy)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(name, 80)}">',
        heading,
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#dadce0"/>',
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end">{_axis(y1)}</text>',
        f'<text x="{left - 4}" y="{top + h}" text-anchor="end">{_axis(y0)}</text>',
        f'<text x="{left}" y="{height - 14}">{number(x0)}</text>',
        f'<text x="{left + w}" y="{height - 14}" text-anchor="end">{number(x1)}</text>',
        f'<text x="{left + w / 2:.0f}" y="{height - 3}" text-anchor="middle">{escape(xlabel)}</text>',
    ]
    if len(xy) == 1:
        parts.append(f'<circle cx="{sx(xy[0][0]):.1f}" cy="{sy(xy[0][1]):.1f}" r="3" fill="#1a73e8"/>')
    else:
        parts.append(f'<polyline fill="none" stroke="#1a73e8" stroke-width="1.5" points="{coords}"/>')
    parts.append("</svg>")
    return "".join(parts)
