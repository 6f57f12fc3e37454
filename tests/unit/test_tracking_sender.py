"""A trainer's MLflow logging never waits on the server: batched in the background, kept while it does not answer.

Against a real HTTP server in this process that answers MLflow's ``runs/log-batch`` and can be
made to hang (it holds each request until released), to refuse, or to be down (nothing listens
on its port, then it listens again). No timing is asserted: a write that waited on the server
would block on a request the test holds, and the test would not get past it.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest

from kfp_trainer.tracking.sender import Sender
from kfp_trainer.tracking.step import StepRun, StepTracking
from kfp_trainer.tracking.trainer import RunLogger


class _MLflow(http.server.BaseHTTPRequestHandler):
    """The part of MLflow's REST API a trainer and a step's end write to."""

    protocol_version = "HTTP/1.0"

    def _reply(self, status: int, answer: dict) -> None:
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802 - http.server's name
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.arrived.set()
        server.release.wait(60)  # a hung server: nothing answered until released
        if server.refuse:
            return self._reply(server.refuse, {"error_code": "PERMISSION_DENIED", "message": "no"})
        if self.path.endswith("log-batch") and body.get("params") and server.params_conflict:
            return self._reply(400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "changing param values is not allowed"})
        server.requests.append((self.path.rsplit("/", 1)[-1], body))
        self._reply(200, {})

    def do_PUT(self):  # noqa: N802
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append(("PUT " + self.path.rsplit("/", 1)[-1], len(data)))
        self._reply(200, {})

    def log_message(self, *args):
        pass


class FakeMlflow:
    """The server above on a port of its own; ``down()`` closes the port, ``up()`` opens it again."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[tuple[str, dict]] = []
        self.release, self.arrived = threading.Event(), threading.Event()
        self.release.set()
        self.refuse, self.params_conflict = 0, False
        self.server: http.server.ThreadingHTTPServer | None = None
        self.up()

    def up(self) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), _MLflow)
        server.daemon_threads = True
        server.requests, server.release, server.arrived = self.requests, self.release, self.arrived  # type: ignore[attr-defined]
        server.refuse, server.params_conflict = self.refuse, self.params_conflict  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.server = server

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def steps(self, key: str = "loss") -> list[int]:
        return [m["step"] for name, body in self.requests if name == "log-batch" for m in body.get("metrics", []) if m["key"] == key]


@pytest.fixture
def mlflow():
    server = FakeMlflow()
    yield server
    server.release.set()
    server.down()


def logger_for(server: FakeMlflow, said: list[str]) -> RunLogger:
    env = {"MLFLOW_TRACKING_URI": server.url, "MLFLOW_RUN_ID": "run-1", "RANK": "0"}
    return RunLogger(env=env, warn=said.append, at_exit=False)


def in_thread(work, timeout: float = 60.0) -> None:
    """Run ``work``; fail if it does not return (it waited on a request the test holds)."""
    done = threading.Event()
    threading.Thread(target=lambda: (work(), done.set()), daemon=True).start()
    assert done.wait(timeout), "a write waited on the server"


def until(condition, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.05)


def test_a_hung_server_holds_up_no_step_and_gets_every_line_in_order_once_it_answers(mlflow):
    said: list[str] = []
    logger = logger_for(mlflow, said)
    mlflow.release.clear()  # from now on the server holds every request
    logger.log_params({"lr": 0.1})
    assert mlflow.arrived.wait(30)  # the params request is out, and held
    in_thread(lambda: [logger.log_record({"step": step, "loss": 1.0 / step}) for step in range(1, 501)])
    assert mlflow.requests == []  # nothing answered yet, and 500 lines logged
    mlflow.release.set()
    assert logger.close() is True
    assert mlflow.steps() == list(range(1, 501))  # every line, in order, once
    batches = [body for name, body in mlflow.requests if name == "log-batch"]
    assert batches[0]["params"] == [{"key": "lr", "value": "0.1"}]
    assert len(batches) <= 4, len(batches)  # the lines that waited went out together (1000 metric values a request at most)
    assert {t["key"] for t in batches[1]["tags"]} >= {"kfp_trainer.host", "kfp_trainer.python"}  # the system tags, with the first metrics
    assert said == []


def test_a_server_that_is_down_then_back_gets_what_was_logged_meanwhile_and_the_trainer_says_so(mlflow):
    said: list[str] = []
    mlflow.down()
    logger = logger_for(mlflow, said)
    in_thread(lambda: [logger.log_record({"step": step, "loss": float(step)}) for step in range(1, 101)])
    assert logger.enabled  # not turned off: the server is only away
    until(lambda: said)  # the sender met the closed port
    mlflow.up()
    logger.log_record({"step": 101, "loss": 0.0})
    assert logger.close() is True and mlflow.steps() == list(range(1, 102))
    assert any("MLflow is not answering" in line and "training goes on" in line for line in said), said
    assert any("MLflow answers again after" in line for line in said), said


def test_memory_is_bounded_while_the_server_is_down_the_oldest_values_go_and_the_count_is_said(mlflow):
    said: list[str] = []
    mlflow.down()
    sender = Sender(logger_for(mlflow, []).sender.client, "run-1", say=said.append, max_points=50)
    for step in range(1, 201):
        sender.metrics([{"key": "loss", "value": 1.0, "timestamp": 0, "step": step}])
    sender.tags({"kept": "yes"})
    assert sender.dropped == 150
    mlflow.up()
    assert sender.close(60) is True
    assert mlflow.steps() == list(range(151, 201)) and any(t["key"] == "kept" for _, b in mlflow.requests for t in b.get("tags", []))
    assert any("150 of the oldest metric values were dropped" in line for line in said), said


def test_what_a_server_that_never_answers_missed_is_said_at_the_end_which_waits_no_longer_than_it_is_told(mlflow):
    said: list[str] = []
    mlflow.down()
    sender = Sender(logger_for(mlflow, []).sender.client, "run-1", say=said.append)
    sender.metrics([{"key": "loss", "value": 1.0, "timestamp": 0, "step": 1}] * 3)
    sender.call(lambda: None, "the run's status FINISHED")
    assert sender.close(0.5) is False
    assert any("not delivered after waiting 0.5 s for the server: 3 metric values, the run's status FINISHED" in s for s in said), said


def test_a_refusal_turns_logging_off_with_one_warning_and_a_params_conflict_skips_only_the_params(mlflow):
    said: list[str] = []
    mlflow.server.params_conflict = True
    logger = logger_for(mlflow, said)
    logger.log_params({"lr": 0.2})
    logger.log_record({"step": 1, "loss": 1.0})
    logger.sender.flush(30)
    assert mlflow.steps() == [1] and logger.enabled and len(said) == 1 and "params not logged" in said[0]
    mlflow.server.refuse = 403
    logger.log_record({"step": 2, "loss": 1.0})
    logger.sender.flush(30)
    assert not logger.enabled and logger.log_record({"step": 3, "loss": 1.0}) is False
    assert len(said) == 2 and "logging is off" in said[1] and "training goes on" in said[1]


def test_the_steps_end_waits_for_a_hung_server_and_its_final_status_and_report_reach_it_once_it_answers(mlflow, tmp_path):
    from kfp_trainer.tracking.client import MlflowClient

    said: list[str] = []
    tracking = StepTracking(None, MlflowClient(mlflow.url, env={}, timeout=30, attempts=1), StepRun("run-1", "1", "mlflow-artifacts:/1/r"),
                            say=said.append, flush_seconds=60)  # fmt: skip
    tracking.sender = Sender(tracking.client, "run-1", say=said.append)
    report = tmp_path / "report.html"
    report.write_bytes(b"<html>" + b"x" * 3_000_000 + b"</html>")  # streamed from the file
    mlflow.release.clear()
    tracking.submitted("default/job-1", None)
    assert mlflow.arrived.wait(30)
    threading.Timer(1.0, mlflow.release.set).start()  # the server answers again while the step's end waits
    tracking.finished(None, metrics={"loss": 0.25}, report=report)
    names = [name for name, _ in mlflow.requests]
    assert names == ["log-batch", "log-batch", "PUT report.html", "update"], names
    assert mlflow.requests[2][1] == report.stat().st_size and mlflow.requests[3][1]["status"] == "FINISHED"
    assert not tracking.enabled and said == []


def test_a_cancelled_steps_end_waits_for_mlflow_at_most_five_seconds(mlflow):
    from kfp_trainer.errors import CancelledError
    from kfp_trainer.tracking.client import MlflowClient

    said: list[str] = []
    tracking = StepTracking(None, MlflowClient(mlflow.url, env={}, timeout=30, attempts=1), StepRun("run-1", "1", ""),
                            say=said.append, flush_seconds=600)  # fmt: skip
    tracking.sender = Sender(tracking.client, "run-1", say=said.append)
    mlflow.release.clear()
    in_thread(lambda: tracking.failed(CancelledError("cancelled")), timeout=30)
    assert any("not delivered after waiting 5 s" in line and "KILLED" in line for line in said), said


def test_the_trainers_logger_flushes_at_the_interpreters_exit(mlflow, tmp_path):
    import subprocess
    import sys

    script = (
        "import os\n"
        "from kfp_trainer.trainers._common import emit\n"
        "for step in range(1, 51):\n"
        "    emit({'step': step, 'loss': 1.0 / step})\n"
    )
    env = {**{k: v for k, v in __import__("os").environ.items() if not k.startswith("MLFLOW_")}, "MLFLOW_TRACKING_URI": mlflow.url,
           "MLFLOW_RUN_ID": "run-1", "RANK": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert mlflow.steps() == list(range(1, 51))


# --------------------------------------------------------------------------- a create whose answer was lost


class _LosesCreateAnswers(http.server.BaseHTTPRequestHandler):
    """Stores each run it is asked to create, then answers 503 (as a proxy timing out in front of a slow server does)."""

    protocol_version = "HTTP/1.0"

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        runs = self.server.runs
        if self.path.endswith("runs/create"):
            runs.append({"info": {"run_id": f"run-{len(runs)}", "artifact_uri": ""}, "tags": {t["key"]: t["value"] for t in body["tags"]}})
            answer, status = {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "upstream timed out"}, 503
        else:  # runs/search: the filter names one tag and its value
            key, value = body["filter"].split("`")[1], body["filter"].split("'")[1]
            answer, status = {"runs": [r for r in runs if r["tags"].get(key) == value]}, 200
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_retried_create_whose_answer_was_lost_never_makes_a_second_run():
    from kfp_trainer.tracking.client import MlflowClient

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LosesCreateAnswers)
    server.runs = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = MlflowClient(f"http://127.0.0.1:{server.server_address[1]}", env={}, attempts=3, backoff=0.01)
        info, earlier = client.find_or_create_run("1", name="p/train", tags={"kfp_trainer.task": "k-1", "x": "y"}, key="kfp_trainer.task")
        assert (info["run_id"], earlier) == ("run-0", False) and len(server.runs) == 1  # the lost answer's run, found by its tag
        again, earlier = client.find_or_create_run("1", name="p/train", tags={"kfp_trainer.task": "k-1"}, key="kfp_trainer.task")
        assert (again["run_id"], earlier) == ("run-0", True) and len(server.runs) == 1  # the next try of the task continues it
        with pytest.raises(Exception, match="TEMPORARILY_UNAVAILABLE"):  # what create_run alone does: a retry makes a second run
            client.create_run("1", name="p/train", tags={"kfp_trainer.task": "k-2"})
        assert len(server.runs) == 4
    finally:
        server.shutdown()
