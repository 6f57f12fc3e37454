"""An OCI image from built layers: config, manifest, an image-layout tar, and its import into containerd.

Layers are stored uncompressed (``application/vnd.oci.image.layer.v1.tar``), so a layer's blob
digest is its diff ID. The layout tar is streamed: each layer's tar is written from its directory
straight into the layout (and checked against the digest recorded when the layer was made), so
no copy of a layer tar is kept on disk. ``ctr images import`` reads it from its standard input;
layers the containerd holds already (``ctr content ls``) are left out of the stream.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from dataclasses import dataclass

from .layers import HashingSink, Layer, write_tar

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


class ImageImportError(RuntimeError):
    """containerd refused the image, or ctr failed."""


@dataclass(frozen=True)
class Image:
    """An image ready to be written: its name, layers, config and manifest (canonical JSON bytes)."""

    repository: str
    layers: tuple[Layer, ...]
    config: bytes
    manifest: bytes

    @property
    def config_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.config).hexdigest()

    @property
    def manifest_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    @property
    def ref(self) -> str:
        """``<repository>:<first 12 hex digits of the config digest>``."""
        return f"{self.repository}:{self.config_digest.split(':')[1][:12]}"

    @property
    def size(self) -> int:
        """Bytes of the uncompressed layers."""
        return sum(layer.size for layer in self.layers)


def _json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def make_image(repository: str, image_layers: list[Layer], *, env: dict[str, str], user: str, workdir: str,
               cmd: list[str] | None, entrypoint: list[str] | None, labels: dict[str, str]) -> Image:
    """The image of ``image_layers`` (bottom first) with the given run settings (linux/amd64)."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {key: value for key, value in {
            "Env": [f"{k}={v}" for k, v in env.items()],
            "User": user or None,
            "WorkingDir": workdir or None,
            "Cmd": cmd,
            "Entrypoint": entrypoint,
            "Labels": labels or None,
        }.items() if value is not None},
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in image_layers]},
        "history": [{"created_by": layer.created_by} for layer in image_layers],
    }
    config_bytes = _json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": "sha256:" + hashlib.sha256(config_bytes).hexdigest(),
                   "size": len(config_bytes)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer.digest, "size": layer.size} for layer in image_layers],
    }
    return Image(repository, tuple(image_layers), config_bytes, _json(manifest))


def index_json(image: Image) -> bytes:
    """The layout's index.json: one manifest, named for containerd and by the OCI annotation."""
    return _json({"schemaVersion": 2, "manifests": [{
        "mediaType": MANIFEST_TYPE, "digest": image.manifest_digest, "size": len(image.manifest),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {REF_NAME: image.ref, CONTAINERD_NAME: image.ref},
    }]})


def write_layout(image: Image, out, skip: frozenset[str] = frozenset()) -> None:
    """Writes the OCI image-layout tar of ``image`` to the (write-only) file ``out``.

    Layers whose digest is in ``skip`` are left out: the containerd importing it has them already.
    """
    def member(name: str, size: int) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o644, 0
        out.write(info.tobuf(tarfile.USTAR_FORMAT))

    def pad(size: int) -> None:
        if size % tarfile.BLOCKSIZE:
            out.write(b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE))

    small = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index_json(image),
        f"blobs/sha256/{image.config_digest.split(':')[1]}": image.config,
        f"blobs/sha256/{image.manifest_digest.split(':')[1]}": image.manifest,
    }
    for name, body in small.items():
        member(name, len(body))
        out.write(body)
        pad(len(body))
    for layer in image.layers:
        if layer.digest in skip:
            continue
        member(f"blobs/sha256/{layer.digest.split(':')[1]}", layer.size)
        sink = HashingSink(out)
        write_tar(layer.path, sink)
        if sink.size != layer.size or "sha256:" + sink.hash.hexdigest() != layer.digest:
            raise ImageImportError(f"layer {layer.key} changed on disk since it was made ({layer.created_by[:60]}); "
                               f"remove {layer.path.parent} and build again")
        pad(layer.size)
    out.write(b"\0" * tarfile.BLOCKSIZE * 2)
    out.flush()


def ctr(address: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """``ctr --address <address> -n k8s.io <args>`` (the namespace the kubelet's images live in)."""
    return subprocess.run(["ctr", "--address", address, "-n", "k8s.io", *args], **kwargs)


def present(image: Image, address: str) -> bool:
    """Whether containerd at ``address`` has ``image.ref`` naming this very manifest."""
    done = ctr(address, "images", "ls", f"name=={image.ref}", capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ImageImportError(f"ctr images ls at {address} failed: {done.stderr.strip()[-500:]}")
    return any(image.ref in line and image.manifest_digest in line for line in done.stdout.splitlines()[1:])


def import_image(image: Image, address: str) -> bool:
    """Imports ``image`` into containerd at ``address`` unless it is there; True when it imported."""
    if present(image, address):
        remove_older(image, address)
        return False
    listed = ctr(address, "content", "ls", "-q", capture_output=True, text=True, timeout=60)
    have = frozenset(listed.stdout.split()) if listed.returncode == 0 else frozenset()
    proc = subprocess.Popen(["ctr", "--address", address, "-n", "k8s.io", "images", "import", "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        write_layout(image, proc.stdin, skip=have)  # a heavy layer already there is not streamed again
        proc.stdin.close()
    except BrokenPipeError:
        pass  # ctr stopped reading: its output says why
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    output = proc.stdout.read().decode(errors="replace")
    if proc.wait() != 0 or not present(image, address):
        raise ImageImportError(f"ctr images import of {image.ref} into {address} failed: {output.strip()[-2000:]}")
    remove_older(image, address)
    return True


def remove_older(image: Image, address: str) -> list[str]:
    """Removes the other tags of ``image``'s repository from containerd at ``address`` (earlier builds).

    A trainer image is ~6 GB in containerd's content store and as much again unpacked; without
    this, each change of its dependencies would leave another copy on the disk. Layers the
    current image shares stay (containerd collects only what no image references).
    """
    repo = image.ref.rsplit(":", 1)[0]
    listed = ctr(address, "images", "ls", "-q", capture_output=True, text=True, timeout=60)
    older = [ref for ref in listed.stdout.split() if ref.rsplit(":", 1)[0] == repo and ref != image.ref]
    if older:
        ctr(address, "images", "rm", "--sync", *older, capture_output=True, text=True, timeout=300)
    return older
