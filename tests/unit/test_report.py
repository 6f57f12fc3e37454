"""The HTML run report: self-contained, escaped, bounded, complete."""

from __future__ import annotations

import re
from types import SimpleNamespace

from kfp_trainer.jobstatus import JobRef, Phase
from kfp_trainer.metrics import MetricSeries
from kfp_trainer.report import downsample, outcome_data, render_html, render_markdown, svg_chart


def data(**extra):
    base = {
        "trainjob": "team-a/train-x1",
        "runtime": "ClusterTrainingRuntime/torch-distributed",
        "api_version": "v2.2",
        "phase": "Succeeded",
        "adopted": True,
        "metrics": {"loss": [{"step": s, "value": 3.0 / s, "epoch": None} for s in range(1, 50)]},
        "final": {"loss": 3.0 / 49},
        "best": {"loss": 3.0 / 49},
        "timeline": [(1_700_000_000, "TrainJob created"), (1_700_000_012.5, "Running"), (1_700_000_090, "Succeeded")],
        "status": {
            "jobsStatus": [
                {"name": "node", "active": 0, "ready": 0, "succeeded": 2, "failed": 0, "suspended": 0},
                {"name": "dataset-initializer", "succeeded": 1},
            ],
            "conditions": [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "done"}],
        },
    }
    base.update(extra)
    return base


def test_report_is_one_self_contained_page_without_scripts_or_remote_resources():
    page = render_html(data())
    assert page.startswith("<!DOCTYPE html>")
    assert "<style>" in page and "<svg" in page and "<polyline" in page
    assert "<script" not in page.lower()
    assert not re.search(r"(src|href)=['\"]?(https?:)?//", page)


def test_report_shows_header_final_best_timeline_and_replicated_jobs():
    page = render_html(data())
    for text in ("team-a/train-x1", "ClusterTrainingRuntime/torch-distributed", "v2.2", "Succeeded", "yes",
                 "TrainJob created", "+s", "AllJobsCompleted", "dataset-initializer", "0.0612245"):
        assert text in page, text
    # the replicated-jobs table, without pods_per_job: JobSet's counts of Jobs, said to be Jobs
    assert "Replicated jobs (counted in Jobs, not pods)" in page and "<td>node</td><td>succeeded 2</td>" in page


def test_report_escapes_every_text_it_shows():
    evil = "<img src=x onerror=alert(1)>"
    page = render_html(data(trainjob=evil, message=evil, reason="R", metrics={evil: [{"step": 1, "value": 1.0}]},
                            timeline=[(1, evil)], status={"jobsStatus": [{"name": evil}]}))
    assert evil not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_long_series_are_downsampled_so_the_page_stays_small():
    huge = {"loss": [{"step": s, "value": (s % 97) / 97} for s in range(200_000)]}
    page = render_html(data(metrics=huge, final={}, best={}))
    assert len(page) < 60_000
    points = downsample([(float(i), float(i % 13)) for i in range(100_000)], limit=400)
    assert len(points) <= 400
    assert points[0] == (0.0, 0.0) and points[-1] == (99_999.0, float(99_999 % 13))
    assert max(y for _, y in points) == 12.0  # extremes survive


def test_chart_handles_empty_single_and_epoch_only_series():
    assert "no values" in svg_chart("loss", [])
    assert "<circle" in svg_chart("loss", [{"step": 1, "value": 0.5}])
    single = render_html(data(metrics={"threads": [{"step": None, "value": 2.0}]}, final={"threads": 2.0}))
    assert "<svg" not in single and ">threads<" in single  # a single value is a table row, not a chart
    epoch_chart = svg_chart("acc", [{"epoch": 0.5, "value": 0.1}, {"epoch": 1.0, "value": 0.2}])
    assert ">epoch<" in epoch_chart
    assert "nan" not in svg_chart("x", [{"step": 1, "value": float("nan")}, {"step": 2, "value": 1.0}])


def test_no_metrics_says_so_and_many_metrics_are_capped():
    assert "printed no metrics" in render_html(data(metrics={}, final={}, best={}))
    many = {f"m{i}": [{"step": 1, "value": 1.0}, {"step": 2, "value": 2.0}] for i in range(30)}
    page = render_html(data(metrics=many))
    assert page.count("<svg") == 12 and "18 more metric(s)" in page


def test_markdown_report_has_the_same_facts_in_tables():
    md = render_markdown(data(trainjob="ns/a|b"))
    assert md.startswith("# TrainJob ns/a\\|b: Succeeded")
    assert "| loss |" in md and "| node | succeeded 2 |" in md and "TrainJob created" in md


def test_outcome_data_reads_a_launcher_outcome():
    series = MetricSeries()
    series.feed('{"step": 1, "loss": 2.0}')
    series.feed('{"step": 2, "loss": 1.0}')
    outcome = SimpleNamespace(
        ref=JobRef("ns", "job"), phase=Phase.SUCCEEDED, reason="AllJobsCompleted", message="", adopted=False,
        runtime="ClusterTrainingRuntime/torch-distributed", api_version="v2.2", metrics=series,
        timeline=[(10.0, "created"), (25.0, "Succeeded")], status={"jobsStatus": []}, log_lines=7,
    )
    d = outcome_data(outcome, backend="local")
    assert d["trainjob"] == "ns/job" and d["phase"] == "Succeeded" and d["duration_seconds"] == 15.0
    assert d["final"] == {"loss": 1.0} and d["metrics"]["loss"][0]["step"] == 1.0 and d["backend"] == "local"
    assert "ns/job" in render_html(d)


def test_every_chart_is_well_formed_svg():
    import xml.etree.ElementTree as ET

    page = render_html(data(metrics={"loss": [{"step": s, "value": 1 / s} for s in range(1, 30)],
                                     "a<b": [{"epoch": 0.5, "value": 1.0}, {"epoch": 1.0, "value": 2.0}]}))
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) == 2
    for svg in svgs:
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")


def test_credentials_in_any_text_never_reach_the_page():
    secret = "wJalrXUtnFEMIK7MDENGbPxRfiCYsecretKEY"
    data = {
        "trainjob": "ns/j", "phase": "Failed", "reason": "BackOff",
        "message": f"pull s3://AKIAIOSFODNN7EXAMPLE:{secret}@bucket/x failed; HF_TOKEN={secret}",
        "extra": {"base model": f"https://user:{secret}@example.com/m"},
        "timeline": [(1.0, f"created with --hf-token={secret}")],
        "status": {"conditions": [{"type": "Failed", "status": "True", "message": f"token hf_{'a' * 34}"}]},
    }
    for page in (render_html(data), render_markdown(data)):
        assert secret not in page and "hf_" + "a" * 34 not in page and "AKIAIOSFODNN7EXAMPLE" not in page
        assert "***" in page


def test_report_shows_the_trainers_progress_over_time_and_its_last_values():
    history = [
        {"seconds": 5.0, "percent": 10, "eta": 450, "metrics": {"loss": "2.5"}, "updated": "2026-01-01T00:00:05Z"},
        {"seconds": 50.0, "percent": 60, "eta": 30, "metrics": {"loss": "1.25", "lr": "2e-05"}, "updated": "2026-01-01T00:00:50Z"},
    ]
    page = render_html(data(progress=history))
    section = page.split("Progress (reported by the trainer)")[1].split("<h2>")[0]
    assert "progress %" in section and "<polyline" in section and ">seconds<" in section
    for text in ("<td>60%</td>", "<td>30s</td>", "2026-01-01T00:00:50Z", "<td>loss</td><td>1.25</td>", "<td>lr</td><td>2e-05</td>"):
        assert text in section, text
    assert "Progress (reported" not in render_html(data())  # nothing reported: no section


def test_report_shows_time_queued_starting_and_running_and_the_queue():
    page = render_html(data(queue="team-q", times={"queued": 600.0, "starting": 42.5, "running": 3725.0}))
    assert "<td>Kueue LocalQueue</td><td>team-q</td>" in page
    assert "10m 0s / 42s / 1h 2m 5s" in page
    time_table = page.split("<h2>Time</h2>")[1]
    assert re.search(r"<td>queued</td><td class=\"n\">600</td><td>10m 0s</td>", time_table)
    assert re.search(r"<td>running</td><td class=\"n\">3725</td>", time_table)


def test_outcome_data_carries_times_queue_and_progress():
    outcome = SimpleNamespace(
        ref=JobRef("ns", "job"), phase=Phase.SUCCEEDED, metrics=MetricSeries(), timeline=[],
        times={"queued": 1.0, "starting": 2.0, "running": 3.0}, queue="q", progress=[{"seconds": 1.0, "percent": 5}],
    )
    d = outcome_data(outcome)
    assert d["times"]["running"] == 3.0 and d["queue"] == "q" and d["progress"][0]["percent"] == 5


def test_report_shows_a_preemption_its_time_lost_and_the_queue_timeline():
    timeline = [(1_700_000_000, "TrainJob created"), (1_700_000_001, "queued in LocalQueue team-q"),
                (1_700_000_030, "admitted after 29s in team-q"), (1_700_000_100, "suspended while running: preempted or evicted by Kueue"),
                (1_700_000_190, "re-admitted after 1m 30s suspended"), (1_700_000_300, "Succeeded")]  # fmt: skip
    times = {"queued": 29.0, "starting": 5.0, "running": 175.0, "preempted": 90.0}
    page = render_html(data(queue="team-q", times=times, preemptions=1, timeline=timeline))
    assert "<td>Preempted</td><td>1 time(s), 1m 30s suspended until re-admitted</td>" in page
    assert re.search(r"<td>preempted</td><td class=\"n\">90</td><td>1m 30s</td>", page.split("<h2>Time</h2>")[1])
    assert "time lost, with the work since its last checkpoint" in page
    shown = page.split("<h2>Timeline</h2>")[1]
    for event in ("queued in LocalQueue team-q", "admitted after 29s", "suspended while running", "re-admitted after 1m 30s"):
        assert event in shown
    plain = render_html(data(queue="team-q", times={"queued": 1.0, "starting": 1.0, "running": 1.0}))
    assert "<td>Preempted</td>" not in plain and "<td>preempted</td>" not in plain
    assert outcome_data(SimpleNamespace(ref=JobRef("ns", "job"), preemptions=2, timeline=[]))["preemptions"] == 2
