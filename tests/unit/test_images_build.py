"""The pure parts of the test images' build (hack/k8s/images.py, imagebase.py, ocilayout.py):
which Dockerfiles, the base recipe's digest, what a build's output says, and the OCI layout
that carries an image to a containerd (written by hand here; buildah writes it for real in
tests/integration/test_images.py)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import imagebase  # noqa: E402
import images  # noqa: E402
import ocilayout  # noqa: E402

BASE = "docker.io/library/python:3.11-slim"


def test_the_test_images_are_built_from_the_dockerfiles_the_release_builds():
    release = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    matrix = {m["image"]: m["dockerfile"] for m in release["jobs"]["images"]["strategy"]["matrix"]["include"]}
    built = {repository.rsplit("/", 1)[1]: path for path, repository in images.IMAGES.values()}
    assert built == matrix


def test_the_base_serves_the_name_the_dockerfiles_use_and_its_digest_follows_the_recipe(monkeypatch):
    bases = {line.split()[1] for path in (REPO / "deploy").glob("Dockerfile.*") for line in path.read_text().splitlines()
             if line.startswith("FROM ") and not line.split()[1].startswith("$")}
    assert {f"docker.io/library/{b}" for b in bases} == set(imagebase.RECIPES)
    before = imagebase.recipe_digest(BASE)
    monkeypatch.setitem(imagebase.RECIPES[BASE], "packages", [*imagebase.PACKAGES, "curl"])
    assert imagebase.recipe_digest(BASE) != before


OUTPUT = """\
[1/2] STEP 1/3: FROM python:3.11-slim AS build
[1/2] STEP 2/3: WORKDIR /src
--> Using cache 0cad23e379e7d4d2dbf8be15ff2459402e75b8d9c042eec1e52b29bd9e24db1f
[1/2] STEP 3/3: COPY kfp_trainer ./kfp_trainer
[2/2] STEP 1/2: FROM python:3.11-slim
[2/2] STEP 2/2: RUN pip install x
[2/2] COMMIT
""".splitlines()


def test_a_build_output_counts_its_steps_and_names_the_cached_ones():
    steps = [line for line in OUTPUT if images._STEP.match(line)]
    cached = [m.group(1) for m in map(images._CACHED.match, OUTPUT) if m]
    assert len(steps) == 3 and cached == ["0cad23e379e7d4d2dbf8be15ff2459402e75b8d9c042eec1e52b29bd9e24db1f"]


def _blob(layout: Path, body: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    path = layout / "blobs" / "sha256" / digest.split(":")[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return {"digest": digest, "size": len(body)}


def _image(layout: Path, tag: str, layers: list[bytes], diff_ids: list[str] | None = None, reused: dict | None = None) -> tuple[dict, str]:
    """An image in the layout as buildah push writes one: layer and config blobs, a manifest, an index entry.

    ``reused``: {layer body: uncompressed digest} for layers buildah found under their alias (not written again).
    """
    config = _blob(layout, json.dumps({"tag": tag, "rootfs": {"diff_ids": diff_ids or []}}).encode())
    descriptors = []
    for body in layers:
        if reused and body in reused:
            descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": reused[body], "size": len(body)})
        else:
            descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+zstd", **_blob(layout, body)})
    manifest = {"schemaVersion": 2, "config": config, "layers": descriptors}
    entry = {**_blob(layout, json.dumps(manifest).encode()), "annotations": {ocilayout.REF_NAME: tag}}
    index = json.loads((layout / "index.json").read_text()) if (layout / "index.json").exists() else {"manifests": []}
    index["manifests"].append(entry)
    (layout / "index.json").write_text(json.dumps(index))
    return manifest, entry["digest"]


def _members(layout: Path, tag: str, skip=()) -> tuple[list[str], dict, tarfile.TarFile]:
    out = io.BytesIO()
    ocilayout.write_tar(layout, tag, "kfp-trainer.local/kfp-trainer:1", out, skip=skip)
    tar = tarfile.open(fileobj=io.BytesIO(out.getvalue()))
    (entry,) = json.load(tar.extractfile("index.json"))["manifests"]
    manifest = json.load(tar.extractfile("blobs/" + entry["digest"].replace(":", "/")))
    return tar.getnames(), {"entry": entry, "manifest": manifest}, tar


def test_the_tar_for_ctr_names_the_image_and_leaves_out_what_containerd_has(tmp_path):
    manifest, _ = _image(tmp_path, "component-1", [b"base", b"deps", b"src"])
    names, found, _ = _members(tmp_path, "component-1", skip=[manifest["layers"][0]["digest"]])
    assert names[:2] == ["oci-layout", "index.json"]
    sent = (found["entry"]["digest"], manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"][1:]))
    assert sorted(names[2:]) == sorted("blobs/" + d.replace(":", "/") for d in sent)
    assert found["manifest"]["layers"] == manifest["layers"]
    assert found["entry"]["annotations"] == {ocilayout.REF_NAME: "kfp-trainer.local/kfp-trainer:1",
                                             ocilayout.CONTAINERD_NAME: "kfp-trainer.local/kfp-trainer:1"}
    with pytest.raises(ocilayout.ImageImportError, match="no image tagged trainer-1"):
        ocilayout.write_tar(tmp_path, "trainer-1", "x", io.BytesIO())


def test_a_layer_is_found_again_under_its_uncompressed_digest_and_sent_as_its_compressed_blob(tmp_path):
    diff_ids = ["sha256:" + hashlib.sha256(b"uncompressed " + b).hexdigest() for b in (b"base", b"deps", b"src v1")]
    first, digest = _image(tmp_path, "trainer-1", [b"base", b"deps", b"src v1"], diff_ids)
    ocilayout._alias_layers(tmp_path, digest)
    # what buildah 1.28 asks for before it reads a layer out of its storage: a blob named by that digest
    for diff_id, layer in zip(diff_ids, first["layers"], strict=True):
        alias = tmp_path / "blobs" / "sha256" / diff_id.split(":")[1]
        assert alias.is_symlink() and alias.read_bytes() == (tmp_path / "blobs" / "sha256" / layer["digest"].split(":")[1]).read_bytes()
    # a source change: the next push reuses the two lower layers under their aliases and writes the new one
    new_ids = [*diff_ids[:2], "sha256:" + hashlib.sha256(b"uncompressed src v2").hexdigest()]
    second, _ = _image(tmp_path, "trainer-2", [b"base", b"deps", b"src v2"], new_ids, reused={b"base": diff_ids[0], b"deps": diff_ids[1]})
    names, found, tar = _members(tmp_path, "trainer-2", skip=[first["layers"][0]["digest"]])
    assert found["manifest"]["layers"] == [*first["layers"][:2], second["layers"][2]]  # the blobs, not the aliases
    assert "blobs/" + first["layers"][1]["digest"].replace(":", "/") in names
    assert "blobs/" + first["layers"][0]["digest"].replace(":", "/") not in names  # containerd has it
    assert tar.extractfile("blobs/" + first["layers"][1]["digest"].replace(":", "/")).read() == b"deps"
    # the first image goes: its top layer and its alias with it; what the second uses stays
    assert ocilayout.prune(tmp_path, ["trainer-2"]) == 4  # src v1, its alias, the first config and manifest
    _, again, _ = _members(tmp_path, "trainer-2")
    assert again["manifest"] == found["manifest"]
    assert set(json.loads((tmp_path / ocilayout.ALIASES).read_text())) == set(diff_ids[:2])


def test_prune_keeps_the_blobs_of_the_kept_tags_only(tmp_path):
    old, _ = _image(tmp_path, "component-old", [b"base", b"deps", b"src v1"])
    new, digest = _image(tmp_path, "component-new", [b"base", b"deps", b"src v2"])
    assert ocilayout.prune(tmp_path, ["component-new"]) == 3  # the old source layer, config and manifest
    assert ocilayout.manifest_digest(tmp_path, "component-old") is None
    assert ocilayout.manifest_digest(tmp_path, "component-new") == digest
    kept = {p.name for p in (tmp_path / "blobs" / "sha256").iterdir()}
    assert kept == {d.split(":")[1] for d in (digest, new["config"]["digest"], *(layer["digest"] for layer in new["layers"]))}
    assert old["layers"][0]["digest"].split(":")[1] in kept  # shared with the kept image


def test_an_import_removes_the_older_tags_and_the_id_names_they_leave_unused() -> None:
    """containerd's CRI plugin names each image by its ID too; an old build's ID name kept its
    gigabytes on the real node after its tag went."""
    targets = {
        "kfp-trainer.local/kfp-trainer-trainer:new": "sha256:m2",
        "sha256:id2": "sha256:m2",
        "kfp-trainer.local/kfp-trainer-trainer:old": "sha256:m1",
        "sha256:id1": "sha256:m1",
        "sha256:id0": "sha256:m0",  # an earlier build whose tag went before this rule
        "kfp-trainer.local/kfp-trainer:c": "sha256:c1",
        "sha256:idc": "sha256:c1",
    }
    older = ocilayout.older_names(targets, "kfp-trainer.local/kfp-trainer-trainer:new")
    assert sorted(older) == ["kfp-trainer.local/kfp-trainer-trainer:old", "sha256:id0", "sha256:id1"]
    # an ID name shared with another repository's tag stays
    assert ocilayout.older_names({**targets, "mirror/trainer:x": "sha256:m1"}, "kfp-trainer.local/kfp-trainer-trainer:new") == [
        "kfp-trainer.local/kfp-trainer-trainer:old",
        "sha256:id0",
    ]
