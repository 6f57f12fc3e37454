"""The images built on this machine (hack/k8s/images.py), for real: layers on overlayfs with
whiteouts, Docker-like layer caching, the component and trainer images run chrooted on their
layers as their non-root USER, and the component image imported into a containerd of its own.
As root (mounts, chroot, device nodes); builds come from the cache that ``make test-images`` fills."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)
from imagebuild import build, copying, layers, oci  # noqa: E402

pytestmark = pytest.mark.slow


def tar_names(fs: Path) -> list[str]:
    buf = io.BytesIO()
    layers.write_tar(fs, buf)
    return tarfile.open(fileobj=io.BytesIO(buf.getvalue())).getnames()


def whiteout(path: Path) -> None:
    os.mknod(path, 0o600 | 0o020000, os.makedev(0, 0))  # what overlayfs leaves for a deletion


def test_a_layer_tar_turns_overlay_whiteouts_into_oci_whiteouts_and_is_the_same_every_time(tmp_path):
    fs = tmp_path / "fs"
    (fs / "etc").mkdir(parents=True)
    (fs / "etc" / "new").write_text("x")
    whiteout(fs / "etc" / "gone")
    (fs / "opaque").mkdir()
    os.setxattr(fs / "opaque", layers.OPAQUE_XATTR, b"y")
    (fs / "opaque" / "only").write_text("y")
    os.link(fs / "etc" / "new", fs / "etc" / "hard")
    assert tar_names(fs) == ["etc", "etc/.wh.gone", "etc/hard", "etc/new", "opaque", "opaque/.wh..wh..opq", "opaque/only"]
    members = {m.name: m for m in tarfile.open(fileobj=_tar_bytes(fs))}
    assert members["etc/new"].islnk() and members["etc/new"].linkname == "etc/hard"
    sink = layers.HashingSink()
    layers.write_tar(fs, sink)
    assert hashlib.sha256(_tar_bytes(fs).getvalue()).hexdigest() == sink.hash.hexdigest()


def _tar_bytes(fs: Path) -> io.BytesIO:
    buf = io.BytesIO()
    layers.write_tar(fs, buf)
    buf.seek(0)
    return buf


def test_the_merged_view_reads_layers_as_overlayfs_does(tmp_path):
    low, mid, top = (tmp_path / n for n in ("low", "mid", "top"))
    for d in (low / "a", low / "d", mid / "d", top):
        d.mkdir(parents=True)
    (low / "a" / "f").write_text("low")
    (low / "a" / "g").write_text("low")
    (low / "d" / "hidden").write_text("low")
    os.setxattr(mid / "d", layers.OPAQUE_XATTR, b"y")
    (mid / "d" / "seen").write_text("mid")
    (top / "a").mkdir()
    (top / "a" / "f").write_text("top")
    whiteout(top / "a" / "g")
    view = copying.MergedView([top, mid, low])
    assert view.lookup("a/f").read_text() == "top"
    assert view.lookup("a/g") is None and view.lookup("d/hidden") is None
    assert sorted(view.listdir("a")) == ["f"] and sorted(view.listdir("d")) == ["seen"]


def test_copy_keeps_the_metadata_of_existing_parent_directories(tmp_path):
    lower, fs, ctx = tmp_path / "lower", tmp_path / "fs", tmp_path / "ctx"
    (lower / "home" / "kfp").mkdir(parents=True)
    os.chmod(lower / "home" / "kfp", 0o700)
    os.chown(lower / "home" / "kfp", 1000, 0)
    (ctx / "pkg").mkdir(parents=True)
    (ctx / "pkg" / "m.py").write_text("x = 1\n")
    fs.mkdir()
    tree = copying.HostTree(ctx)
    copying.copy_layer(fs, copying.MergedView([lower]), tree, ["pkg"], "/home/kfp/app/", (0, 0))
    st = (fs / "home" / "kfp").stat()
    assert (st.st_uid, oct(st.st_mode & 0o777)) == (1000, "0o700")
    assert (fs / "home" / "kfp" / "app" / "m.py").read_text() == "x = 1\n"
    with pytest.raises(copying.CopyError, match="COPY nope: not found"):
        copying.expand_sources(tree, ("nope",), "Dockerfile:3")


def test_layers_are_cached_like_docker_and_a_changed_source_rebuilds_only_from_its_copy(tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "data.txt").write_text(f"first {time.time()}\n")  # a key no earlier run made
    (ctx / "Dockerfile").write_text(
        "FROM python:3.11-slim\n"
        "RUN rm /etc/hostname && mkdir -p /opt/app && echo base > /opt/app/base\n"
        "COPY data.txt /opt/app/\n"
        "RUN cat /opt/app/data.txt /opt/app/base > /opt/app/both && id -u > /opt/app/uid\n"
        "USER 1000\n"
        "RUN id -u > /tmp/uid-of-run || true\n"
    )
    store = layers.Store()
    first = build.Builder(ctx, store, log=lambda _: None).build(ctx / "Dockerfile")
    again = build.Builder(ctx, store, log=lambda _: None).build(ctx / "Dockerfile")
    assert [layer.key for layer in again.layers] == [layer.key for layer in first.layers] and again.made == []
    # the deletion of a base file is an OCI whiteout in the first RUN's layer
    assert "etc/.wh.hostname" in tar_names(first.layers[1].path)
    assert (first.layers[3].path / "opt" / "app" / "both").read_text().startswith("first")
    assert not (first.layers[1].path / "etc" / "resolv.conf").exists()  # the build's DNS stays out of layers
    second = f"second {time.time()}\n"
    (ctx / "data.txt").write_text(second)
    changed = build.Builder(ctx, store, log=lambda _: None).build(ctx / "Dockerfile")
    assert changed.layers[1].key == first.layers[1].key  # before the COPY: from the cache
    assert len(changed.made) == 3 and changed.reused == 1
    assert (changed.layers[3].path / "opt" / "app" / "both").read_text() == second + "base\n"


@pytest.fixture(scope="module")
def component():
    return images.build("component", log=lambda _: None)


@pytest.fixture(scope="module")
def trainer():
    return images.build("trainer", log=lambda _: None)


@pytest.mark.parametrize("name", sorted(images.IMAGES))
def test_the_images_record_the_dockerfile_the_release_builds(name, component, trainer):
    image = {"component": component, "trainer": trainer}[name].image
    labels = json.loads(image.config)["config"]["Labels"]
    dockerfile = images.IMAGES[name][0]
    assert labels[images.DOCKERFILE_LABEL] == dockerfile
    assert labels[images.DOCKERFILE_DIGEST_LABEL] == hashlib.sha256((REPO / dockerfile).read_bytes()).hexdigest()
    assert images.image_ref(name) == image.ref and image.ref.startswith(images.IMAGES[name][1] + ":")


def test_the_component_image_runs_the_components_as_uid_1000_without_torch(component):
    config = json.loads(component.image.config)["config"]
    assert (config["User"], config["WorkingDir"]) == ("1000", "/home/kfp")
    script = ("import os, importlib.util, kfp_trainer.components, kfp_trainer.steps; "
              "print(os.getuid(), os.getcwd(), importlib.util.find_spec('torch'))")
    done = images.run_in(component.image, ["python", "-c", script])
    assert done.returncode == 0, done.stdout
    assert done.stdout.split() == ["1000", "/home/kfp", "None"]
    cli = images.run_in(component.image, ["kfp-trainer", "render", "--runtime", "torch-distributed", "--run-id", "r1", "--task-name", "t"])
    assert cli.returncode == 0 and "kind: TrainJob" in cli.stdout, cli.stdout


def test_the_trainer_image_imports_torch_and_the_trainers_as_uid_1000(trainer):
    script = ("import os, torch, transformers, sklearn, kfp_trainer.trainers.sft, kfp_trainer.trainers.digits; "
              "print(os.getuid(), torch.__version__)")
    done = images.run_in(trainer.image, ["python", "-c", script])
    assert done.returncode == 0, done.stdout
    uid, version = done.stdout.split()
    assert uid == "1000" and version.startswith("2.")
    assert images.run_in(trainer.image, ["python", "-c", "import nonexistent_module"]).returncode == 1


@pytest.fixture
def containerd(tmp_path):
    """A containerd of its own (config, root, state, socket under tmp_path), stopped afterwards."""
    sock = tmp_path / "c.sock"
    (tmp_path / "config.toml").write_text(
        f'version = 2\nroot = "{tmp_path}/root"\nstate = "{tmp_path}/state"\n'
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n'
        '[debug]\n  address = ""\n[metrics]\n  address = ""\n'
        # images only: no CRI (the real node's containerd is the one the kubelet talks to)
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
    )
    with open(tmp_path / "containerd.log", "wb") as log:
        proc = subprocess.Popen(["containerd", "--config", str(tmp_path / "config.toml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while oci.ctr(str(sock), "version", capture_output=True).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "containerd.log").read_text()[-2000:]
            time.sleep(0.2)
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        subprocess.run(["umount", "-R", str(tmp_path / "root")], capture_output=True)


def test_the_component_image_imports_into_containerd_once_with_every_layer_unpacked(component, containerd):
    image = component.image
    assert oci.import_image(image, containerd) is True
    assert oci.import_image(image, containerd) is False  # that digest is there: skipped
    listed = oci.ctr(containerd, "images", "ls", capture_output=True, text=True, check=True).stdout
    assert image.ref in listed and image.manifest_digest in listed
    # containerd checked every blob against its digest and unpacked the layers into snapshots
    check = oci.ctr(containerd, "images", "check", f"name=={image.ref}", capture_output=True, text=True, check=True).stdout
    (row,) = check.splitlines()[1:]
    assert f"complete ({len(image.layers) + 1}/{len(image.layers) + 1})" in row and row.split()[-1] == "true", check
    snapshots = oci.ctr(containerd, "snapshots", "ls", capture_output=True, text=True, check=True).stdout.splitlines()[1:]
    assert len(snapshots) == len(image.layers)
    # an image whose layers containerd has (a new build after a source change, here: one layer less)
    # is imported without streaming them again
    partial = oci.make_image("kfp-trainer.local/partial", list(image.layers[:-1]), env={}, user="0", workdir="/",
                             cmd=None, entrypoint=None, labels={})
    started = time.monotonic()
    assert oci.import_image(partial, containerd) is True
    assert time.monotonic() - started < 5  # 335 MB of layers would take longer to stream
    check = oci.ctr(containerd, "images", "check", f"name=={partial.ref}", capture_output=True, text=True, check=True).stdout
    assert "complete" in check.splitlines()[1] and check.split()[-1] == "true", check
    # (the real node's tests run these images in pods: tests/integration/test_realpods_images.py)
