"""The backend's REST client against a local HTTP server: what goes over the wire, and what comes back."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client as library

from kfp_trainer.backends.kube.api import ApiException, RetryPolicy, call, request
from kfp_trainer.backends.kube.objects import CustomObjects, Pods
from kfp_trainer.backends.kube.rest import Client, Settings
from kfp_trainer.errors import RejectedError

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Running"}}


class Server:
    """Records each request; answers with the next scripted (status, body)."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.answers: list[tuple[int, object]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.seen.append({"method": self.command, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                   "body": self.rfile.read(length).decode() if length else None})  # fmt: skip
                status, body = outer.answers.pop(0) if outer.answers else (200, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _any

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()


@pytest.fixture
def api(server):
    with Client(Settings(server.url, token="Bearer sekret")) as c:
        yield c


def test_custom_objects_send_the_librarys_paths_queries_and_content_types(server, api):
    objects = CustomObjects(api)
    server.answers = [(201, {"metadata": {"name": "j"}}), (200, {"items": []}), (200, {}), (200, {})]
    created = objects.create_namespaced_custom_object("g.io", "v1", "ns", "jobs", {"kind": "J"}, field_validation="Strict", dry_run="All")
    assert created == {"metadata": {"name": "j"}}
    objects.list_namespaced_custom_object("g.io", "v1", "ns", "jobs", label_selector="a=b,c in (d)")
    objects.patch_namespaced_custom_object("g.io", "v1", "ns", "jobs", "j", {"metadata": {"annotations": {"x": "y"}}})
    objects.delete_namespaced_custom_object(
        "g.io", "v1", "ns", "jobs", "j", propagation_policy="Background", body={"preconditions": {"uid": "u"}}
    )
    create, listing, patch, delete = server.seen
    assert (create["method"], create["path"]) == ("POST", "/apis/g.io/v1/namespaces/ns/jobs?fieldValidation=Strict&dryRun=All")
    assert create["headers"]["authorization"] == "Bearer sekret" and create["headers"]["content-type"] == "application/json"
    assert json.loads(create["body"]) == {"kind": "J"}
    assert listing["path"] == "/apis/g.io/v1/namespaces/ns/jobs?labelSelector=a%3Db%2Cc+in+%28d%29"
    assert patch["headers"]["content-type"] == "application/merge-patch+json"
    assert (delete["method"], delete["path"]) == ("DELETE", "/apis/g.io/v1/namespaces/ns/jobs/j?propagationPolicy=Background")
    assert json.loads(delete["body"]) == {"preconditions": {"uid": "u"}}


def test_an_error_answer_is_an_api_exception_that_translates_as_before(server, api):
    server.answers = [(422, {"message": 'strict decoding error: unknown field "spec.x"'})]
    with pytest.raises(RejectedError, match='unknown field "spec.x"'):
        call(
            request,
            api,
            "/apis/g.io/v1/namespaces/ns/jobs",
            [],
            method="POST",
            body={},
            timeout=5,
            what="create",
            policy=RetryPolicy(attempts=1),
        )
    server.answers = [(404, {"message": "nope"})]
    with pytest.raises(ApiException) as raised:
        request(api, "/x", [], timeout=5)
    assert raised.value.status == 404 and "nope" in raised.value.body


def test_a_streamed_request_returns_the_raw_response(server, api):
    server.answers = [(200, {"type": "ADDED"})]
    response = request(api, "/w", [("watch", "true")], timeout=(5, 5), stream=True)
    assert json.loads(response.read()) == {"type": "ADDED"}
    assert server.seen[0]["path"] == "/w?watch=true"


def test_generated_api_classes_run_on_it_with_typed_answers(server, api):
    server.answers = [(200, POD), (200, POD)]
    pod = library.CoreV1Api(api).read_namespaced_pod("p", "ns")
    assert isinstance(pod, library.V1Pod) and pod.status.phase == "Running"
    assert api.sanitize_for_serialization(pod)["metadata"]["name"] == "p"
    assert Pods(api).read_namespaced_pod("p", "ns") == POD  # the dict, no model
    assert [s["path"] for s in server.seen] == ["/api/v1/namespaces/ns/pods/p"] * 2


def test_the_client_librarys_own_exception_is_converted(api):
    class Library:
        def call_api(self, *args, **kwargs):
            raise library.ApiException(status=410, reason="Gone")

    with pytest.raises(ApiException) as raised:
        request(Library(), "/x", [], timeout=5)
    assert raised.value.status == 410
