"""The progress reporter speaks the Trainer v2.3 status server's protocol, and never hurts training."""

from __future__ import annotations

import functools
import json
import os
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from kfp_trainer import progress

CRDS = Path(os.environ.get("KFP_TRAINER_CRDS_DIR", Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-v2.3.0")) / "crds"


@functools.cache
def trainer_status_schema() -> dict:
    crd = yaml.load((CRDS / "trainer.kubeflow.org_trainjobs.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["trainerStatus"]


def schema_errors(value, schema, path="trainerStatus") -> list[str]:
    """The parts of an OpenAPI v3 structural schema the trainerStatus CRD uses."""
    errors = []
    typ = schema.get("type")
    if typ == "object":
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        props = schema.get("properties", {})
        errors += [f"{path}.{k}: unknown field" for k in value if k not in props]
        errors += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            if k in props:
                errors += schema_errors(v, props[k], f"{path}.{k}")
    elif typ == "array":
        if not isinstance(value, list):
            return [f"{path}: not an array"]
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{path}: more than {schema['maxItems']} items")
        for i, v in enumerate(value):
            errors += schema_errors(v, schema["items"], f"{path}[{i}]")
    elif typ == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: not an integer"]
        if value < schema.get("minimum", value) or value > schema.get("maximum", value) or not -(2**31) <= value < 2**31:
            errors.append(f"{path}: {value} out of range")
    elif typ == "string":
        if not isinstance(value, str):
            return [f"{path}: not a string"]
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            errors.append(f"{path}: length {len(value)}")
    return errors


@pytest.mark.parametrize(
    "pct, eta, metrics",
    [
        (42.4, 3600.6, {"loss": 0.123456789, "lr": 2e-5, "step": 10}),
        (150, -5, {}),
        (-1, 10**12, {"x" * 100: "y" * 100}),
        (float("nan"), float("inf"), {"": 1, "empty": ""}),
        (None, None, {f"m{i}": i for i in range(300)}),
    ],
)
def test_payloads_fit_the_trainjob_crds_trainer_status_schema(pct, eta, metrics):
    payload = progress.build_payload(pct, eta, metrics, now=1_800_000_000)
    assert list(payload) == ["trainerStatus"]
    assert schema_errors(payload["trainerStatus"], trainer_status_schema()) == []
    assert "lastUpdatedTime" in payload["trainerStatus"]  # the CRD's CEL rule requires it


def test_payload_field_names_are_the_upstream_update_request_types():
    from kubeflow_trainer_api.models import TrainerV1alpha1UpdateTrainJobStatusRequest

    payload = progress.build_payload(50, 60, {"loss": 1.5}, now=0)
    parsed = TrainerV1alpha1UpdateTrainJobStatusRequest.from_dict(payload)
    status = parsed.trainer_status
    assert (status.progress_percentage, status.estimated_remaining_seconds) == (50, 60)
    assert [(m.name, m.value) for m in status.metrics] == [("loss", "1.5")]
    assert status.last_updated_time.isoformat() == "1970-01-01T00:00:00+00:00"
    assert parsed.to_dict() == payload | {"trainerStatus": payload["trainerStatus"] | {"lastUpdatedTime": status.last_updated_time}}


def test_values_are_rounded_clamped_and_metric_values_sent_as_text():
    s = progress.build_payload(99.6, 12.4, {"acc": 0.5, "tokens": 1024, "name": "run-1"}, now=0)["trainerStatus"]
    assert s["progressPercentage"] == 100 and s["estimatedRemainingSeconds"] == 12
    assert s["metrics"] == [{"name": "acc", "value": "0.5"}, {"name": "tokens", "value": "1024"}, {"name": "name", "value": "run-1"}]


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def env(tmp_path):
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    return {
        progress.ENV_URL: "https://trainer.svc:10443/apis/x/status",
        progress.ENV_CA_CERT: str(tmp_path / "ca.crt"),
        progress.ENV_TOKEN: str(token),
    }


def recorder(status=200):
    calls = []

    def send(url, body, headers, ca_file, timeout):
        calls.append({"url": url, "body": json.loads(body), "headers": headers, "ca": ca_file, "timeout": timeout})
        return status, "{}"

    return calls, send


def test_reports_post_the_payload_with_the_bearer_token_to_the_injected_url(env):
    calls, send = recorder()
    r = progress.ProgressReporter(env=env, transport=send)
    assert r.enabled and r.report(10, 90, {"loss": 2.0})
    [call] = calls
    assert call["url"] == env[progress.ENV_URL] and call["ca"] == env[progress.ENV_CA_CERT]
    assert call["headers"] == {"Authorization": "Bearer tok-1", "Content-Type": "application/json"}
    assert call["body"]["trainerStatus"]["progressPercentage"] == 10


def test_reports_are_spaced_out_but_the_last_step_always_goes(env):
    calls, send = recorder()
    clock = FakeClock()
    r = progress.ProgressReporter(env=env, transport=send, clock=clock, min_interval=5)
    assert r.report(1)
    clock.t += 1
    assert not r.report(2)
    clock.t += 5
    assert r.report(3)
    clock.t += 1
    assert r.report_step(10, 10)  # done: sent at once
    assert [c["body"]["trainerStatus"]["progressPercentage"] for c in calls] == [1, 3, 100]


def test_report_step_estimates_the_remaining_time_from_the_pace_so_far(env):
    calls, send = recorder()
    clock = FakeClock()
    r = progress.ProgressReporter(env=env, transport=send, clock=clock)
    clock.t += 30
    r.report_step(25, 100, {"loss": 1.0})
    s = calls[0]["body"]["trainerStatus"]
    assert (s["progressPercentage"], s["estimatedRemainingSeconds"]) == (25, 90)


def test_report_fraction_serves_trainers_that_stop_on_a_step_count_or_a_time_budget(env):
    calls, send = recorder()
    clock = FakeClock()
    r = progress.ProgressReporter(env=env, transport=send, clock=clock, min_interval=5)
    clock.t += 60
    assert r.report_fraction(0.4, {"loss": 1.5})
    clock.t += 1
    assert not r.report_fraction(0.45) and not r.report_fraction(float("nan"))  # spaced out; nonsense is 0 %, not sent
    assert r.report_fraction(1.7)  # done (clamped): always sent
    sent = [c["body"]["trainerStatus"] for c in calls]
    assert [(s["progressPercentage"], s["estimatedRemainingSeconds"]) for s in sent] == [(40, 90), (100, 0)]


def test_the_token_file_is_read_again_for_each_report(env):
    calls, send = recorder()
    clock = FakeClock()
    r = progress.ProgressReporter(env=env, transport=send, clock=clock, min_interval=0)
    r.report(1)
    Path(env[progress.ENV_TOKEN]).write_text("tok-2")  # the kubelet rotated it
    r.report(2)
    assert [c["headers"]["Authorization"] for c in calls] == ["Bearer tok-1", "Bearer tok-2"]


def test_only_global_rank_zero_reports(env):
    assert not progress.ProgressReporter(env={**env, "RANK": "3"}).enabled
    assert progress.ProgressReporter(env={**env, "RANK": "0"}).enabled
    assert not progress.ProgressReporter(env={**env, "OMPI_COMM_WORLD_RANK": "1"}).enabled


def test_outside_a_trainjob_nothing_is_sent():
    calls, send = recorder()
    r = progress.ProgressReporter(env={}, transport=send)
    assert not r.enabled and not r.report(50) and calls == []


def test_refusals_and_network_errors_are_kept_not_raised(env):
    _, send = recorder(status=403)
    r = progress.ProgressReporter(env=env, transport=send)
    assert not r.report(5) and r.last_error.startswith("HTTP 403")

    def broken(*a):
        raise ConnectionRefusedError("no route")

    r = progress.ProgressReporter(env=env, transport=broken)
    assert not r.report(5) and "ConnectionRefusedError" in r.last_error


def test_a_missing_token_file_skips_the_report(env):
    calls, send = recorder()
    os.remove(env[progress.ENV_TOKEN])
    r = progress.ProgressReporter(env=env, transport=send)
    assert not r.report(5) and calls == [] and "cannot read the status token" in r.last_error


class _Capture(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.path, dict(self.headers), json.loads(body)))
        out = json.dumps(json.loads(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *a):
        pass


def _serve(server):
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    return t


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test CA")
def test_a_real_https_post_verifies_the_server_against_the_injected_ca(tmp_path, env):
    key, cert = tmp_path / "tls.key", tmp_path / "tls.crt"
    san = "subjectAltName=IP:127.0.0.1"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost", "-addext", san]
    subprocess.run([*openssl, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    _Capture.seen = []
    server = HTTPServer(("127.0.0.1", 0), _Capture)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    _serve(server)
    try:
        path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job/status"
        url = f"https://127.0.0.1:{server.server_address[1]}{path}"
        ok = progress.ProgressReporter(env={**env, progress.ENV_URL: url, progress.ENV_CA_CERT: str(cert)})
        assert ok.report(30, 70, {"loss": 0.5}), ok.last_error
        [(seen_path, headers, body)] = _Capture.seen
        assert seen_path == path and headers["Authorization"] == "Bearer tok-1"
        assert body["trainerStatus"]["metrics"] == [{"name": "loss", "value": "0.5"}]
        untrusted = progress.ProgressReporter(env={**env, progress.ENV_URL: url, progress.ENV_CA_CERT: ""})
        assert not untrusted.report(40) and "CERTIFICATE_VERIFY_FAILED" in untrusted.last_error
    finally:
        server.shutdown()


def test_token_audience_matches_the_status_path():
    assert progress.token_audience("ns", "job") == "trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job/status"
    assert (
        progress.STATUS_PATH.format(namespace="ns", name="job") == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job/status"
    )
