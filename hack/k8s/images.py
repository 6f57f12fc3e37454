"""The project's two container images, built on this machine from deploy/Dockerfile.* (no registry, no engine).

    python hack/k8s/images.py build [component|trainer|all] [--build-arg NAME=VALUE]...
    python hack/k8s/images.py import --address /run/containerd/containerd.sock [component|trainer|all]
    python hack/k8s/images.py save component image.tar      # the OCI image-layout tar
    python hack/k8s/images.py run component -- python -c 'import kfp_trainer'
    python hack/k8s/images.py prune          # drop the layers the current images do not use

The Dockerfiles the release builds are executed instruction by instruction (see
hack/k8s/imagebuild): ``FROM python:3.11-slim`` is a Debian bookworm root file system made
with debootstrap, every COPY/RUN/WORKDIR is a cached layer, and the result is an OCI image named
``kfp-trainer.local/<name>:<12 hex digits of its config digest>`` with the Dockerfile's digest
in its labels. Tests put :func:`image_ref` into the pods they run on a real node.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from imagebuild import build as builder  # noqa: E402
from imagebuild import layers, oci, pypicache, sandbox  # noqa: E402

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


@dataclass(frozen=True)
class Result:
    """A build: the image, how long it took, and which layers it made (the others came from the cache)."""

    image: oci.Image
    seconds: float
    made: tuple[str, ...]
    reused: int
    build_keys: frozenset[str] = frozenset()  # the layers of the stages the image copies from


def names(which: str) -> list[str]:
    """``component``, ``trainer`` or ``all`` as a list of image names, or a clear error."""
    if which == "all":
        return list(IMAGES)
    if which not in IMAGES:
        raise SystemExit(f"unknown image {which!r}: one of {', '.join(IMAGES)} or all")
    return [which]


@contextlib.contextmanager
def _locked(store: layers.Store):
    store.root.mkdir(parents=True, exist_ok=True)
    with open(store.root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time per machine: they share layers
        store.clean_stale()
        yield


def build(name: str, build_args: dict[str, str] | None = None, store: layers.Store | None = None, log=print) -> Result:
    """Builds (or finds in the layer cache) the image ``name`` from its Dockerfile in this repository."""
    dockerfile, repository = IMAGES[names(name)[0]]
    store = store or layers.Store()
    build_args = dict(build_args or {})
    started = time.monotonic()
    with _locked(store), pypicache.Mirror(store.root / "pypi") as mirror:
        built = builder.Builder(REPO, store, log=log, mirror=mirror).build(REPO / dockerfile, build_args)
    stage = built.stage
    labels = {**stage.labels, DOCKERFILE_LABEL: dockerfile, DOCKERFILE_DIGEST_LABEL: dockerfile_digest(dockerfile),
              BUILD_ARGS_LABEL: json.dumps(build_args, sort_keys=True)}
    image = oci.make_image(repository, built.layers, env=stage.env, user=stage.user, workdir=stage.workdir,
                           cmd=stage.cmd, entrypoint=stage.entrypoint, labels=labels)
    return Result(image, time.monotonic() - started, tuple(built.made), built.reused, frozenset(built.all_keys))


def dockerfile_digest(dockerfile: str) -> str:
    """sha256 of a Dockerfile of this repository, as recorded in the images' labels."""
    return hashlib.sha256((REPO / dockerfile).read_bytes()).hexdigest()


def image(name: str, log=None) -> oci.Image:
    """The image ``name`` as the release's Dockerfile builds it (from the cache when nothing changed)."""
    return build(name, log=log or (lambda _msg: None)).image


def image_ref(name: str) -> str:
    """``kfp-trainer.local/<repository>:<digest12>`` of the image ``name``, built if needed."""
    return image(name).ref


def import_into(name: str, address: str) -> tuple[oci.Image, bool]:
    """Imports the image ``name`` into containerd's k8s.io namespace at ``address`` (skipped when there)."""
    img = image(name)
    return img, oci.import_image(img, address)


def run_in(img: oci.Image, argv: list[str], user: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs ``argv`` in a throwaway container of ``img`` (chrooted on its layers) as its USER; output captured."""
    config = json.loads(img.config)["config"]
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    store = layers.Store()
    with store.scratch("run") as scratch:
        (scratch / "upper").mkdir()
        (scratch / "work").mkdir()
        log = scratch / "output"
        try:
            sandbox.run(lowers=[layer.path for layer in reversed(img.layers)], upper=scratch / "upper", work=scratch / "work",
                        root=scratch / "root", argv=argv, env=env, user=user or config.get("User") or "0",
                        workdir=config.get("WorkingDir") or "/", log=log, timeout=timeout)
            code = 0
        except sandbox.SandboxError as e:
            code = e.returncode
        output = log.read_text(errors="replace") if log.exists() else ""
    return subprocess.CompletedProcess(argv, code, output, "")


def prune(log=print) -> int:
    """Removes the cached layers that neither current image uses (older sources, changed recipes); returns how many."""
    store = layers.Store()
    keep = set()
    for name in IMAGES:
        built = build(name, store=store, log=lambda _msg: None)
        keep.update(layer.key for layer in built.image.layers)
        keep.update(built.build_keys)
    removed = 0
    with _locked(store):
        for path in sorted(store.layers.iterdir()) if store.layers.exists() else []:
            if path.name not in keep:
                layers.remove_tree(path)
                removed += 1
    log(f"removed {removed} layers, kept {len(keep)}")
    return removed


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="images.py", description=__doc__.split("\n\n")[0])
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
    sub.add_parser("prune", help="remove the cached layers the current images do not use")
    args = parser.parse_args(argv)
    if args.command == "build":
        build_args = dict(a.split("=", 1) for a in args.build_arg if "=" in a)
        if len(build_args) != len(args.build_arg):
            raise SystemExit("--build-arg takes NAME=VALUE")
        for name in names(args.which):
            result = build(name, build_args)
            print(f"{result.image.ref}  {result.seconds:.1f} s  {result.image.size / 1e6:.0f} MB  "
                  f"{len(result.made)} layers made, {result.reused} from the cache", flush=True)
    elif args.command == "import":
        for name in names(args.which):
            started = time.monotonic()
            img, imported = import_into(name, args.address)
            print(f"{img.ref}  {'imported' if imported else 'already there'}  {time.monotonic() - started:.1f} s", flush=True)
    elif args.command == "prune":
        prune()
    elif args.command == "save":
        img = image(names(args.which)[0])
        with open(args.path, "wb") as out:
            oci.write_layout(img, out)
        print(f"{img.ref} -> {args.path}")
    else:
        done = run_in(image(names(args.which)[0]), args.argv, user=args.user)
        sys.stdout.write(done.stdout)
        return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
