"""An image from buildah's storage into a containerd, through an image layout directory on disk.

``buildah push <id> oci:<dir>:<tag>`` writes the image's zstd-compressed layers (smaller and a
third faster to write than gzip; containerd 1.5+ unpacks them) into one layout directory shared
by every image built here. Reading a layer out of the storage is what a push spends its time on
(~45 s for the trainer image's 6.7 GB), and buildah 1.28 reuses a layer only when the directory
has a blob named by the digest it asks for, its uncompressed one. So after each push every
compressed layer is also named by its uncompressed digest (a symbolic link, recorded with the
compressed blob's descriptor in ``kfp-trainer-layers.json``): the next push of an image with that
layer finds it and writes only the layers that changed. Such a manifest names a layer by its
uncompressed digest; :func:`resolved_manifest` puts the compressed blob back in its place, so
the directory is this module's export cache, read through it.

:func:`import_image` streams an image-layout tar of one image into ``ctr images import -``, named
for containerd, without the blobs containerd's content store has: after a source change only the
changed layers travel. :func:`prune` drops the tags and blobs of images that are no longer built.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
ALIASES = "kfp-trainer-layers.json"  # uncompressed digest -> descriptor of the compressed blob

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
    _alias_layers(layout, digest)
    return digest


def _index(layout: Path) -> dict:
    path = layout / "index.json"
    return json.loads(path.read_text()) if path.exists() else {"schemaVersion": 2, "manifests": []}


def _aliases(layout: Path) -> dict[str, dict]:
    path = layout / ALIASES
    return json.loads(path.read_text()) if path.exists() else {}


def _write_json(path: Path, value: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def manifest_digest(layout: Path, tag: str) -> str | None:
    """The digest of the manifest tagged ``tag`` in the layout, or None."""
    for entry in _index(layout)["manifests"]:
        if (entry.get("annotations") or {}).get(REF_NAME) == tag:
            return entry["digest"]
    return None


def _blob(layout: Path, digest: str) -> Path:
    algorithm, hexdigest = digest.split(":", 1)
    return layout / "blobs" / algorithm / hexdigest


def _alias_layers(layout: Path, digest: str) -> None:
    """Names each compressed layer of the manifest ``digest`` also by its uncompressed digest."""
    manifest = json.loads(_blob(layout, digest).read_bytes())
    diff_ids = json.loads(_blob(layout, manifest["config"]["digest"]).read_bytes())["rootfs"]["diff_ids"]
    aliases = _aliases(layout)
    for descriptor, diff_id in zip(manifest["layers"], diff_ids, strict=True):
        if descriptor["digest"] == diff_id:
            continue  # reused under its alias already (or never compressed)
        aliases[diff_id] = {key: descriptor[key] for key in ("mediaType", "digest", "size")}
        link = _blob(layout, diff_id)
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(_blob(layout, descriptor["digest"]).name)
    _write_json(layout / ALIASES, aliases)


def resolved_manifest(layout: Path, tag: str) -> bytes:
    """The manifest tagged ``tag``, each layer named by the blob that holds it (its compressed one)."""
    digest = manifest_digest(layout, tag)
    if digest is None:
        raise ImageImportError(f"no image tagged {tag} in {layout}")
    manifest = json.loads(_blob(layout, digest).read_bytes())
    aliases = _aliases(layout)
    manifest["layers"] = [aliases.get(layer["digest"], layer) for layer in manifest["layers"]]
    return json.dumps(manifest, separators=(",", ":")).encode()


def write_tar(layout: Path, tag: str, ref: str, out: BinaryIO, skip: Iterable[str] = ()) -> None:
    """Writes an image-layout tar of the image tagged ``tag``, named ``ref``, to the stream ``out``.

    Blobs whose digest is in ``skip`` are left out (the containerd reading it has them).
    """
    manifest_bytes = resolved_manifest(layout, tag)
    manifest = json.loads(manifest_bytes)
    digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json"), "digest": digest,
        "size": len(manifest_bytes), "annotations": {REF_NAME: ref, CONTAINERD_NAME: ref},
    }]}
    skipped = set(skip)
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(tar, "index.json", json.dumps(index).encode())
        if digest not in skipped:
            _add_bytes(tar, "blobs/" + digest.replace(":", "/"), manifest_bytes)
        for descriptor in [manifest["config"], *manifest["layers"]]:
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
    """Streams the image tagged ``tag`` into containerd at ``address`` as ``ref``, without the blobs it has."""
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
    older = older_names(_image_targets(address), ref)
    if older:
        ctr(address, "images", "rm", "--sync", *older, timeout=300)
    return older


def older_names(targets: dict[str, str], ref: str) -> list[str]:
    """The names to remove for ``ref``: its repository's other tags, and the ID names left pointing
    at no tagged image.

    The CRI plugin also names each image by its ID (``sha256:<config digest>``); that name holds
    the content as firmly as a tag, so it goes with the last tag that points where it does.

    Example:
        >>> older_names({"r/t:new": "sha256:b", "sha256:idb": "sha256:b", "r/t:old": "sha256:a",
        ...              "sha256:ida": "sha256:a", "other:1": "sha256:c", "sha256:idc": "sha256:c"}, "r/t:new")
        ['r/t:old', 'sha256:ida']
    """
    repository = ref.rsplit(":", 1)[0]
    older = [r for r in targets if not r.startswith("sha256:") and r.rsplit(":", 1)[0] == repository and r != ref]
    kept = {digest for r, digest in targets.items() if not r.startswith("sha256:") and r not in older}
    return older + [r for r, digest in targets.items() if r.startswith("sha256:") and digest not in kept]


def _image_targets(address: str) -> dict[str, str]:
    """containerd's image names at ``address`` and the digest each points at."""
    listed = ctr(address, "images", "ls", timeout=60).stdout.splitlines()
    targets = {}
    for line in listed[1:]:  # REF TYPE DIGEST SIZE PLATFORMS LABELS
        fields = line.split()
        if len(fields) >= 3 and fields[2].startswith("sha256:"):
            targets[fields[0]] = fields[2]
    return targets


def prune(layout: Path, keep_tags: Iterable[str]) -> int:
    """Drops the layout's other tags and every blob and alias no kept image uses; returns how many blobs went."""
    if not (layout / "index.json").exists():
        return 0
    keep = set(keep_tags)
    index = _index(layout)
    index["manifests"] = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) in keep]
    aliases = _aliases(layout)
    used = set()
    for entry in index["manifests"]:
        manifest = json.loads(_blob(layout, entry["digest"]).read_bytes())
        used |= {entry["digest"], manifest["config"]["digest"]}
        for layer in manifest["layers"]:
            used |= {layer["digest"], aliases[layer["digest"]]["digest"]} if layer["digest"] in aliases else {layer["digest"]}
    # the aliases of the layers kept: their uncompressed digests are what the next push asks for
    used |= {alias for alias, descriptor in aliases.items() if descriptor["digest"] in used}
    _write_json(layout / "index.json", index)
    _write_json(layout / ALIASES, {alias: d for alias, d in aliases.items() if alias in used})
    removed = 0
    for path in sorted((layout / "blobs").glob("*/*")):
        if f"{path.parent.name}:{path.name}" not in used:
            path.unlink()
            removed += 1
    return removed
