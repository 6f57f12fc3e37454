"""The s3:// path for real: boto3 against an S3-compatible server on 127.0.0.1 (moto's server)."""

from __future__ import annotations

import io

import pytest

from kfp_trainer.backends.local import LocalBackend
from kfp_trainer.launcher import Launcher
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from kfp_trainer.storage import StorageError, fetch

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

KEY_ID, SECRET = "AKIAEXAMPLEKEYID0000", "example-secret-key-do-not-print"


@pytest.fixture(scope="module")
def s3():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    client.create_bucket(Bucket="datasets")
    client.put_object(Bucket="datasets", Key="addition/train.jsonl", Body=b'{"prompt": "1+1=", "completion": "2"}\n')
    client.put_object(Bucket="datasets", Key="addition/test.jsonl", Body=b'{"prompt": "2+2=", "completion": "4"}\n')
    client.put_object(Bucket="datasets", Key="addition/raw/notes.md", Body=b"skip me")
    env = {"ENDPOINT": endpoint, "ACCESS_KEY_ID": KEY_ID, "SECRET_ACCESS_KEY": SECRET, "REGION": "us-east-1"}
    yield env
    server.stop()


def test_fetch_downloads_every_object_under_the_prefix(s3, tmp_path):
    info = fetch("s3://datasets/addition", tmp_path / "data", kind="dataset", env=s3, ignore_patterns=["*.md"])
    assert sorted(p.name for p in (tmp_path / "data").rglob("*") if p.is_file()) == ["test.jsonl", "train.jsonl"]
    assert info["files"] == 2 and info["scheme"] == "s3"


def test_missing_prefix_and_bad_credentials_fail_clearly_without_secrets(s3, tmp_path):
    with pytest.raises(StorageError, match="no objects under that prefix"):
        fetch("s3://datasets/nothing-here", tmp_path / "a", env=s3)
    with pytest.raises(StorageError) as info:
        fetch("s3://no-such-bucket/x", tmp_path / "b", env=s3)
    assert SECRET not in str(info.value)


def test_local_trainjob_initializer_reads_s3(s3, tmp_path, monkeypatch):
    for name, value in s3.items():  # as a Secret referenced by the initializer would provide them
        monkeypatch.setenv(name, value)
    script = tmp_path / "count.py"
    script.write_text("import sys\nprint('records', sum(1 for _ in open(sys.argv[1])), flush=True)\n")
    out = io.StringIO()
    backend = LocalBackend(tmp_path / "jobs")
    inputs = TrainJobInputs(run_id="r", task_name="t", dataset_uri="s3://datasets/addition",
                            command=["python", str(script), "/workspace/dataset/train.jsonl"])  # fmt: skip
    outcome = Launcher(backend, out=out).run(prepare(backend, inputs))
    assert outcome.succeeded and "records 1" in out.getvalue()
    assert SECRET not in out.getvalue()


def test_a_prefix_is_a_folder_and_never_matches_a_longer_name(s3, tmp_path):
    client = boto3.client(
        "s3", endpoint_url=s3["ENDPOINT"], region_name="us-east-1", aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET
    )
    client.put_object(Bucket="datasets", Key="addition-private/secret.jsonl", Body=b"not yours\n")
    fetch("s3://datasets/addition", tmp_path / "data", kind="dataset", env=s3, ignore_patterns=["*.md"])
    assert sorted(p.name for p in (tmp_path / "data").rglob("*") if p.is_file()) == ["test.jsonl", "train.jsonl"]
    one = fetch("s3://datasets/addition/train.jsonl", tmp_path / "one", kind="dataset", env=s3)
    assert one["files"] == 1 and (tmp_path / "one" / "train.jsonl").is_file()


def test_object_keys_with_dot_dot_cannot_write_outside_the_destination(s3, tmp_path):
    client = boto3.client(
        "s3", endpoint_url=s3["ENDPOINT"], region_name="us-east-1", aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET
    )
    client.create_bucket(Bucket="hostile")
    client.put_object(Bucket="hostile", Key="data/ok.txt", Body=b"fine\n")
    client.put_object(Bucket="hostile", Key="data/../../escaped.txt", Body=b"gotcha\n")
    dest = tmp_path / "deep" / "dest"
    with pytest.raises(StorageError, match="outside"):
        fetch("s3://hostile/data", dest, env=s3)
    assert not any(p.name == "escaped.txt" for p in tmp_path.rglob("*"))
