"""An image from buildah's storage into a containerd, through an OCI image layout on disk.

``buildah push <id> oci:<dir>:<tag>`` writes the image's zstd-compressed layers (a third faster
to write than gzip, and smaller; containerd 1.5+ unpacks them) into one OCI image layout
directory shared by every image built here; a layer the directory holds already is not
compressed again (buildah's blob cache knows its compressed digest), so after a source change
only the small top layers are written. :func:`import_image` then streams an image-layout
tar of one image into ``ctr images import -``, naming it for containerd, and leaves out the
layers that containerd's content store has: after a source change only the changed layers
travel. :func:`prune` drops the tags and blobs of images that are no longer built.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"

Buildah = Callable[..., subprocess.CompletedProcess]


class ImageImportError(RuntimeError):
    """containerd refused the image, or ctr failed."""


def push(buildah: Buildah, image_id: str, layout: Path, tag: str) -> str:
    """Writes image ``image_id`` into the layout directory under ``tag``; returns its manifest digest."""
    layout.mkdir(parents=True, exist_ok=True)
    buildah("push", "--quiet", "--format", "oci", "--compression-format", "zstd", image_id, f"oci:{layout}:{tag}")
    digest = manifest_digest(layout, tag)
    if digest is None:
        raise ImageImportError(f"buildah push wrote no manifest tagged {tag} into {layout}")
    return digest


def _index(layout: Path) -> dict:
    path = layout / "index.json"
    return json.loads(path.read_text()) if path.exists() else {"schemaVersion": 2, "manifests": []}


def manifest_digest(layout: Path, tag: str) -> str | None:
    """The digest of the manifest tagged ``tag`` in the layout, or None."""
    for entry in _index(layout)["manifests"]:
        if (entry.get("annotations") or {}).get(REF_NAME) == tag:
            return entry["digest"]
    return None


def _blob(layout: Path, digest: str) -> Path:
    algorithm, hexdigest = digest.split(":", 1)
    return layout / "blobs" / algorithm / hexdigest


def write_tar(layout: Path, tag: str, ref: str, out: BinaryIO, skip: Iterable[str] = ()) -> None:
    """Writes an image-layout tar of the image tagged ``tag``, named ``ref``, to the stream ``out``.

    Layers whose digest is in ``skip`` are left out (the containerd reading it has them).
    """
    digest = manifest_digest(layout, tag)
    if digest is None:
        raise ImageImportError(f"no image tagged {tag} in {layout}")
    manifest_bytes = _blob(layout, digest).read_bytes()
    manifest = json.loads(manifest_bytes)
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json"), "digest": digest,
        "size": len(manifest_bytes), "annotations": {REF_NAME: ref, CONTAINERD_NAME: ref},
    }]}
    skipped = set(skip)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(tar, "index.json", json.dumps(index).encode())
        for descriptor in [{"digest": digest}, manifest["config"], *manifest["layers"]]:
            if descriptor["digest"] in skipped:
                continue
            path = _blob(layout, descriptor["digest"])
            info = tarfile.TarInfo("blobs/" + descriptor["digest"].replace(":", "/"))
            info.size, info.mode = path.stat().st_size, 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)


def _add_bytes(tar: tarfile.TarFile, name: str, body: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(body), 0o644
    tar.addfile(info, io.BytesIO(body))


def ctr(address: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``ctr --address <address> -n k8s.io <args>`` (the namespace the kubelet's images live in), output captured."""
    return subprocess.run(["ctr", "--address", address, "-n", "k8s.io", *args], capture_output=True, text=True, timeout=timeout)


def present(ref: str, address: str) -> bool:
    """Whether the containerd at ``address`` has an image named ``ref``."""
    done = ctr(address, "images", "ls", "-q", f"name=={ref}", timeout=60)
    if done.returncode != 0:
        raise ImageImportError(f"ctr images ls at {address} failed: {done.stderr.strip()[-500:]}")
    return ref in done.stdout.split()


def import_image(layout: Path, tag: str, ref: str, address: str) -> None:
    """Streams the image tagged ``tag`` into containerd at ``address`` as ``ref``, without the layers it has."""
    listed = ctr(address, "content", "ls", "-q", timeout=60)
    have = frozenset(listed.stdout.split()) if listed.returncode == 0 else frozenset()
    proc = subprocess.Popen(["ctr", "--address", address, "-n", "k8s.io", "images", "import", "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        write_tar(layout, tag, ref, proc.stdin, skip=have)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # ctr stopped reading: its output says why
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    output = proc.stdout.read().decode(errors="replace")
    if proc.wait() != 0 or not present(ref, address):
        raise ImageImportError(f"ctr images import of {ref} into {address} failed: {output.strip()[-2000:]}")


def remove_older(ref: str, address: str) -> list[str]:
    """Removes the other tags of ``ref``'s repository from containerd at ``address`` (earlier builds).

    A trainer image is ~3 GB in containerd's content store and twice that unpacked; without
    this, each change of its dependencies would leave another copy on the disk. Layers the
    current image shares stay (containerd collects only what no image references).
    """
    repository = ref.rsplit(":", 1)[0]
    listed = ctr(address, "images", "ls", "-q", timeout=60)
    older = [r for r in listed.stdout.split() if r.rsplit(":", 1)[0] == repository and r != ref]
    if older:
        ctr(address, "images", "rm", "--sync", *older, timeout=300)
    return older


def prune(layout: Path, keep_tags: Iterable[str]) -> int:
    """Drops the layout's other tags and every blob no kept manifest uses; returns how many blobs went."""
    if not (layout / "index.json").exists():
        return 0
    keep = set(keep_tags)
    index = _index(layout)
    index["manifests"] = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) in keep]
    used = set()
    for entry in index["manifests"]:
        manifest = json.loads(_blob(layout, entry["digest"]).read_bytes())
        used |= {entry["digest"], manifest["config"]["digest"], *(layer["digest"] for layer in manifest["layers"])}
    tmp = layout / "index.json.tmp"
    tmp.write_text(json.dumps(index))
    tmp.replace(layout / "index.json")
    removed = 0
    for path in sorted((layout / "blobs").glob("*/*")):
        if f"{path.parent.name}:{path.name}" not in used:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed += 1
    return removed
