"""The hf:// path for real: huggingface_hub against a small Hub stand-in on 127.0.0.1.

The stand-in answers the four requests a snapshot download makes (repo revision, file tree,
HEAD and GET of each file under ``resolve/<commit>``) and records the Authorization header,
so the test sees the token travel by environment and never in an error message.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

FILES = {"train.jsonl": b'{"prompt": "1+1=", "completion": "2"}\n', "test.jsonl": b'{"prompt": "2+2=", "completion": "4"}\n'}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_example_token_never_printed"


class Hub(BaseHTTPRequestHandler):
    seen_auth: list[str] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def _reply(self, code: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _answer(self, head: bool) -> None:
        Hub.seen_auth.append(self.headers.get("Authorization", ""))
        path = self.path.split("?")[0]
        if not path.startswith(("/api/datasets/org/addition", "/datasets/org/addition")):
            return self._reply(
                404, b'{"error": "Repository not found"}', {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"}, head
            )
        if "/tree/" in path:
            tree = [{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()} for f, d in FILES.items()]
            return self._reply(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
        if "/revision/" in path:
            info = {"id": "org/addition", "sha": COMMIT, "siblings": [{"rfilename": f} for f in FILES]}
            return self._reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
        name = path.rsplit("/", 1)[-1]
        if f"/resolve/{COMMIT}/" in path and name in FILES:
            data = FILES[name]
            headers = {"ETag": f'"{hashlib.sha1(data).hexdigest()}"', "X-Repo-Commit": COMMIT, "Content-Type": "application/octet-stream"}
            return self._reply(200, data, headers, head)
        return self._reply(404, b"not found", {}, head)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head=True)


@pytest.fixture(scope="module")
def hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def fetch_in_subprocess(hub: str, uri: str, dest: Path) -> subprocess.CompletedProcess:
    # huggingface_hub reads HF_ENDPOINT when it is imported: use a fresh interpreter.
    code = "import json, os, sys\nfrom kfp_trainer.storage import fetch\nprint(json.dumps(fetch(sys.argv[1], sys.argv[2], kind='dataset')))"
    env = {**os.environ, "HF_ENDPOINT": hub, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-c", code, uri, str(dest)], capture_output=True, text=True, env=env, timeout=120)


def test_hf_dataset_is_downloaded_with_the_token_from_the_environment(hub, tmp_path):
    result = fetch_in_subprocess(hub, "hf://org/addition", tmp_path / "data")
    assert result.returncode == 0, result.stderr
    for name, data in FILES.items():
        assert (tmp_path / "data" / name).read_bytes() == data
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["source_uri"] == "hf://org/addition" and info["files"] == len(FILES)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == sorted(FILES)
    assert f"Bearer {TOKEN}" in Hub.seen_auth
    assert TOKEN not in result.stdout + result.stderr


def test_missing_hf_repo_fails_clearly_without_the_token(hub, tmp_path):
    result = fetch_in_subprocess(hub, "hf://org/no-such-dataset", tmp_path / "none")
    assert result.returncode != 0
    assert "hf://org/no-such-dataset: download failed" in result.stderr
    assert TOKEN not in result.stdout + result.stderr
