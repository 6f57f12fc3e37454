"""The run report's nodes counted as nodes, its layout for the KFP UI's 427 px frame, and its full-size link.

tests/local/test_report_browser.py measures the layout in a real Chromium; these check what
the page is made of.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from types import SimpleNamespace

from kfp_trainer.jobstatus import JobRef, Phase
from kfp_trainer.report import outcome_data, render_html, render_markdown

# What Trainer v2 reports for a 2-node run that succeeded: one Job per replicated job (node: 2 pods).
DONE = {
    "jobsStatus": [
        {"name": "dataset-initializer", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0},
        {"name": "model-initializer", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0},
        {"name": "node", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0},
    ]
}
PODS = {"node": 2, "dataset-initializer": 1, "model-initializer": 1}


def report(**extra):
    base = {"trainjob": "team-a/train-x1", "phase": "Succeeded", "status": DONE, "pods_per_job": PODS}
    base.update(extra)
    return base


def section(page: str, title: str) -> str:
    return page.split(f"<h2>{title}</h2>", 1)[1].split("<h2>", 1)[0]


# --------------------------------------------------------------------------- nodes counted as nodes


def test_a_two_node_job_that_succeeded_shows_two_nodes_succeeded():
    page = render_html(report())
    nodes = section(page, "Nodes and initializers")
    assert "<th>replicated job</th><th>size</th><th>pods</th>" in nodes
    assert "<td>node</td><td>2 nodes</td><td>succeeded 2</td>" in nodes
    assert "<td>dataset-initializer</td><td>1 pod</td><td>succeeded 1</td>" in nodes
    assert "<td>model-initializer</td><td>1 pod</td><td>succeeded 1</td>" in nodes
    assert "Replicated jobs" not in page and "succeeded 1</td>" not in nodes.split("<td>node</td>")[1]


def test_running_and_failed_jobs_are_counted_in_pods_too():
    running = {"jobsStatus": [{"name": "node", "active": 1, "ready": 1}, {"name": "dataset-initializer", "succeeded": 1}]}
    page = render_html(report(status=running, pods_per_job={"node": 4, "dataset-initializer": 1}))
    assert "<td>node</td><td>4 nodes</td><td>active 4, ready 4</td>" in page
    failed = {"jobsStatus": [{"name": "node", "failed": 1}, {"name": "launcher", "active": 1}]}
    page = render_html(report(status=failed, pods_per_job={"node": 3, "launcher": 1}))
    assert "<h2>Nodes and other pods</h2>" in page  # MPI's launcher is neither a node nor an initializer
    assert "<td>node</td><td>3 nodes</td><td>failed 3</td>" in page and "<td>launcher</td><td>1 pod</td><td>active 1</td>" in page
    assert "a Job that failed counts all its pods as failed" in page
    pending = render_html(report(status={"jobsStatus": [{"name": "node"}]}, pods_per_job={"node": 1}))
    assert "<td>node</td><td>1 node</td><td>none yet</td>" in pending


def test_a_replicated_job_the_launcher_did_not_size_keeps_its_jobs_and_says_so():
    page = render_html(report(pods_per_job={"node": 2}))
    assert "<td>node</td><td>2 nodes</td><td>succeeded 2</td>" in page
    assert "<td>dataset-initializer</td><td>? pods</td><td>succeeded 1 Job</td>" in page


def test_without_pods_per_job_the_counts_are_labelled_jobs_not_nodes():
    for page in (render_html(report(pods_per_job={})), render_html({k: v for k, v in report().items() if k != "pods_per_job"})):
        jobs = section(page, "Replicated jobs (counted in Jobs, not pods)")
        assert "<th>replicated job</th><th>Jobs</th>" in jobs and "<td>node</td><td>succeeded 1</td>" in jobs
        assert "nodes" not in jobs.split("</table>")[0] and "can mean that every node succeeded" in jobs


def test_markdown_counts_nodes_the_same_way():
    md = render_markdown(report())
    assert "**Nodes and initializers**" in md and "| replicated job | size | pods |" in md
    assert "| node | 2 nodes | succeeded 2 |" in md and "| dataset-initializer | 1 pod | succeeded 1 |" in md
    old = render_markdown(report(pods_per_job={}))
    assert "**Replicated jobs (counted in Jobs, not pods)**" in old and "| node | succeeded 1 |" in old


def test_outcome_data_carries_pods_per_job_when_the_outcome_has_it():
    outcome = SimpleNamespace(ref=JobRef("ns", "job"), phase=Phase.SUCCEEDED, timeline=[], status=DONE, pods_per_job=PODS)
    assert outcome_data(outcome)["pods_per_job"] == PODS
    assert "<td>node</td><td>2 nodes</td><td>succeeded 2</td>" in render_html(outcome_data(outcome))
    older = SimpleNamespace(ref=JobRef("ns", "job"), phase=Phase.SUCCEEDED, timeline=[], status=DONE)
    assert outcome_data(older)["pods_per_job"] == {}
    assert outcome_data(SimpleNamespace(ref=JobRef("ns", "job"), timeline=[], pods_per_job=None))["pods_per_job"] == {}


# --------------------------------------------------------------------------- made for 427 px


def test_every_text_may_wrap_and_tables_and_charts_fit_the_width():
    page = render_html(report(metrics={"loss": [{"step": 1, "value": 2.0}, {"step": 2, "value": 1.0}]}))
    css = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "overflow-wrap:anywhere" in css  # also lets a table shrink below its longest word
    assert re.search(r"table\{[^}]*max-width:100%", css) and "table.wide{width:100%}" in css
    assert re.search(r"\.chart svg\{[^}]*width:100%[^}]*height:auto", css)
    assert re.search(r"@media \(max-width:\d+px\)", css)  # less padding in a narrow frame
    svg = re.search(r"<svg.*?</svg>", page, re.S).group(0)
    root = ET.fromstring(svg)
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"  # scales down whole


def test_a_long_metric_name_is_above_its_chart_where_it_wraps_not_cut_off_inside_it():
    name = "train/evaluation_cross_entropy_loss_moving_average_of_rank_0_over_100_steps"
    page = render_html(report(metrics={name: [{"step": 1, "value": 2.0}, {"step": 2, "value": 1.0}]}))
    chart = page.split("<div class='chart'>", 1)[1]
    assert chart.startswith("<div class='name'>train/<wbr>evaluation_<wbr>cross_<wbr>")
    assert name not in re.search(r"<svg.*?</svg>", chart, re.S).group(0).split("aria-label", 1)[1].split(">", 1)[1]


def test_a_conditions_message_gets_a_full_width_row_of_its_own_and_times_break_between_date_and_time():
    message = "pod train-x1-node-0-1 exited with code 137 (OOMKilled) " * 8
    status = {**DONE, "conditions": [{"type": "Failed", "status": "True", "reason": "JobSetFailed", "message": message,
                                      "lastTransitionTime": "2026-01-01T00:41:40Z"}]}
    conditions = section(render_html(report(status=status)), "Conditions")
    assert "<th>type</th><th>status</th><th>reason</th><th>since (UTC)</th>" in conditions
    assert ('<td>Failed</td><td>True</td><td>JobSetFailed</td><td class="t"><span>2026-01-01</span> <span>00:41:40</span></td></tr>'
            f'<tr><td class="msg" colspan="4">{message}</td></tr>') in conditions
    timeline = section(render_html(report(timeline=[(1_767_228_100, "created"), (1_767_228_105.5, "Running")])), "Timeline")
    assert "<th>time (UTC)</th>" in timeline
    assert '<td class="t"><span>2026-01-01</span> <span>00:41:45</span></td><td class="n">5.5</td><td>Running</td>' in timeline


def test_a_time_that_is_no_time_is_shown_escaped_once():
    page = render_html(report(timeline=[("a<b", "x"), (2.0, "y")], status={"conditions": [{"type": "T", "lastTransitionTime": "<soon>"}]}))
    assert "<span>a&lt;b</span>" in page and "<span>&lt;soon&gt;</span>" in page and "&amp;lt;" not in page


# --------------------------------------------------------------------------- the way to full size


def test_the_report_links_to_itself_in_the_kfp_ui_to_open_full_size():
    uri = "minio://mlpipeline/v2/artifacts/llm-finetune/0f1e2d3c/train-job/1a2b3c4d/report"
    page = render_html(report(report_uri=uri))
    link = re.search(r'<a href="([^"]+)" target="_blank" rel="noopener">this report</a>', page)
    assert link, page[:3000]
    # relative: resolved against the KFP UI's own address (a srcdoc frame's base URL is its parent's)
    assert link.group(1) == "artifacts/minio/mlpipeline/v2/artifacts/llm-finetune/0f1e2d3c/train-job/1a2b3c4d/report?namespace=team-a"
    assert "right-click" in page and f"<code>{uri}</code>" in page
    s3 = render_html(report(report_uri="s3://my-bucket/runs/a b/report", report_namespace="kubeflow-user"))
    assert 'href="artifacts/s3/my-bucket/runs/a%20b/report?namespace=kubeflow-user"' in s3
    gcs = render_html(report(report_uri="gs://b/k/report", trainjob="job-without-namespace"))
    assert 'href="artifacts/gcs/b/k/report"' in gcs


def test_a_report_uri_kfp_cannot_serve_or_with_a_credential_is_text_only():
    local = render_html(report(report_uri="/tmp/run/artifacts/train-job/report"))
    assert "<a " not in local and "<code>/tmp/run/artifacts/train-job/report</code>" in local
    secret = "wJalrXUtnFEMIK7MDENGbPxRfiCYsecretKEY"
    page = render_html(report(report_uri=f"s3://AKIAIOSFODNN7EXAMPLE:{secret}@bucket/report"))
    assert secret not in page and "<a " not in page
    assert "Full size" not in render_html(report())  # no URI: no line
