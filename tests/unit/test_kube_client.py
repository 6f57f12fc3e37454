"""The backend's one HTTP client against a local HTTP server: what goes over the wire, what comes back, and a 401."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kfp_trainer.backends.kube.api import RetryPolicy, call
from kfp_trainer.backends.kube.apierrors import APIError, TransportError
from kfp_trainer.backends.kube.bodylines import each_line
from kfp_trainer.backends.kube.client import Client, Stream
from kfp_trainer.backends.kube.credentials import Credentials, Token
from kfp_trainer.errors import ForbiddenError, RejectedError

ALREADY_EXISTS = {
    "kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409,
    "message": 'trainjobs.trainer.kubeflow.org "j" already exists',
    "details": {"name": "j", "group": "trainer.kubeflow.org", "kind": "trainjobs"},
}  # fmt: skip
INVALID = {
    "kind": "Status", "reason": "Invalid", "code": 422, "message": 'TrainJob.trainer.kubeflow.org "j" is invalid',
    "details": {"causes": [{"reason": "FieldValueInvalid", "field": "spec.trainer.numNodes", "message": "must be >= 1"}]},
}  # fmt: skip


class Server:
    """Records each request; answers with ``answer(request)`` -> (status, body, content type), or the next scripted answer."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.answers: list[tuple[int, object]] = []
        self.answer = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = {"method": self.command, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": self.rfile.read(length).decode() if length else None}  # fmt: skip
                outer.seen.append(request)
                if outer.answer is not None:
                    status, body, kind = outer.answer(request)
                else:
                    status, body = outer.answers.pop(0) if outer.answers else (200, {})
                    kind = "application/json"
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


class Fixed(Token):
    def __init__(self, value: str) -> None:
        self.value = value

    def authorization(self) -> str:
        return self.value


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture
def api(server):
    with Client(Credentials(server.url, token=Fixed("Bearer sekret"))) as c:
        yield c


def test_a_request_sends_its_path_query_body_and_headers(server, api):
    server.answers = [(201, {"metadata": {"name": "j"}}), (200, {"items": []}), (200, {})]
    query = {"fieldValidation": "Strict", "dryRun": "All"}
    created = api.request("POST", "/apis/g.io/v1/namespaces/ns/jobs", query=query, body={"kind": "J"})
    assert created == {"metadata": {"name": "j"}}
    api.request("GET", "/apis/g.io/v1/namespaces/ns/jobs", query=[("labelSelector", "a=b,c in (d)"), ("watch", False), ("x", None)])
    api.request("PATCH", "/j", body={"metadata": {}}, headers={"Content-Type": "application/merge-patch+json"})
    create, listing, patch = server.seen
    assert (create["method"], create["path"]) == ("POST", "/apis/g.io/v1/namespaces/ns/jobs?fieldValidation=Strict&dryRun=All")
    assert create["headers"]["authorization"] == "Bearer sekret" and create["headers"]["content-type"] == "application/json"
    assert create["headers"]["user-agent"] == "kfp-trainer" and json.loads(create["body"]) == {"kind": "J"}
    assert listing["path"] == "/apis/g.io/v1/namespaces/ns/jobs?labelSelector=a%3Db%2Cc+in+%28d%29&watch=false"
    assert listing["body"] is None and "content-type" not in listing["headers"]
    assert patch["headers"]["content-type"] == "application/merge-patch+json"


def test_an_answer_outside_2xx_keeps_the_servers_status_reason_and_details(server, api):
    server.answers = [(409, ALREADY_EXISTS), (422, INVALID), (503, b"upstream connect error")]
    with pytest.raises(APIError) as conflict:
        api.request("POST", "/j", body={})
    assert (conflict.value.status, conflict.value.reason, conflict.value.details["name"]) == (409, "AlreadyExists", "j")
    with pytest.raises(RejectedError, match=r"is invalid \(spec.trainer.numNodes: must be >= 1\)") as invalid:
        call(api.request, "POST", "/j", body={}, what="create TrainJob ns/j", policy=RetryPolicy(attempts=1))
    assert invalid.value.answer.reason == "Invalid" and invalid.value.answer.causes[0]["field"] == "spec.trainer.numNodes"
    with pytest.raises(APIError) as failed:
        api.request("GET", "/x")
    assert failed.value.status == 503 and failed.value.reason == "" and "upstream connect error" in str(failed.value)


def test_callers_get_one_hierarchy_typed_by_what_they_do_about_the_answer():
    from kfp_trainer.backends.kube.api import Conflict, Gone, NotFound, translate
    from kfp_trainer.backends.kube.apierrors import api_error
    from kfp_trainer.errors import InfraError

    statuses = (400, 401, 403, 404, 409, 410, 422, 429, 418, 500, 504)
    assert {type(api_error(s, b"")) for s in statuses} == {APIError}  # the client's report: one type, the status in it
    mapped = [type(translate(api_error(s, b""), "x")) for s in statuses]
    assert mapped == [RejectedError, ForbiddenError, ForbiddenError, NotFound, Conflict, Gone, RejectedError, InfraError, InfraError,
                      InfraError, InfraError]  # fmt: skip
    throttled = api_error(429, {"reason": "TooManyRequests", "message": "slow down"}, "3")
    assert throttled.retry_after == 3.0 and translate(throttled, "x").answer is throttled


def test_a_throttled_call_waits_at_least_what_the_server_asked():
    from kfp_trainer.backends.kube.apierrors import api_error

    answers = iter([api_error(429, {"reason": "TooManyRequests", "message": "slow down"}, "2"), {"ok": True}])

    def request():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    slept: list[float] = []
    assert call(request, what="get x", policy=RetryPolicy(attempts=2, base=0.01), sleep=slept.append) == {"ok": True}
    assert len(slept) == 1 and slept[0] >= 2.0


def test_a_body_that_is_not_json_comes_back_as_text(server, api):
    server.answer = lambda request: (200, b"line 1\nline 2\n", "text/plain")
    assert api.request("GET", "/api/v1/namespaces/ns/pods/p/log") == "line 1\nline 2\n"


def test_a_streamed_request_is_read_line_by_line(server, api):
    server.answer = lambda request: (200, b'{"type": "ADDED"}\n\n{"type": "DELETED"}', "application/json")
    stream = api.request("GET", "/w", query={"watch": True}, timeout=(5, 5), stream=True)
    assert isinstance(stream, Stream)
    assert [json.loads(line)["type"] for line in each_line(stream)] == ["ADDED", "DELETED"]
    stream.close()
    assert server.seen[0]["path"] == "/w?watch=true"


def test_a_401_reads_the_credentials_again_once_and_retries_with_them(server):
    loads = []

    def reload() -> Credentials:
        loads.append(1)
        return Credentials(server.url, token=Fixed("Bearer rotated"), loader=reload)

    server.answer = lambda r: (200, {"ok": True}, "application/json") if r["headers"].get("authorization") == "Bearer rotated" else (
        401, {"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"}, "application/json")  # fmt: skip
    api = Client(Credentials(server.url, token=Fixed("Bearer expired"), loader=reload))
    assert api.request("GET", "/x") == {"ok": True}
    assert api.request("GET", "/y") == {"ok": True}
    assert [r["headers"]["authorization"] for r in server.seen] == ["Bearer expired", "Bearer rotated", "Bearer rotated"]
    assert len(loads) == 1


def test_a_401_after_reading_again_is_said_and_not_retried_for_ever(server):
    loads = []

    def reload() -> Credentials:
        loads.append(1)
        return Credentials(server.url, token=Fixed("Bearer still-bad"), loader=reload)

    server.answer = lambda r: (401, {"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"}, "application/json")
    api = Client(Credentials(server.url, token=Fixed("Bearer bad"), loader=reload))
    with pytest.raises(APIError, match=r"\(401"):
        api.request("GET", "/x")
    assert len(server.seen) == 2 and len(loads) == 1
    with pytest.raises(ForbiddenError, match="did not accept the credentials"):
        call(api.request, "GET", "/x", what="get x", policy=RetryPolicy(attempts=3), sleep=lambda s: None)
    static = Client(Credentials(server.url, token=Fixed("Bearer fixed")))  # nothing to read again: no second try
    with pytest.raises(APIError, match=r"\(401"):
        static.request("GET", "/x")
    assert len(server.seen) == 5


def test_requests_refused_together_read_the_credentials_once(server):
    loads = []
    arrived = threading.Barrier(2, timeout=10)

    def reload() -> Credentials:
        loads.append(1)
        return Credentials(server.url, token=Fixed("Bearer rotated"), loader=reload)

    def answer(request):
        if request["headers"].get("authorization") == "Bearer rotated":
            return 200, {"ok": True}, "application/json"
        arrived.wait()  # both requests were sent with the old token before either is refused
        return 401, {"kind": "Status", "reason": "Unauthorized"}, "application/json"

    server.answer = answer
    api = Client(Credentials(server.url, token=Fixed("Bearer expired"), loader=reload))
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(api.request("GET", "/x"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert results == [{"ok": True}, {"ok": True}] and len(loads) == 1


def test_no_answer_is_a_transport_error_never_the_http_librarys_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: refused
        port = s.getsockname()[1]
        api = Client(Credentials(f"http://127.0.0.1:{port}"))
        with pytest.raises(TransportError) as raised:
            api.request("GET", "/x", timeout=2)
    assert type(raised.value) is TransportError and not isinstance(raised.value, APIError)
    assert "GET /x" in str(raised.value)


def test_a_command_line_client_fails_fast_only_until_the_server_has_answered(server):
    from kfp_trainer.backends.kube.client import FirstContact

    class Unreachable(Exception):
        pass

    api = Client(Credentials(server.url), first_contact=FirstContact(1.0, lambda e: Unreachable(str(e))))
    server.httpd.shutdown()
    server.httpd.server_close()  # nothing listens any more: refused
    with pytest.raises(Unreachable) as raised:
        api.request("GET", "/x")
    assert isinstance(raised.value.__cause__, TransportError)
    again = Server()
    try:
        answered = Client(Credentials(again.url), first_contact=FirstContact(1.0, lambda e: Unreachable(str(e))))
        assert answered.request("GET", "/x") == {}
        again.httpd.shutdown()
        again.httpd.server_close()
        answered.close()  # its kept-alive connection too
        with pytest.raises(TransportError):  # it answered once: a lost connection now is transient, retried by the caller
            answered.request("GET", "/x", timeout=2)
    finally:
        again.httpd.server_close()
