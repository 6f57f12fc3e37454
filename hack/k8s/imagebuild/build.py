"""Executes a Dockerfile's plan: one cached layer per COPY, RUN and WORKDIR, as Docker does.

A layer's cache key is the digest of the layers below it (their contents' digests, as Docker's
chain ID), the instruction as resolved (RUN: the command, its environment, user and directory;
COPY: the destination, owner and a digest of what it reads), so a change to ``kfp_trainer/*.py``
rebuilds only the layers from the first one that reads it. RUN runs chrooted in a private mount
namespace (see :mod:`sandbox`) with the machine's DNS configuration and CA bundle bound in, and
pip pointed at a caching mirror on 127.0.0.1 (see :mod:`pypicache`), none of which ends up in a
layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import base, copying, layers, plan, pypicache, sandbox

# What RUN sees of this machine while an image is built (read-only; not part of any layer).
HOST_FILES = (("/etc/resolv.conf", "etc/resolv.conf"), ("/etc/ssl/certs/ca-certificates.crt", "etc/ssl/certs/ca-certificates.crt"))


@dataclass
class Built:
    """A built stage: its layers (bottom first) and final settings; with what the whole build made and reused."""

    layers: list[layers.Layer]
    stage: plan.Stage
    made: list[str] = field(default_factory=list)
    reused: int = 0
    all_keys: set[str] = field(default_factory=set)


def key_of(parent: str, *parts) -> str:
    """A layer's cache key: the parent's chain (see :func:`chain_of`) and the resolved instruction."""
    return hashlib.sha256(json.dumps([parent, *parts], sort_keys=True).encode()).hexdigest()


def chain_of(stack: list[layers.Layer]) -> str:
    """What a stack of layers holds, from their contents (Docker's chain ID): the digests bottom up."""
    return hashlib.sha256(" ".join(layer.digest for layer in stack).encode()).hexdigest()


class Builder:
    """Builds the stages of one Dockerfile from the build ``context`` into the layer ``store``."""

    def __init__(self, context: Path, store: layers.Store, log=print, mirror: pypicache.Mirror | None = None):
        self.context = Path(context)
        self.store = store
        self.log = log
        self.mirror = mirror
        self.where = ""

    def build(self, dockerfile: Path, build_args: dict[str, str] | None = None) -> Built:
        """Builds every stage the last one needs; returns the last stage."""
        configs = {name: spec["config"] for name, spec in base.RECIPES.items()}
        stages = plan.parse(dockerfile, build_args, configs)
        self.where = Path(dockerfile).name
        built: dict[int, Built] = {}
        for stage in _needed(stages):
            built[stage.index] = self._stage(stage, built)
        last = built[stages[-1].index]
        last.made = [m for b in built.values() for m in b.made]
        last.reused = sum(b.reused for b in built.values())
        last.all_keys = {layer.key for b in built.values() for layer in b.layers}
        return last

    def _stage(self, stage: plan.Stage, built: dict[int, Built]) -> Built:
        if stage.base_stage is not None:
            out = Built(list(built[stage.base_stage].layers), stage)
        else:
            out = Built([base.base_layer(stage.base_image, self.store, self.log)], stage)
        for step in stage.steps:
            view = copying.MergedView([layer.path for layer in reversed(out.layers)])
            parent = chain_of(out.layers)
            if isinstance(step, plan.Mkdir):
                if view.lookup(step.path) is not None:
                    continue
                key = key_of(parent, "mkdir", step.path)
                make = lambda fs, step=step, view=view: copying.mkdir_layer(fs, view, step.path)  # noqa: E731
            elif isinstance(step, plan.Copy):
                tree = self._tree(step, built)
                sources = copying.expand_sources(tree, step.sources, f"{self.where}: {step.text}")
                owner = copying.parse_chown(step.chown, self.where)
                key = key_of(parent, "copy", sources, step.dest, owner, copying.sources_digest(tree, sources))
                make = lambda fs, t=tree, s=sources, step=step, o=owner, view=view: copying.copy_layer(fs, view, t, s, step.dest, o)  # noqa: E731
            else:
                key = key_of(parent, "run", step.argv, step.env, step.user, step.workdir)
                make = lambda fs, step=step, lowers=list(out.layers): self._run(fs, step, lowers)  # noqa: E731
            found = self.store.lookup(key)
            if found is None:
                started = time.monotonic()
                with self.store.building(key) as fs:
                    make(fs)
                    found = self.store.commit(key, fs, created_by=step.text)
                out.made.append(f"{step.text[:70]} ({time.monotonic() - started:.1f} s, {found.size / 1e6:.1f} MB)")
                self.log(f"  made  {out.made[-1]}")
            else:
                out.reused += 1
            out.layers.append(found)
        return out

    def _tree(self, step: plan.Copy, built: dict[int, Built]):
        if step.from_stage is None:
            return copying.HostTree(self.context)
        return copying.MergedView([layer.path for layer in reversed(built[step.from_stage].layers)])

    def _run(self, fs: Path, step: plan.Run, lowers: list[layers.Layer]) -> None:
        env = dict(step.env)
        if self.mirror is not None:  # build time only: pip reads through the caching mirror
            env.update(PIP_INDEX_URL=self.mirror.index_url, PIP_TRUSTED_HOST=self.mirror.address.split(":")[0])
        binds = [(src, dst, True) for src, dst in HOST_FILES if os.path.exists(src)]
        log_dir = self.store.root / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{fs.parent.name.split('.')[0]}.log"
        log.unlink(missing_ok=True)
        with self.store.scratch(fs.parent.name.split(".")[0] + ".run") as scratch:
            (scratch / "work").mkdir()
            created = sandbox.run(lowers=[layer.path for layer in reversed(lowers)], upper=fs, work=scratch / "work",
                                  root=scratch / "root", argv=list(step.argv), env=env, user=step.user, workdir=step.workdir,
                                  binds=binds, log=log)
        remove_mount_points(fs, created)


def remove_mount_points(fs: Path, created: list[str]) -> None:
    """Takes the mount points the sandbox made out of a RUN's layer, with their parents' empty copies."""
    parents = set()
    for rel in sorted(created, key=lambda r: r.count("/"), reverse=True):
        path = fs / rel
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                path.rmdir()
        elif path.exists() and path.stat().st_size == 0:
            path.unlink()
        parents.update(Path(rel).parents)
    for rel in sorted((p for p in parents if str(p) != "."), key=lambda p: len(p.parts), reverse=True):
        path = fs / rel
        if path.is_dir() and not path.is_symlink() and not layers.is_opaque(path) and not any(path.iterdir()):
            path.rmdir()  # only copied up to hold a mount point


def _needed(stages: list[plan.Stage]) -> list[plan.Stage]:
    """The stages the last one depends on (FROM and COPY --from), in order."""
    need = {stages[-1].index}
    for stage in reversed(stages):
        if stage.index in need:
            if stage.base_stage is not None:
                need.add(stage.base_stage)
            need.update(s.from_stage for s in stage.steps if isinstance(s, plan.Copy) and s.from_stage is not None)
    return [s for s in stages if s.index in need]
