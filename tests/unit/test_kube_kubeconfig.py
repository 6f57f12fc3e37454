"""The backend's kubeconfig / service-account reader gives what the client library's loader gives, and hands it the rest."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from kfp_trainer.backends.kube import kubeconfig
from kfp_trainer.backends.kube.rest import Settings

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def write(tmp_path: Path, user: dict, cluster: dict | None = None, namespace: str | None = None) -> Path:
    ctx = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "main",
        "contexts": [{"name": "main", "context": ctx}, {"name": "other", "context": {"cluster": "c2", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443/"}},
                     {"name": "c2", "cluster": {"server": "https://10.0.0.2:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def library(path: Path, context: str | None = None) -> client.Configuration:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), context=context, client_configuration=configuration)
    return configuration


def same(ours: Settings, theirs: client.Configuration) -> None:
    assert ours.host == theirs.host
    assert ours.verify_ssl == theirs.verify_ssl
    assert ours.tls_server_name == theirs.tls_server_name
    for key in ("ssl_ca_cert", "cert_file", "key_file"):
        mine, lib = getattr(ours, key), getattr(theirs, key)
        assert (mine is None) == (lib is None), key
        if mine:
            assert Path(mine).read_bytes() == Path(lib).read_bytes(), key
    assert ours.auth_settings().get("BearerToken", {}).get("value") == theirs.auth_settings().get("BearerToken", {}).get("value")


CASES = {
    "token": ({"token": "abc.def"}, None),
    "client certificates as data": (
        {"client-certificate-data": base64.b64encode(PEM).decode(), "client-key-data": base64.b64encode(b"KEY").decode()},
        {"server": "https://10.0.0.1:6443", "certificate-authority-data": base64.b64encode(PEM).decode()},
    ),
    "files relative to the kubeconfig": (
        {"client-certificate": "cert.pem", "client-key": "key.pem"},
        {"server": "https://10.0.0.1:6443", "certificate-authority": "ca.pem", "tls-server-name": "api.internal"},
    ),
    "token file, no TLS check": ({"tokenFile": "token.txt"}, {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True}),
    "plain http": ({}, {"server": "http://127.0.0.1:8080"}),
}


@pytest.mark.parametrize("case", CASES)
def test_settings_match_the_client_librarys_loader(tmp_path, case):
    user, cluster = CASES[case]
    for name, content in (("cert.pem", PEM), ("key.pem", b"KEY"), ("ca.pem", PEM), ("token.txt", b"tok-from-file")):
        (tmp_path / name).write_bytes(content)
    path = write(tmp_path, user, cluster)
    ours = kubeconfig.kubeconfig_settings(str(path))
    assert isinstance(ours, Settings)
    same(ours, library(path))


def test_another_context_is_read_when_named(tmp_path):
    path = write(tmp_path, {"token": "t"})
    ours = kubeconfig.kubeconfig_settings(str(path), context="other")
    same(ours, library(path, context="other"))
    assert ours.verify_ssl is False


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "true"}},
        {"auth-provider": {"name": "oidc", "config": {}}},
        {"username": "a", "password": "b"},
    ],
)
def test_exec_plugins_auth_providers_and_passwords_are_left_to_the_library(tmp_path, user):
    assert kubeconfig.kubeconfig_settings(str(write(tmp_path, user))) is None


def test_the_library_reads_what_this_reader_leaves(tmp_path):
    path = write(tmp_path, {"username": "a", "password": "b"})
    loaded = kubeconfig.load_settings(str(path))
    assert isinstance(loaded, client.Configuration)
    assert loaded.auth_settings()["BearerToken"]["value"].startswith("Basic ")


def test_a_missing_certificate_file_gets_the_librarys_error(tmp_path):
    path = write(tmp_path, {"client-certificate": "gone.pem", "client-key": "gone.key"})
    with pytest.raises(config.ConfigException, match="gone.pem"):
        kubeconfig.load_settings(str(path))


def test_the_namespace_is_the_current_contexts(tmp_path):
    assert kubeconfig.context_namespace(str(write(tmp_path, {"token": "t"}, namespace="team-a"))) == "team-a"
    assert kubeconfig.context_namespace(str(write(tmp_path, {"token": "t"}))) == "default"
    (tmp_path / "broken").write_text("{not yaml")
    assert kubeconfig.context_namespace(str(tmp_path / "broken")) == "default"


def test_service_account_token_is_reread_as_it_rotates(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "ca.crt").write_bytes(PEM)
    settings = kubeconfig.incluster_settings(tmp_path)
    assert settings.host == "https://[fd00::1]:443" and settings.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert settings.auth_settings()["BearerToken"]["value"] == "Bearer first"
    (tmp_path / "token").write_text("second")
    assert settings.auth_settings()["BearerToken"]["value"] == "Bearer first"  # within the refresh period
    settings._token_read -= 61
    assert settings.auth_settings()["BearerToken"]["value"] == "Bearer second"


def test_an_incomplete_service_account_is_left_to_the_library(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert kubeconfig.incluster_settings(tmp_path) is None
