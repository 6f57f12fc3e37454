"""The images built on this machine by buildah (hack/k8s/images.py), for real: the release's
Dockerfiles with the layer cache, the component and trainer images run as their non-root USER,
the builtins the component image serves without torch, and the import into a containerd of its
own. As root; builds come from the cache that ``make test-images`` fills (the real node's pods
run these images in tests/integration/test_realpods_images.py)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)
import ocilayout  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def component():
    return images.build("component", log=lambda _: None)


@pytest.fixture(scope="module")
def trainer():
    return images.build("trainer", log=lambda _: None)


@pytest.mark.parametrize("name", sorted(images.IMAGES))
def test_the_images_record_the_dockerfile_the_release_builds(name, component, trainer):
    image = {"component": component, "trainer": trainer}[name].image
    labels = images.config(image)["Labels"]
    dockerfile = images.IMAGES[name][0]
    assert labels[images.DOCKERFILE_LABEL] == dockerfile
    assert labels[images.DOCKERFILE_DIGEST_LABEL] == hashlib.sha256((REPO / dockerfile).read_bytes()).hexdigest()
    assert images.image_ref(name) == image.ref and image.ref.startswith(images.IMAGES[name][1] + ":")


def test_a_build_with_nothing_changed_comes_whole_from_the_layer_cache(component):
    again = images.build("component", log=lambda _: None)
    assert again.image == component.image
    assert again.made == 0 and again.reused > 10  # every step of the three stages


def test_the_component_image_runs_the_components_as_uid_1000_without_torch(component):
    config = images.config(component.image)
    assert (config["User"], config["WorkingDir"]) == ("1000", "/home/kfp")
    script = ("import os, importlib.util, kfp_trainer.components, kfp_trainer.steps; "
              "print(os.getuid(), os.getcwd(), importlib.util.find_spec('torch'))")
    done = images.run_in(component.image, ["python", "-c", script])
    assert done.returncode == 0, done.stdout
    assert done.stdout.split() == ["1000", "/home/kfp", "None"]
    cli = images.run_in(component.image, ["kfp-trainer", "render", "--runtime", "torch-distributed", "--run-id", "r1", "--task-name", "t"])
    assert cli.returncode == 0 and "kind: TrainJob" in cli.stdout, cli.stdout
    # the pip configuration of the build (the mirror) stayed out of the image
    pip = images.run_in(component.image, ["sh", "-c", "pip config list; test -e /etc/pip.conf || echo no pip.conf"])
    assert "index-url" not in pip.stdout and pip.stdout.strip().endswith("no pip.conf"), pip.stdout


def test_the_component_image_serves_the_samples_builtins_and_names_the_trainer_image_for_the_others(component, tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    script = ("import json, sys; from kfp_trainer.storage import fetch; "
              "print(json.dumps([fetch(u, '/out/' + u.rsplit('/', 1)[1], kind=k) for u, k in "
              "[('builtin://models/tiny-char-lm', 'model'), ('builtin://datasets/instruct-sums', 'dataset')]]))")
    done = images.run_in(component.image, ["python", "-c", script], volumes=(f"{out}:/out",))
    assert done.returncode == 0, done.stdout
    assert {p.name for p in (out / "tiny-char-lm").iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert (out / "instruct-sums" / "data" / "train.parquet").is_file()
    qwen = images.run_in(component.image, ["python", "-m", "kfp_trainer.trainers.builtin", "builtin://models/tiny-qwen2.5", "/tmp/q"])
    assert qwen.returncode == 0, qwen.stdout  # llm_finetune_torchtune's default model: prebuilt
    builtin = ["python", "-m", "kfp_trainer.trainers.builtin"]
    missing = images.run_in(component.image, [*builtin, "builtin://models/tiny-llama3.2-1b", "/tmp/l"])
    assert missing.returncode == 2
    assert "tiny-llama3.2-1b: writing it needs the package" in missing.stdout and "kfp-trainer-trainer" in missing.stdout, missing.stdout
    assert "builtin://models/tiny-char-lm" in missing.stdout and "builtin://models/tiny-qwen2.5" in missing.stdout  # what it does serve


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
        while ocilayout.ctr(str(sock), "version").returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "containerd.log").read_text()[-2000:]
            time.sleep(0.2)
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        subprocess.run(["umount", "-R", str(tmp_path / "root")], capture_output=True)


def test_the_component_image_imports_into_containerd_once_with_every_layer_unpacked(component, containerd):
    image = component.image
    assert images.import_into("component", containerd) == (image, True)
    assert images.import_into("component", containerd) == (image, False)  # that name is there: skipped
    check = ocilayout.ctr(containerd, "images", "check", f"name=={image.ref}").stdout
    (row,) = check.splitlines()[1:]
    manifest = json.loads((images.layout_dir() / "blobs" / ocilayout.manifest_digest(images.layout_dir(), image.tag).replace(":", "/"))
                          .read_bytes())
    layers = len(manifest["layers"])
    # containerd checked every blob against its digest and unpacked the layers into snapshots
    assert f"complete ({layers + 1}/{layers + 1})" in row and row.split()[-1] == "true", check
    assert len(ocilayout.ctr(containerd, "snapshots", "ls").stdout.splitlines()[1:]) == layers
    # a second import (a new name, as after a source change) streams none of the layers containerd has
    have = ocilayout.ctr(containerd, "content", "ls", "-q").stdout.split()
    stream = io.BytesIO()
    ocilayout.write_tar(images.layout_dir(), image.tag, "kfp-trainer.local/again:1", stream, skip=have)
    names = tarfile.open(fileobj=io.BytesIO(stream.getvalue())).getnames()
    assert names == ["oci-layout", "index.json"], names  # the manifest, config and layers are all there
    ocilayout.import_image(images.layout_dir(), image.tag, "kfp-trainer.local/again:1", containerd)
    check = ocilayout.ctr(containerd, "images", "check", "name==kfp-trainer.local/again:1").stdout
    assert "complete" in check.splitlines()[1] and check.split()[-1] == "true", check


def test_an_export_of_layers_exported_before_reuses_them_instead_of_reading_them_out_again(component):
    layout = images.layout_dir()
    ocilayout.push(images.buildah, component.image.id, layout, component.image.tag)
    files = {p.name for p in (layout / "blobs" / "sha256").iterdir() if not p.is_symlink()}
    digest = ocilayout.push(images.buildah, component.image.id, layout, "reuse-check")
    try:
        manifest = json.loads((layout / "blobs" / digest.replace(":", "/")).read_bytes())
        diff_ids = json.loads((layout / "blobs" / manifest["config"]["digest"].replace(":", "/")).read_bytes())["rootfs"]["diff_ids"]
        # buildah found every layer under its uncompressed digest (the alias) and wrote none again
        assert [layer["digest"] for layer in manifest["layers"]] == diff_ids
        assert {p.name for p in (layout / "blobs" / "sha256").iterdir() if not p.is_symlink()} - files <= {digest.split(":")[1]}
        resolved = json.loads(ocilayout.resolved_manifest(layout, "reuse-check"))
        assert resolved["layers"] == json.loads(ocilayout.resolved_manifest(layout, component.image.tag))["layers"]
    finally:
        ocilayout.prune(layout, [t for t in _tags(layout) if t != "reuse-check"])


def _tags(layout: Path) -> list[str]:
    """The layout's tags. A push of a tag that names another image leaves the earlier one in the
    index without its name (prune drops it)."""
    entries = json.loads((layout / "index.json").read_text())["manifests"]
    return [m["annotations"][ocilayout.REF_NAME] for m in entries if ocilayout.REF_NAME in (m.get("annotations") or {})]
