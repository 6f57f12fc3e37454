"""Requests go through the proxy a kubeconfig's ``proxy-url`` or ``HTTPS_PROXY`` names: a real CONNECT proxy
counts the tunnels to a real TLS server whose name only the proxy can reach."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from kfp_trainer.backends.kube.apierrors import TransportError
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.credentials import from_kubeconfig
from tests.connect_proxy import ConnectProxy

NAME = "api.kfp-trainer.invalid"  # resolves nowhere: only the proxy reaches it


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for NAME and 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(hours=1)).add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))  # fmt: skip
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])).issuer_name(ca_name)
              .public_key(key.public_key()).serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
              .not_valid_after(now + datetime.timedelta(hours=1))
              .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))  # fmt: skip
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


@pytest.fixture
def tls_server(tmp_path) -> Iterator[tuple[int, Path]]:
    ca, cert, key = certificates(tmp_path)

    class Answering(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"path": self.path, "host": self.headers.get("Host")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], ca
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def proxy(tls_server) -> Iterator[ConnectProxy]:
    p = ConnectProxy(tls_server[0])
    yield p
    p.close()


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def kubeconfig(tmp_path: Path, cluster: dict) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))  # fmt: skip
    return str(path)


def test_requests_go_through_the_kubeconfigs_proxy_url(tmp_path, tls_server, proxy):
    port, ca = tls_server
    cluster = {"server": f"https://127.0.0.1:{port}", "certificate-authority": str(ca),
               "proxy-url": f"http://someone:s3cret@127.0.0.1:{proxy.port}"}  # fmt: skip
    with Client(from_kubeconfig(kubeconfig(tmp_path, cluster))) as api:
        assert api.request("GET", "/version")["path"] == "/version"
        assert api.request("GET", "/version?again")["path"] == "/version?again"
    assert [(t["method"], t["target"]) for t in proxy.tunnels] == [("CONNECT", f"127.0.0.1:{port}")]  # one tunnel, kept open
    assert proxy.tunnels[0]["auth"] == "Basic c29tZW9uZTpzM2NyZXQ="  # someone:s3cret


def test_requests_go_through_https_proxy_and_the_certificate_is_checked_for_the_servers_name(tmp_path, tls_server, proxy, monkeypatch):
    port, ca = tls_server
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.corp.example")
    with Client(from_kubeconfig(kubeconfig(tmp_path, {"server": f"https://{NAME}:{port}", "certificate-authority": str(ca)}))) as api:
        assert api.request("GET", "/apis")["host"] == f"{NAME}:{port}"
    assert [t["target"] for t in proxy.tunnels] == [f"{NAME}:{port}"]


def test_no_proxy_sends_requests_direct(tmp_path, tls_server, proxy, monkeypatch):
    port, ca = tls_server
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", "kfp-trainer.invalid")
    with Client(from_kubeconfig(kubeconfig(tmp_path, {"server": f"https://{NAME}:{port}", "certificate-authority": str(ca)}))) as api:
        with pytest.raises(TransportError):  # direct: the name resolves nowhere
            api.request("GET", "/apis", timeout=5)
    assert proxy.tunnels == []
