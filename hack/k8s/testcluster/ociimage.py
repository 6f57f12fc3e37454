#!/usr/bin/env python3
"""OCI image layout archives from a few files, without a container tool or registry.

An image of one layer (the files given), a config (entrypoint, platform) and a manifest,
packed as an OCI image layout tar (``oci-layout``, ``index.json``, ``blobs/sha256/``)
that ``ctr images import`` takes; the index names the image (``io.containerd.image.name``).
Everything is written deterministically (sorted, mtime 0, owner root), so the same
files give the same digests. Standard library only: ``hack/k8s/build.sh`` runs it as a
script.

    ociimage.py OUT.tar REF --file SRC:DEST[:MODE] ... [--entrypoint PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
PLATFORM = {"architecture": "amd64", "os": "linux"}


def _info(name: str, size: int = 0, mode: int = 0o644, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.type, ti.mtime = size, mode, kind, 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    return ti


def layer(files: list[tuple[bytes, str, int]]) -> bytes:
    """A layer tar: ``(content, path in the image, mode)``; parent directories added."""
    buf = io.BytesIO()
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for data, dest, mode in sorted(files, key=lambda f: f[1]):
            parts = dest.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    tar.addfile(_info(d, mode=0o755, kind=tarfile.DIRTYPE))
            tar.addfile(_info("/".join(parts), len(data), mode), io.BytesIO(data))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def image_layout(ref: str, files: list[tuple[bytes, str, int]], entrypoint: list[str]) -> tuple[bytes, str]:
    """The OCI layout tar of an image named ``ref``; returns it and the manifest's digest."""
    blobs: dict[str, bytes] = {}
    layer_tar = layer(files)
    layer_desc = _blob(blobs, layer_tar, LAYER)
    config = {
        **PLATFORM,
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = _blob(blobs, json.dumps(config, sort_keys=True).encode(), CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "config": config_desc, "layers": [layer_desc]}
    manifest_desc = _blob(blobs, json.dumps(manifest, sort_keys=True).encode(), MANIFEST)
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    manifest_desc["platform"] = PLATFORM
    manifest_desc["annotations"] = {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest_desc]}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": json.dumps(index, sort_keys=True).encode(),
        }
        for digest, data in sorted(blobs.items()):
            entries[f"blobs/sha256/{digest.split(':', 1)[1]}"] = data
        for d in ("blobs", "blobs/sha256"):
            tar.addfile(_info(d, mode=0o755, kind=tarfile.DIRTYPE))
        for name, data in entries.items():
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
    return out.getvalue(), manifest_desc["digest"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("ref", help="the image's name, e.g. kfp-trainer.test/pause:3.10")
    ap.add_argument("--file", action="append", default=[], help="SRC:DEST[:MODE] (mode in octal, default 755)")
    ap.add_argument("--entrypoint", action="append", default=None)
    args = ap.parse_args(argv)
    files = []
    for spec in args.file:
        src, dest, *mode = spec.split(":")
        files.append((Path(src).read_bytes(), dest, int(mode[0], 8) if mode else 0o755))
    data, digest = image_layout(args.ref, files, args.entrypoint or [])
    tmp = args.out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
