"""The command line fails fast, in one line and with its documented exit code, when no cluster can be reached.

Every server here is real and local: a port that refuses connections, a port that accepts
and never answers, a plain-HTTP port behind an https:// address, a TLS server whose
certificate the kubeconfig does not trust, and an HTTP API server that answers 401 or 403.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kfp_trainer.backends.kube.connect import connect
from kfp_trainer.errors import EXIT_INFRA, EXIT_USER, ClusterUnreachableError

REPO = Path(__file__).resolve().parents[2]
FAST = 10.0  # seconds: generous for a loaded machine; before the fix a refused connection took ~95 s
LAUNCH = ("launch", "--runtime", "torch-distributed", "--run-id", "r1", "--task-name", "train", "--logs", "none")


def write_kubeconfig(path: Path, server: str, *, insecure: bool = True, ca: Path | None = None) -> Path:
    cluster: dict = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    elif insecure:
        cluster["insecure-skip-tls-verify"] = True
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    return path


def cli(*args: str, env: dict[str, str] | None = None, home: Path | None = None) -> tuple[int, str, str, float]:
    """``kfp-trainer ARGS`` as a process: exit code, stdout, stderr, seconds."""
    environ = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    environ.update({"PYTHONPATH": str(REPO), **(env or {})})
    if home is not None:
        environ["HOME"] = str(home)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kfp_trainer.cli", *args], capture_output=True, text=True, env=environ, timeout=300)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def assert_one_line(stderr: str, *words: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr and "Retrying" not in stderr, stderr
    for word in words:
        assert word in lines[0], stderr
    return lines[0]


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port on 127.0.0.1 that is bound but not listening: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never says a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def serve(handle) -> tuple[socket.socket, int]:
    """A thread answering each connection with ``handle(conn)``; the port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                try:
                    handle(conn)
                except OSError:
                    pass

    threading.Thread(target=loop, daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize("home_config", [False, True], ids=["no-kubeconfig", "empty-home"])
def test_no_kubeconfig_is_one_line_and_exit_3(tmp_path, home_config):
    if home_config:
        (tmp_path / ".kube").mkdir()
    code, _, err, seconds = cli(*LAUNCH, home=tmp_path)
    assert code == EXIT_INFRA
    assert_one_line(err, "no cluster configured", "--kubeconfig", "--local")
    assert seconds < FAST


@pytest.mark.parametrize(
    "command",
    [LAUNCH, ("gc", "-A"), ("render", "--api-version", "auto", "--run-id", "r1")],
    ids=["launch", "gc", "render-auto"],
)
def test_a_refused_connection_fails_within_seconds_in_one_line_with_exit_3(tmp_path, refusing_port, command):
    config = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{refusing_port}")
    code, _, err, seconds = cli(*command, "--kubeconfig", str(config))
    assert code == EXIT_INFRA, err
    assert_one_line(err, f"https://127.0.0.1:{refusing_port}", "connection refused", str(config))
    assert seconds < FAST, f"took {seconds:.1f} s"


def test_kubeconfig_from_the_environment_is_named_too(tmp_path, refusing_port):
    config = write_kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{refusing_port}")
    code, _, err, _ = cli(*LAUNCH, env={"KUBECONFIG": str(config)})
    assert code == EXIT_INFRA
    assert_one_line(err, "connection refused", str(config))


def test_a_host_name_that_does_not_resolve_is_one_line(tmp_path):
    config = write_kubeconfig(tmp_path / "kubeconfig", "https://api.cluster.invalid:6443")  # .invalid never resolves (RFC 2606)
    code, _, err, seconds = cli(*LAUNCH, "--kubeconfig", str(config))
    assert code == EXIT_INFRA
    assert_one_line(err, "'api.cluster.invalid' does not resolve")
    assert seconds < 60  # a resolver may take its time to say no; never the minutes of retries


def test_plain_http_behind_an_https_address_is_a_tls_error_in_one_line(tmp_path):
    server, port = serve(lambda conn: (conn.recv(1024), conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")))
    with server:
        config = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
        code, _, err, seconds = cli(*LAUNCH, "--kubeconfig", str(config))
    assert code == EXIT_INFRA
    assert_one_line(err, "TLS handshake failed")
    assert seconds < FAST


def self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not-the-cluster")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / f"{name}.crt", folder / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_file, key_file


def test_a_server_certificate_the_kubeconfig_does_not_trust_is_one_line(tmp_path):
    cert_file, key_file = self_signed(tmp_path, "server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)

    def handshake(conn: socket.socket) -> None:
        try:
            with context.wrap_socket(conn, server_side=True):
                pass
        except ssl.SSLError:
            pass

    server, port = serve(handshake)
    other_ca, _ = self_signed(tmp_path, "other")  # the kubeconfig trusts another CA
    with server:
        config = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}", ca=other_ca)
        code, _, err, seconds = cli(*LAUNCH, "--kubeconfig", str(config))
    assert code == EXIT_INFRA
    assert_one_line(err, "TLS certificate not trusted", "certificate-authority")
    assert seconds < FAST


def test_a_server_that_never_answers_is_a_timeout_in_one_line(tmp_path, silent_port):
    config = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{silent_port}")
    started = time.monotonic()
    api = connect(str(config), timeout=1.0)  # nothing is sent yet
    with pytest.raises(ClusterUnreachableError) as caught:
        api.request("GET", "/version", timeout=(30, 30))  # the first request's connect timeout is the command line's
    assert time.monotonic() - started < FAST
    assert "no answer within 1 s" in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.exit_code == EXIT_INFRA


class Refusing(http.server.BaseHTTPRequestHandler):
    """An API server that turns every request down with ``status``."""

    status = 401
    message = "Unauthorized"
    seen: list[str] = []

    def _answer(self) -> None:
        Refusing.seen.append(f"{self.command} {self.path}")
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": self.message,
                           "reason": "Forbidden" if self.status == 403 else "Unauthorized", "code": self.status}).encode()  # fmt: skip
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "message", "words"),
    [
        (401, "Unauthorized", "did not accept the credentials"),
        (403, 'trainjobs.trainer.kubeflow.org is forbidden: User "u" cannot create resource "trainjobs" in API group '
              '"trainer.kubeflow.org" in the namespace "team"', "deploy/rbac.yaml"),
    ],
    ids=["401", "403"],
)  # fmt: skip
def test_credentials_the_api_server_refuses_are_one_line_and_exit_2(tmp_path, status, message, words):
    Refusing.seen.clear()
    handler = type("Handler", (Refusing,), {"status": status, "message": message})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{server.server_address[1]}")
        code, _, err, seconds = cli(*LAUNCH, "--kubeconfig", str(config))
    finally:
        server.shutdown()
        server.server_close()
    assert code == EXIT_USER
    assert_one_line(err, words)
    assert "not-a-real-token" not in err
    assert seconds < FAST
    # --kubeconfig's context namespace is the job's namespace (not ~/.kube/config's, not "default")
    asked = [path for path in Refusing.seen if "/namespaces/" in path]
    assert asked and all("/namespaces/team/" in path for path in asked), Refusing.seen


def test_the_check_adds_no_request_and_the_first_request_opens_the_connection_the_next_reuse(tmp_path):
    counted = {"connections": 0, "requests": 0}
    paths: list[str] = []

    class Counting(http.server.ThreadingHTTPServer):
        def get_request(self):
            counted["connections"] += 1
            return super().get_request()

    class Answering(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the API server

        def do_GET(self) -> None:  # noqa: N802
            counted["requests"] += 1
            paths.append(self.path)
            body = b'{"major": "1", "minor": "36", "gitVersion": "v1.36.0"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = Counting(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = connect(str(write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{server.server_address[1]}")))
        time.sleep(0.2)
        assert counted == {"connections": 0, "requests": 0}
        assert api.request("GET", "/apis", timeout=5)["gitVersion"] == "v1.36.0"
        assert api.request("GET", "/api", timeout=5)["minor"] == "36"
        assert counted == {"connections": 1, "requests": 2} and paths == ["/apis", "/api"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_stop_signal_while_connecting_is_a_cancel_not_an_unreachable_cluster(tmp_path):
    import signal

    connected = threading.Event()

    def hold(conn: socket.socket) -> None:
        connected.set()
        while conn.recv(1024):  # takes the TLS hello and never answers
            pass

    server, port = serve(hold)
    config = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    environ = {**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, "PYTHONPATH": str(REPO)}
    with server:
        proc = subprocess.Popen([sys.executable, "-m", "kfp_trainer.cli", *LAUNCH, "--kubeconfig", str(config)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)  # fmt: skip
        try:
            assert connected.wait(60), "the command never connected"
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    assert "cancelled" in err and "cannot reach" not in err and "Traceback" not in err, err
