"""The credentials the client uses are what the ``kubernetes`` library's loader reads, field by field, except
where the loader is wrong (a quoted boolean) or silent (``proxy-url``, proxy variables)."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from kfp_trainer.backends.kube import credentials
from kfp_trainer.backends.kube.credentials import Credentials, TokenFile
from kfp_trainer.errors import CredentialsError

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN PRIVATE KEY-----\nMIIC\n-----END PRIVATE KEY-----\n"


def write(tmp_path: Path, user: dict, cluster: dict | None = None, namespace: str | None = None, name: str = "kubeconfig") -> Path:
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
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def library(path: Path | str, context: str | None = None) -> client.Configuration:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(path), context=context, client_configuration=configuration)
    return configuration


def same(ours: Credentials, theirs: client.Configuration) -> None:
    """Every setting the connection uses, compared with the library's."""
    assert ours.host == theirs.host
    assert ours.verify == theirs.verify_ssl
    assert ours.tls_server_name == theirs.tls_server_name
    for mine, lib, key in ((ours.ca_file, theirs.ssl_ca_cert, "ca"), (ours.cert_file, theirs.cert_file, "cert"),
                           (ours.key_file, theirs.key_file, "key")):  # fmt: skip
        assert (mine is None) == (lib is None), key
        if mine:
            assert Path(mine).read_bytes() == Path(lib).read_bytes(), key
    value = theirs.auth_settings().get("BearerToken", {}).get("value")
    assert ours.token.authorization() == (value.strip() if value else None)


CASES = {
    "token": ({"token": "abc.def"}, None),
    "client certificate and key as data, CA as data": (
        {"client-certificate-data": base64.b64encode(PEM).decode(), "client-key-data": base64.b64encode(KEY).decode()},
        {"server": "https://10.0.0.1:6443", "certificate-authority-data": base64.b64encode(PEM).decode()},
    ),
    "files relative to the kubeconfig, tls-server-name": (
        {"client-certificate": "cert.pem", "client-key": "key.pem"},
        {"server": "https://10.0.0.1:6443", "certificate-authority": "ca.pem", "tls-server-name": "api.internal"},
    ),
    "token file": ({"tokenFile": "token.txt"}, {"server": "https://10.0.0.1:6443"}),
    "insecure-skip-tls-verify true": ({"token": "t"}, {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": True}),
    "insecure-skip-tls-verify false": ({"token": "t"}, {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": False}),
    "user name and password": ({"username": "a", "password": "b"}, None),
    "exec plugin": (
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "interactiveMode": "Never", "args": [
            "-c", "import json; print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', "
                  "'status': {'token': 'from-the-plugin'}}))"]}},
        None,
    ),  # fmt: skip
    "plain http": ({}, {"server": "http://127.0.0.1:8080"}),
}


@pytest.fixture
def files(tmp_path):
    for name, content in (("cert.pem", PEM), ("key.pem", KEY), ("ca.pem", PEM), ("token.txt", b"tok-from-file\n")):
        (tmp_path / name).write_bytes(content)
    return tmp_path


@pytest.mark.parametrize("case", CASES)
def test_every_field_is_what_the_librarys_loader_reads(files, case, monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    user, cluster = CASES[case]
    path = write(files, user, cluster)
    ours = credentials.from_kubeconfig(str(path))
    same(ours, library(path))
    assert ours.proxy is None and ours.source == f"kubeconfig {path}"


def test_a_token_files_last_newline_is_no_part_of_the_token(files):
    ours = credentials.from_kubeconfig(str(write(files, {"tokenFile": "token.txt"})))
    assert ours.token.authorization() == "Bearer tok-from-file"
    assert library(write(files, {"tokenFile": "token.txt"})).api_key["authorization"] == "Bearer tok-from-file\n"  # the library's, unsent


def test_another_context_is_read_when_named(files):
    path = write(files, {"token": "t"})
    ours = credentials.from_kubeconfig(str(path), context="other")
    same(ours, library(path, context="other"))
    assert ours.verify is False


def test_several_kubeconfig_files_merge_as_the_library_merges_them(files, monkeypatch):
    first = write(files, {"token": "first"}, {"server": "https://10.0.0.1:6443"}, name="first")
    second = files / "second"
    second.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "late",
        "clusters": [{"name": "c", "cluster": {"server": "https://10.9.9.9:6443"}}, {"name": "c3", "cluster": {"server": "https://10.0.0.3:6443"}}],
        "contexts": [{"name": "late", "context": {"cluster": "c3", "user": "u", "namespace": "team-b"}}],
        "users": [{"name": "u", "user": {"token": "second"}}],
    }))  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    ours = credentials.from_kubeconfig()
    same(ours, library(f"{first}{os.pathsep}{second}"))
    assert (ours.host, ours.token.authorization()) == ("https://10.0.0.3:6443", "Bearer first")  # the first file's user wins
    assert credentials.context_namespace() == "team-b"


@pytest.mark.parametrize("quoted", ["false", "true", "False", "no", 0])
def test_a_quoted_insecure_skip_tls_verify_is_refused_never_read_as_true(files, quoted):
    path = write(files, {"token": "t"}, {"server": "https://10.0.0.1:6443", "insecure-skip-tls-verify": quoted})
    if quoted == "false":
        assert library(path).verify_ssl is False  # the library's loader: "not 'false'" -- verification off
    with pytest.raises(CredentialsError, match="insecure-skip-tls-verify is .* not a boolean; write true or false without quotes"):
        credentials.from_kubeconfig(str(path))


def test_proxy_url_is_read_though_the_library_ignores_it(files, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy:3128")
    path = write(files, {"token": "t"}, {"server": "https://127.0.0.1:6443", "proxy-url": "http://user:pa%40ss@proxy.corp:3128"})
    assert library(path).proxy is None
    ours = credentials.from_kubeconfig(str(path))
    assert ours.proxy == "http://user:pa%40ss@proxy.corp:3128"  # for every address of the cluster, loopback too; it wins over the env
    assert ours.proxy_headers == {"Proxy-Authorization": "Basic " + base64.b64encode(b"user:pa@ss").decode()}
    assert "pa%40ss" not in repr(ours)
    with pytest.raises(CredentialsError, match="proxy-url 'socks5://proxy:1080' is not supported"):
        credentials.from_kubeconfig(str(write(files, {"token": "t"}, {"server": "https://10.0.0.1:6443", "proxy-url": "socks5://proxy:1080"})))


def test_proxy_variables_apply_as_client_go_applies_them(files, monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "env-proxy:3128")
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.internal")
    for name in ("https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    proxied = credentials.from_kubeconfig(str(write(files, {"token": "t"}, {"server": "https://api.example.com:6443"})))
    assert proxied.proxy == "http://env-proxy:3128"
    for server in ("https://10.0.0.1:6443", "https://k8s.internal:6443", "https://127.0.0.1:6443", "https://localhost:6443"):
        assert credentials.from_kubeconfig(str(write(files, {"token": "t"}, {"server": server}))).proxy is None, server


def test_the_namespace_is_the_current_contexts(tmp_path):
    assert credentials.context_namespace(str(write(tmp_path, {"token": "t"}, namespace="team-a"))) == "team-a"
    assert credentials.context_namespace(str(write(tmp_path, {"token": "t"}))) == "default"
    (tmp_path / "broken").write_text("{not yaml")
    assert credentials.context_namespace(str(tmp_path / "broken")) == "default"


def test_a_kubeconfig_that_cannot_be_used_is_one_clear_error(tmp_path):
    with pytest.raises(CredentialsError, match=r"no kubeconfig at .*missing: give one"):
        credentials.from_kubeconfig(str(tmp_path / "missing"))
    (tmp_path / "broken").write_text("clusters: [\n  {")
    with pytest.raises(CredentialsError, match=r"broken: cannot be used: not valid YAML \(line \d\)"):
        credentials.from_kubeconfig(str(tmp_path / "broken"))
    with pytest.raises(CredentialsError, match="gone.pem"):
        credentials.from_kubeconfig(str(write(tmp_path, {"client-certificate": "gone.pem", "client-key": "gone.key"})))


def test_reading_again_picks_up_a_rotated_token_file_and_a_new_exec_credential(files):
    path = write(files, {"tokenFile": "token.txt"})
    first = credentials.from_kubeconfig(str(path))
    (files / "token.txt").write_text("rotated")
    assert first.token.authorization() == "Bearer tok-from-file"  # read once by the loader...
    assert first.reload().token.authorization() == "Bearer rotated"  # ...and again after a 401
    counter = files / "runs"
    plugin = textwrap.dedent(f"""
        import json, pathlib
        runs = pathlib.Path({str(counter)!r}); n = int(runs.read_text()) + 1 if runs.exists() else 1; runs.write_text(str(n))
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {{"token": f"run-{{n}}"}}}}))
    """)  # fmt: skip
    exec_path = write(files, {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": ["-c", plugin],
                                       "interactiveMode": "Never"}}, name="exec")  # fmt: skip
    loaded = credentials.from_kubeconfig(str(exec_path))
    assert loaded.token.authorization() == "Bearer run-1"
    assert loaded.reload().token.authorization() == "Bearer run-2"


def test_the_service_account_token_is_reread_as_it_rotates(tmp_path):
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    (tmp_path / "token").write_text("first\n")
    (tmp_path / "ca.crt").write_bytes(PEM)
    ours = credentials.in_cluster(tmp_path, environ)
    assert ours.host == "https://[fd00::1]:443" and ours.ca_file == str(tmp_path / "ca.crt") and ours.proxy is None
    now = [0.0]
    token = TokenFile(tmp_path / "token", clock=lambda: now[0])
    assert token.authorization() == "Bearer first"
    (tmp_path / "token").write_text("second")
    assert token.authorization() == "Bearer first"  # within the period
    now[0] += 61
    assert token.authorization() == "Bearer second"
    (tmp_path / "token").write_text("")  # mid-rotation: the last token is kept
    now[0] += 61
    assert token.authorization() == "Bearer second"
    (tmp_path / "token").write_text("third")
    assert ours.reload().token.authorization() == "Bearer third"  # after a 401: read at once


def test_an_incomplete_service_account_is_said(tmp_path):
    with pytest.raises(CredentialsError, match="token does not exist"):
        credentials.in_cluster(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    with pytest.raises(CredentialsError, match="KUBERNETES_SERVICE_PORT must both be set"):
        credentials.in_cluster(tmp_path, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})


def test_key_data_goes_to_a_private_temporary_file_removed_when_the_process_ends(tmp_path):
    path = write(tmp_path, {"client-certificate-data": base64.b64encode(PEM).decode(), "client-key-data": base64.b64encode(KEY).decode()})
    probe = textwrap.dedent(f"""
        import json, os, stat
        from kfp_trainer.backends.kube.credentials import from_kubeconfig
        c = from_kubeconfig({str(path)!r})
        print(json.dumps({{"key": c.key_file, "mode": stat.S_IMODE(os.stat(c.key_file).st_mode)}}))
    """)  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, check=True)  # fmt: skip
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["mode"] == stat.S_IRUSR | stat.S_IWUSR  # 0600 while the process runs
    assert not Path(seen["key"]).exists()  # the library's exit hook removed it


def test_every_path_given_a_kubeconfig_takes_its_namespace_never_the_pods_or_the_default_kubeconfigs(tmp_path, monkeypatch):
    from kfp_trainer.backends import select_backend
    from kfp_trainer.backends.kube import discovery
    from kfp_trainer.backends.kubernetes import KubernetesBackend

    given = write(tmp_path, {"token": "t"}, namespace="team-given", name="given")
    monkeypatch.setenv("KUBECONFIG", str(write(tmp_path, {"token": "t"}, namespace="team-default", name="default-config")))
    pod_namespace = tmp_path / "sa-namespace"
    pod_namespace.write_text("pod-namespace")
    monkeypatch.setattr(discovery, "SA_NAMESPACE", pod_namespace)  # as inside a launcher pod
    assert KubernetesBackend.from_config().default_namespace() == "pod-namespace"  # nothing given: the pod's
    assert KubernetesBackend.from_config(str(given)).default_namespace() == "team-given"
    assert KubernetesBackend.from_config(kubeconfig=str(given), namespace="asked").default_namespace() == "asked"
    assert select_backend("kubernetes", kubeconfig=str(given)).default_namespace() == "team-given"
    nameless = write(tmp_path, {"token": "t"}, name="nameless")
    assert KubernetesBackend.from_config(str(nameless)).default_namespace() == "default"  # its context names none: not the pod's
