"""The HTML run report in a real headless Chromium, at the size the KFP UI gives it.

KFP 2.17's UI shows an ``HTML`` artifact in ``<iframe sandbox="allow-scripts" srcdoc=...>``
(frontend/src/components/viewers/HTMLViewer.tsx: ``width: 100%``, ``min-height: 600px``,
a 1 px border, ``box-sizing: border-box``); in the run details' side panel that frame is
427 x 598 px. The report must fit that width: nothing wider than the frame (no horizontal
scrolling), long text wrapped, charts scaled down.

The report has no scripts; the page around the frame measures it (the frame without its
sandbox, so that the page may look in: the layout is the same) and writes the report's
``scrollWidth``/``clientWidth``, the elements that stick out and the charts' sizes into its
own DOM, which Chromium dumps.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from kfp_trainer.report import render_html
from tests.local.test_pipelines_local import browse

WIDTH, HEIGHT = 427, 598  # the KFP UI's HTML viewer frame in the run details' side panel

# The KFP UI's frame (less its sandbox: the page around it measures the report inside, so the
# report itself runs no script), and a script that waits until the report is laid out and stays
# so, then writes its widths and the elements whose right edge is past the frame's viewport (only
# where an overflow starts: none of their children sticks out too) into the page for --dump-dom.
FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe width="{w}" height="{h}" style="border:1px solid #ddd;box-sizing:border-box" srcdoc="{doc}"></iframe>
<pre id="out"></pre>
<script>
const frame = document.querySelector("iframe");
let last = "";
const probe = () => {{
  const doc = frame.contentDocument, view = frame.contentWindow;
  if (!doc || doc.readyState !== "complete" || !doc.body || !doc.body.getBoundingClientRect().width) return setTimeout(probe, 50);
  const root = doc.documentElement, limit = root.clientWidth, wide = [];
  const past = (e) => e.getBoundingClientRect().right > limit + 0.5;
  for (const el of doc.body.querySelectorAll("*")) {{
    if (past(el) && ![...el.children].some(past) && wide.length < 20)
      wide.push(el.tagName.toLowerCase() + " right=" + Math.round(el.getBoundingClientRect().right)
                + " " + (el.textContent || "").slice(0, 40));
  }}
  const size = (e) => {{ const b = e.getBoundingClientRect(); return [Math.round(b.width), Math.round(b.height)]; }};
  const text = JSON.stringify({{scrollWidth: root.scrollWidth, clientWidth: limit, innerWidth: view.innerWidth,
                                innerHeight: view.innerHeight, scrollHeight: root.scrollHeight, wide: wide,
                                charts: [...doc.querySelectorAll("svg")].map(size),
                                narrowest: Math.min(...[...doc.querySelectorAll("td")].map((e) => size(e)[0]))}});
  if (text !== last) {{ last = text; return setTimeout(probe, 100); }}  // the same twice: laid out
  document.getElementById("out").textContent = text;
}};
setTimeout(probe, 0);
</script>
</body></html>"""


def hostile_report() -> dict:
    """A failed 2-node run with every section and the longest texts a real one shows."""
    t0 = 1_760_000_000.0
    image = "registry.example.com/" + "team-ml-platform/" * 5 + "pytorch-trainer-cuda12-with-a-very-long-tag:2026.01.01-" + "a" * 30
    url = "https://huggingface.co/datasets/organisation-name/" + "x" * 90 + "/resolve/main/train-00000-of-00001.parquet"
    failed = (
        "Failed to run the trainer: replicated job 'node' failed: pod train-x1-node-0-1-abcde in namespace team-a "
        f"exited with code 137 (OOMKilled) while running image {image}; the container used 31.9Gi of its 32Gi "
        "memory limit; back-off limit 0 reached, no more retries; see kubectl logs -n team-a train-x1-node-0-1-abcde "
        "for the last lines the trainer printed before it was killed."
    )
    metrics = {}
    for i in range(12):
        name = f"train/evaluation_{'perplexity' if i % 2 else 'cross_entropy_loss'}_moving_average_of_rank_{i}_over_100_steps"
        metrics[name] = [{"step": s, "value": 10.0 / (s + i) + (s % 7) * 0.01, "epoch": s / 100} for s in range(1, 400, 3)]
    timeline = [(t0, "TrainJob created in namespace team-a with runtime ClusterTrainingRuntime/torch-distributed")]
    for i in range(60):
        timeline.append((t0 + 5 + i * 37.25, f"pod train-x1-node-0-{i % 2}-abcde: Pulling image {image}" if i % 10 == 0
                         else f"progress {i}%: step {i * 40} of 2400, loss {3.0 / (i + 1):.4f}, eta {2400 - i * 40}s"))
    timeline.append((t0 + 2500, f"Failed: {failed}"))
    progress = [
        {"seconds": 30.0 * k, "percent": min(100, 2 * k), "eta": 1800 - 30 * k,
         "metrics": {"loss": f"{3.0 / (k + 1):.4f}", "learning_rate_after_warmup_and_cosine_decay": "1.9999999e-05"},
         "updated": f"2026-01-01T00:{k:02d}:00Z"}
        for k in range(1, 40)
    ]
    status = {
        "conditions": [
            {"type": "Suspended", "status": "False", "reason": "Resumed", "lastTransitionTime": "2026-01-01T00:00:05Z",
             "message": "TrainJob is resumed after Kueue admitted it to ClusterQueue team-a-cluster-queue"},
            {"type": "Failed", "status": "True", "reason": "JobSetFailed", "message": failed, "lastTransitionTime": "2026-01-01T00:41:40Z"},
            {"type": "Created", "status": "True", "reason": "JobSetCreated", "message": f"pulled {url}",
             "lastTransitionTime": "2026-01-01T00:00:01Z"},
        ],
        "jobsStatus": [
            {"name": "dataset-initializer", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0},
            {"name": "model-initializer", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0},
            {"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 1, "suspended": 0},
        ],
    }
    return {
        "trainjob": "team-a-with-a-long-namespace-name/train-x1-" + "b" * 40,
        "runtime": "ClusterTrainingRuntime/torch-distributed-with-cuda-12-and-a-long-name",
        "api_version": "v2.2", "phase": "Failed", "reason": "JobSetFailed", "message": failed, "adopted": True,
        "metrics": metrics,
        "final": {name: points[-1]["value"] for name, points in metrics.items()},
        "best": {name: min(p["value"] for p in points) for name, points in metrics.items()},
        "timeline": timeline, "status": status, "pods_per_job": {"node": 2, "dataset-initializer": 1, "model-initializer": 1},
        "queue": "team-a-local-queue-for-gpu-jobs", "times": {"queued": 620.0, "starting": 95.5, "running": 1780.0, "preempted": 90.0},
        "preemptions": 1, "progress": progress, "backend": "kubernetes", "duration_seconds": 2500.0, "log_lines": 123456,
        "extra": {"base model": url, "image": image, "output model": "1234567890 weights, safetensors, 17 files",
                  "resumed": "from the checkpoint at step 1200 of an earlier try"},
        "report_uri": "minio://mlpipeline/v2/artifacts/llm-finetune/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/train-job/"
                      "1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809/report",
    }


def measure(page_html: str, tmp: Path, width: int = WIDTH, height: int = HEIGHT) -> dict:
    """Widths of ``page_html`` in a ``width`` x ``height`` frame in headless Chromium, as the KFP UI frames it.

    A frame, not a window: headless Chromium's windows are at least 500 px wide.
    """
    frame = tmp / f"frame-{width}.html"
    frame.write_text(FRAME.format(w=width, h=height, doc=html.escape(page_html, quote=True)))
    dom = browse(frame, tmp, "--virtual-time-budget=10000", "--dump-dom", window=f"{max(width, 500) + 100},{height + 200}")
    assert dom.returncode == 0, dom.stderr[-2000:]
    out = re.search(r'<pre id="out">(.+?)</pre>', dom.stdout, re.S)
    assert out, f"the probe reported nothing: {dom.stdout[-2000:]}"
    result = json.loads(html.unescape(out.group(1)))
    # The frame's viewport: less its 1 px borders (as in KFP), less a vertical scrollbar where scrollbars take room.
    assert (result["innerWidth"], result["innerHeight"]) == (width - 2, height - 2), result
    assert width - 2 - 20 <= result["clientWidth"] <= width - 2, result
    return result


def test_the_report_fits_the_kfp_ui_frame_without_scrolling_sideways(tmp_path):
    result = measure(render_html(hostile_report()), tmp_path)
    assert result["scrollWidth"] <= result["clientWidth"], f"the report scrolls sideways in the KFP UI: {result}"
    assert not result["wide"], result
    assert result["narrowest"] >= 40, f"a table column squeezed to a sliver: {result}"
    # 12 metric charts and the progress chart, each whole within the frame at its natural size or smaller
    assert len(result["charts"]) == 13 and all(0 < w <= result["clientWidth"] and h > 0 for w, h in result["charts"]), result


def test_the_report_fits_a_phone_sized_frame_too_with_its_charts_scaled_down(tmp_path):
    """In 320 px the charts (360 px wide by themselves) shrink to fit, keeping their proportions (a viewBox)."""
    result = measure(render_html(hostile_report()), tmp_path, width=320, height=568)
    assert result["scrollWidth"] <= result["clientWidth"] and not result["wide"], result
    assert result["narrowest"] >= 30, result
    for w, h in result["charts"]:
        assert w < 360 and abs(h / w - 200 / 360) < 0.02, f"a chart not scaled down whole: {w}x{h}"
