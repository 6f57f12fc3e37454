"""The project's two container images, built on this machine by buildah from deploy/Dockerfile.* (no registry).

    python hack/k8s/images.py build [component|trainer|all] [--build-arg NAME=VALUE]...
    python hack/k8s/images.py import --address /run/containerd/containerd.sock [component|trainer|all]
    python hack/k8s/images.py save component image.tar      # an OCI image-layout tar of it
    python hack/k8s/images.py run component -- python -c 'import kfp_trainer'
    python hack/k8s/images.py prune          # drop what the current images no longer use

``buildah build --layers`` runs the Dockerfiles the release builds, in a storage of its own
under ``~/.cache/kfp-trainer/images`` (overlay, chroot isolation, as root). ``FROM
python:3.11-slim`` is a debootstrap of Debian bookworm tagged under that name there
(:mod:`imagebase`); pip reads through a caching PyPI mirror on 127.0.0.1 (:mod:`pypicache`),
given to the build as the optional ``pip.conf`` build secret the Dockerfiles mount, so it stays
out of the images and out of their layers' cache keys. An image is named
``kfp-trainer.local/<name>:<12 hex digits of its image ID>``, with the Dockerfile and its
digest in its labels; tests put :func:`image_ref` into the pods they run on a real node, after
:func:`import_into` has put the image into that node's containerd (:mod:`ocilayout`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import imagebase  # noqa: E402
import ocilayout  # noqa: E402
import pypicache  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
REGISTRY = "kfp-trainer.local"
# name -> (Dockerfile, repository), the same pair the release workflow builds and pushes
IMAGES = {
    "component": ("deploy/Dockerfile.component", f"{REGISTRY}/kfp-trainer"),
    "trainer": ("deploy/Dockerfile.trainer", f"{REGISTRY}/kfp-trainer-trainer"),
}
DOCKERFILE_LABEL = "dev.kfp-trainer.dockerfile"
DOCKERFILE_DIGEST_LABEL = "dev.kfp-trainer.dockerfile.sha256"
BUILD_ARGS_LABEL = "dev.kfp-trainer.build-args"
# What a build prints: each step ("[2/3] STEP 4/10: RUN ..."), and the image of each one that came from the cache.
_STEP = re.compile(r"^(\[\d+/\d+\] )?STEP \d+/\d+: (?!FROM )")
_CACHED = re.compile(r"^--> Using cache ([0-9a-f]{64})\s*$")
_RUN_STATUS = re.compile(r"^(subprocess exited with status \d+|Error: exit status \d+)$")


def cache_root() -> Path:
    """Where the images' storage, the PyPI mirror's files and the OCI layout live (shared by every checkout)."""
    explicit = os.environ.get("KFP_TRAINER_IMAGE_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("KFP_TRAINER_CACHE") or Path.home() / ".cache" / "kfp-trainer") / "images"


class BuildError(RuntimeError):
    """buildah failed: the command and the end of its output."""


def _command(*args: str) -> list[str]:
    """``buildah`` with the images' storage options (overlay, a storage and run directory of their own)."""
    if shutil.which("buildah") is None:
        raise BuildError("buildah is missing: install it with `make host-packages` (Debian/Ubuntu, as root)")
    root = cache_root()
    runroot = Path("/run/kfp-trainer-buildah") / hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return ["buildah", "--root", str(root / "storage"), "--runroot", str(runroot), "--storage-driver", "overlay", *args]


def buildah(*args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Runs ``buildah <args>`` on the images' storage (as root); output captured."""
    command = _command(*args)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise BuildError(f"buildah {' '.join(args[:6])} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done


@dataclass(frozen=True)
class Image:
    """A built image: its name here, repository, buildah image ID and uncompressed size."""

    name: str
    repository: str
    id: str
    size: int

    @property
    def ref(self) -> str:
        """``<repository>:<first 12 hex digits of the image ID>``, what a pod names."""
        return f"{self.repository}:{self.id[:12]}"

    @property
    def tag(self) -> str:
        """Its tag in the OCI layout directory."""
        return f"{self.name}-{self.id[:12]}"


@dataclass(frozen=True)
class Result:
    """A build: the image, how long it took, how many steps ran and came from the cache, and the images of the latter."""

    image: Image
    seconds: float
    made: int
    reused: int
    cached: frozenset[str]
    downloaded: int = 0  # bytes the PyPI mirror fetched for this build


def names(which: str) -> list[str]:
    """``component``, ``trainer`` or ``all`` as a list of image names, or a clear error."""
    if which == "all":
        return list(IMAGES)
    if which not in IMAGES:
        raise SystemExit(f"unknown image {which!r}: one of {', '.join(IMAGES)} or all")
    return [which]


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build or export at a time per machine: they share the storage
        yield


@contextlib.contextmanager
def _pip_conf(index_url: str) -> Iterator[Path]:
    """A pip.conf naming the mirror, for the build's ``pip.conf`` secret (deleted afterwards)."""
    with tempfile.TemporaryDirectory(prefix="kfp-trainer-pip-") as tmp:
        path = Path(tmp) / "pip.conf"
        path.write_text(f"[global]\nindex-url = {index_url}\n")
        yield path


def dockerfile_digest(dockerfile: str) -> str:
    """sha256 of a Dockerfile of this repository, as recorded in the images' labels."""
    return hashlib.sha256((REPO / dockerfile).read_bytes()).hexdigest()


def build(name: str, build_args: dict[str, str] | None = None, log: Callable[[str], None] = print) -> Result:
    """Builds (or finds in buildah's layer cache) the image ``name`` from its Dockerfile in this repository."""
    dockerfile, repository = IMAGES[names(name)[0]]
    build_args = dict(build_args or {})
    labels = {DOCKERFILE_LABEL: dockerfile, DOCKERFILE_DIGEST_LABEL: dockerfile_digest(dockerfile),
              BUILD_ARGS_LABEL: json.dumps(build_args, sort_keys=True)}
    started = time.monotonic()
    with _locked():
        imagebase.ensure(buildah, log)
        with pypicache.Mirror(cache_root() / "pypi") as mirror, _pip_conf(mirror.index_url) as conf, \
                tempfile.TemporaryDirectory(prefix="kfp-trainer-build-") as tmp:
            iidfile = Path(tmp) / "iid"
            args = ["build", "--layers", "--pull=never", "--isolation", "chroot", "--network", "host", "--http-proxy=false",
                    "--secret", f"id=pip.conf,src={conf}", "--file", str(REPO / dockerfile), "--iidfile", str(iidfile),
                    *[a for key, value in labels.items() for a in ("--label", f"{key}={value}")],
                    *[a for key, value in build_args.items() for a in ("--build-arg", f"{key}={value}")], str(REPO)]
            output = _run_build(args, log)
            image_id = iidfile.read_text().strip().removeprefix("sha256:")
            downloaded = mirror.downloaded
        buildah("tag", image_id, f"{repository}:{image_id[:12]}")
    steps = sum(1 for line in output if _STEP.match(line))
    cached = frozenset(m.group(1) for m in map(_CACHED.match, output) if m)
    image = Image(name, repository, image_id, _size(image_id))
    return Result(image, time.monotonic() - started, steps - len(cached), len(cached), cached, downloaded)


def _run_build(args: list[str], log: Callable[[str], None]) -> list[str]:
    """Runs ``buildah build``, passing its step lines to ``log``; its output lines, or a BuildError with their end."""
    command = _command(*args)
    lines: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if _STEP.match(line):
                log(line.rstrip("\n")[:160])
    if proc.returncode != 0:
        raise BuildError(f"buildah build of {args[args.index('--file') + 1]} failed ({proc.returncode}):\n"
                         + "\n".join(lines[-60:]))
    return lines


def _size(image_id: str) -> int:
    """Bytes of the image's uncompressed layers."""
    manifest = json.loads(json.loads(buildah("inspect", "--type", "image", image_id).stdout)["Manifest"])
    return sum(layer["size"] for layer in manifest["layers"])


def config(img: Image) -> dict:
    """The image's OCI configuration (``User``, ``Env``, ``Labels``, ...)."""
    return json.loads(buildah("inspect", "--type", "image", img.id).stdout)["OCIv1"]["config"]


def image(name: str, log: Callable[[str], None] | None = None) -> Image:
    """The image ``name`` as the release's Dockerfile builds it (from the cache when nothing changed)."""
    return build(name, log=log or (lambda _msg: None)).image


def image_ref(name: str) -> str:
    """``kfp-trainer.local/<repository>:<id12>`` of the image ``name``, built if needed."""
    return image(name).ref


def layout_dir() -> Path:
    """The OCI image layout the images are exported into on their way to a containerd."""
    return cache_root() / "oci"


def import_into(name: str, address: str) -> tuple[Image, bool]:
    """Imports the image ``name`` into containerd's k8s.io namespace at ``address`` (skipped when there)."""
    img = image(name)
    # earlier builds' tags go first: a trainer image is ~9 GB in containerd, two of them may not fit
    ocilayout.remove_older(img.ref, address)
    if ocilayout.present(img.ref, address):
        return img, False
    with _locked():
        if ocilayout.present(img.ref, address):  # another import (the test session's early one) finished meanwhile
            return img, False
        ocilayout.push(buildah, img.id, layout_dir(), img.tag)
        ocilayout.import_image(layout_dir(), img.tag, img.ref, address)
    return img, True


def save(name: str, path: Path) -> Image:
    """Writes an OCI image-layout tar of the image ``name`` to ``path``."""
    img = image(name)
    with _locked():
        ocilayout.push(buildah, img.id, layout_dir(), img.tag)
        with open(path, "wb") as out:
            ocilayout.write_tar(layout_dir(), img.tag, img.ref, out)
    return img


def run_in(img: Image, argv: list[str], user: str | None = None, volumes: tuple[str, ...] = (),
           timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs ``argv`` in a throwaway container of ``img`` as its USER (or ``user``); output (stdout and stderr) captured.

    ``volumes`` are ``host:container[:options]`` bind mounts.
    """
    container = buildah("from", "--pull-never", "--quiet", img.id).stdout.strip()
    try:
        options = [*(["--user", user] if user else []), *[a for v in volumes for a in ("--volume", v)]]
        done = buildah("run", "--isolation", "chroot", *options, container, "--", *argv, check=False, timeout=timeout)
    finally:
        buildah("rm", container, check=False)
    # buildah's own lines about a command's exit status are not the command's output
    stderr = "".join(line for line in done.stderr.splitlines(keepends=True) if not _RUN_STATUS.match(line))
    return subprocess.CompletedProcess(argv, done.returncode, done.stdout + stderr, "")


def prune(log: Callable[[str], None] = print) -> int:
    """Removes the images and exported blobs the current images do not use (older sources, changed recipes).

    Keeps every step of the current builds (the layer cache) and the bases, and exports the current
    images (so the next import compresses nothing); returns how many images went.
    """
    keep: set[str] = set()
    current = []
    for name in IMAGES:
        result = build(name, log=lambda _msg: None)
        if result.made:  # a build names only the images of the steps it found in the cache: once more
            result = build(name, log=lambda _msg: None)
        keep |= result.cached | {result.image.id}
        current.append(result.image)
    with _locked():
        for img in current:  # exported before the older tags go, so the layers they share stay compressed
            ocilayout.push(buildah, img.id, layout_dir(), img.tag)
        keep |= set(imagebase.ensure(buildah, log).values())
        listed = json.loads(buildah("images", "--all", "--no-trunc", "--json").stdout or "[]")
        stale = [entry["id"].removeprefix("sha256:") for entry in listed
                 if not any(entry["id"].removeprefix("sha256:").startswith(k) for k in keep)]
        for image_id in stale:
            buildah("rmi", "--force", image_id, check=False)
        blobs = ocilayout.prune(layout_dir(), [img.tag for img in current])
    log(f"removed {len(stale)} images and {blobs} exported blobs; kept {len(listed) - len(stale)} images")
    return len(stale)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="images.py", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build the images and print their names")
    p_build.add_argument("which", nargs="?", default="all")
    p_build.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE")
    p_import = sub.add_parser("import", help="import the images into a containerd (k8s.io namespace)")
    p_import.add_argument("which", nargs="?", default="all")
    p_import.add_argument("--address", required=True, help="containerd's socket")
    p_save = sub.add_parser("save", help="write an image's OCI image-layout tar")
    p_save.add_argument("which")
    p_save.add_argument("path")
    p_run = sub.add_parser("run", help="run a command in a throwaway container of an image")
    p_run.add_argument("which")
    p_run.add_argument("argv", nargs="+")
    p_run.add_argument("--user")
    sub.add_parser("prune", help="remove the images and exported blobs the current images do not use")
    args = parser.parse_args(argv)
    if args.command == "build":
        build_args = dict(a.split("=", 1) for a in args.build_arg if "=" in a)
        if len(build_args) != len(args.build_arg):
            raise SystemExit("--build-arg takes NAME=VALUE")
        for name in names(args.which):
            result = build(name, build_args)
            print(f"{result.image.ref}  {result.seconds:.1f} s  {result.image.size / 1e6:.0f} MB  "
                  f"{result.made} steps run, {result.reused} from the cache, {result.downloaded / 1e6:.0f} MB downloaded", flush=True)
    elif args.command == "import":
        for name in names(args.which):
            started = time.monotonic()
            img, imported = import_into(name, args.address)
            print(f"{img.ref}  {'imported' if imported else 'already there'}  {time.monotonic() - started:.1f} s", flush=True)
    elif args.command == "prune":
        prune()
    elif args.command == "save":
        img = save(names(args.which)[0], Path(args.path))
        print(f"{img.ref} -> {args.path}")
    else:
        done = run_in(image(names(args.which)[0]), args.argv, user=args.user)
        sys.stdout.write(done.stdout)
        return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
