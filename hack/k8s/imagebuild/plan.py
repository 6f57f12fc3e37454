"""A Dockerfile read into build steps with everything resolved (pure: no file system, no process).

Docker's own parser (the ``dockerfile`` package) splits the file into instructions; this module
gives them Docker's meaning: stages (``FROM ... AS name``, a base image or an earlier stage),
global and per-stage ``ARG`` with build-argument overrides, ``ENV``, ``WORKDIR``, ``USER``,
``LABEL``, ``CMD``/``ENTRYPOINT``, variable substitution (``$X``, ``${X}``, ``${X:-d}``,
``${X:+a}``) with quote removal, and what each ``COPY`` and ``RUN`` sees. An instruction or flag
it does not implement is refused with its file, line and the supported set.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile

SUPPORTED = ("FROM", "ARG", "ENV", "WORKDIR", "COPY", "RUN", "USER", "LABEL", "CMD", "ENTRYPOINT")
COPY_FLAGS = ("--from", "--chown")


class PlanError(ValueError):
    """The Dockerfile uses something this build does not implement, or is wrong."""


@dataclass(frozen=True)
class Copy:
    """COPY: ``sources`` (relative to the context, or absolute in ``from_stage``) to ``dest``."""

    sources: tuple[str, ...]
    dest: str
    from_stage: int | None
    chown: str | None
    text: str


@dataclass(frozen=True)
class Run:
    """RUN: ``argv`` as ``user`` in ``workdir`` with ``env`` (ENV, then the stage's ARGs under them)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    user: str
    workdir: str
    text: str


@dataclass(frozen=True)
class Mkdir:
    """WORKDIR of a directory that may not exist yet."""

    path: str
    text: str


@dataclass
class Stage:
    """One FROM ... section: its base (an image name or an earlier stage's index) and what it does."""

    index: int
    name: str | None
    base_image: str | None
    base_stage: int | None
    steps: list = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None


def parse(path: Path, build_args: dict[str, str] | None = None, base_configs: dict | None = None) -> list[Stage]:
    """The stages of the Dockerfile at ``path``; ``base_configs`` maps base images to their Env/Cmd."""
    return plan(dockerfile.parse_file(str(path)), build_args or {}, base_configs or {}, Path(path).name)


def plan(commands, build_args: dict[str, str], base_configs: dict, where: str = "Dockerfile") -> list[Stage]:
    """The stages of parsed Dockerfile ``commands`` (see :func:`parse`)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    args: dict[str, str] = {}
    for c in commands:
        kind = c.cmd.upper()
        at = f"{where}:{c.start_line}"
        if kind not in SUPPORTED:
            raise PlanError(f"{at}: {kind} is not implemented by this build (supported: {', '.join(SUPPORTED)})")
        if c.heredocs:
            raise PlanError(f"{at}: heredocs are not implemented by this build")
        if kind != "COPY" and c.flags:
            raise PlanError(f"{at}: {kind} {' '.join(c.flags)}: flags are not implemented for {kind}")
        if kind == "ARG" and not stages:
            name, value = _arg(c, at, global_args, {}, build_args)
            if value is not None:
                global_args[name] = value
            continue
        if kind == "FROM":
            stage = _from(c, at, global_args, stages, base_configs)
            stages.append(stage)
            args = {}
            continue
        if not stages:
            raise PlanError(f"{at}: {kind} before the first FROM")
        _apply(stages[-1], stages, kind, c, at, args, global_args, build_args)
    if not stages:
        raise PlanError(f"{where}: no FROM")
    return stages


def _apply(stage: Stage, stages: list[Stage], kind: str, c, at: str, args: dict, global_args: dict, build_args: dict) -> None:
    scope = {**args, **stage.env}
    if kind == "ARG":
        name, value = _arg(c, at, scope, global_args, build_args)
        if value is not None:
            args[name] = value
    elif kind == "ENV":
        stage.env.update(_pairs(c, at, scope))
    elif kind == "LABEL":
        stage.labels.update(_pairs(c, at, scope))
    elif kind == "WORKDIR":
        path = expand(c.value[0], scope, at)
        stage.workdir = posixpath.normpath(posixpath.join(stage.workdir, path))
        stage.steps.append(Mkdir(stage.workdir, c.original))
    elif kind == "USER":
        stage.user = expand(c.value[0], scope, at)
    elif kind in ("CMD", "ENTRYPOINT"):
        argv = list(c.value) if c.json else ["/bin/sh", "-c", c.value[0]]
        if kind == "CMD":
            stage.cmd = argv
        else:
            stage.entrypoint, stage.cmd = argv, None
    elif kind == "RUN":
        argv = tuple(c.value) if c.json else ("/bin/sh", "-c", c.value[0])
        env = {**args, **stage.env}
        stage.steps.append(Run(argv, tuple(sorted(env.items())), stage.user or "0", stage.workdir, c.original))
    elif kind == "COPY":
        stage.steps.append(_copy(c, at, scope, stage, stages))


def _from(c, at: str, global_args: dict, stages: list[Stage], base_configs: dict) -> Stage:
    words = list(c.value)
    if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
        raise PlanError(f"{at}: FROM <image> [AS <name>] expected, got {c.original!r}")
    ref = expand(words[0], global_args, at)
    name = words[2].lower() if len(words) == 3 else None
    if name and any(s.name == name for s in stages):
        raise PlanError(f"{at}: the stage name {name!r} is used twice")
    index = len(stages)
    earlier = next((s for s in stages if s.name == ref.lower()), None)
    if earlier is not None:
        return Stage(index, name, None, earlier.index, env=dict(earlier.env), user=earlier.user, workdir=earlier.workdir,
                     labels=dict(earlier.labels), cmd=earlier.cmd, entrypoint=earlier.entrypoint)
    config = base_configs.get(ref, {})
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    return Stage(index, name, ref, None, env=env, cmd=config.get("Cmd"), entrypoint=config.get("Entrypoint"))


def _arg(c, at: str, scope: dict, global_args: dict, build_args: dict) -> tuple[str, str | None]:
    if len(c.value) != 1:
        raise PlanError(f"{at}: one ARG per instruction is implemented, got {c.original!r}")
    name, has_default, default = c.value[0].partition("=")
    if not name.isidentifier():
        raise PlanError(f"{at}: ARG name {name!r} is not a valid name")
    if name in build_args:
        return name, build_args[name]
    if has_default:
        return name, expand(default, scope, at)
    return name, global_args.get(name)


def _pairs(c, at: str, scope: dict) -> dict[str, str]:
    values = list(c.value)
    if len(values) % 2:
        raise PlanError(f"{at}: {c.cmd.upper()} needs key=value pairs, got {c.original!r}")
    return {expand(k, scope, at): expand(v, scope, at) for k, v in zip(values[::2], values[1::2], strict=True)}


def _copy(c, at: str, scope: dict, stage: Stage, stages: list[Stage]) -> Copy:
    flags = {}
    for flag in c.flags:
        key, _, value = flag.partition("=")
        if key not in COPY_FLAGS:
            raise PlanError(f"{at}: COPY {flag}: not implemented by this build (supported: {', '.join(COPY_FLAGS)})")
        flags[key] = expand(value, scope, at)
    if c.json or len(c.value) < 2:
        raise PlanError(f"{at}: COPY <source>... <destination> expected, got {c.original!r}")
    *sources, dest = [expand(v, scope, at) for v in c.value]
    dest_abs = posixpath.join(stage.workdir, dest)
    if dest.endswith("/") or dest in (".", "./"):
        dest_abs = dest_abs.rstrip("/") + "/"
    from_stage = None
    if "--from" in flags:
        ref = flags["--from"].lower()
        found = [s for s in stages[:-1] if s.name == ref or str(s.index) == ref]
        if not found:
            raise PlanError(f"{at}: COPY --from={ref}: no earlier stage of that name (images are not implemented)")
        from_stage = found[0].index
    elif any(s.startswith("/") or ".." in s.split("/") for s in sources):
        raise PlanError(f"{at}: COPY source outside the build context: {sources}")
    return Copy(tuple(sources), dest_abs, from_stage, flags.get("--chown"), c.original)


def expand(word: str, scope: dict[str, str], at: str = "") -> str:
    """Docker's word processing: variables expanded from ``scope``, quotes and escapes removed."""
    out, i, quote = [], 0, None
    while i < len(word):
        ch = word[i]
        if ch == "\\" and quote != "'" and i + 1 < len(word):
            out.append(word[i + 1])
            i += 2
        elif ch in "'\"" and quote in (None, ch):
            quote = None if quote else ch
            i += 1
        elif ch == "$" and quote != "'" and i + 1 < len(word):
            value, i = _variable(word, i + 1, scope, at)
            out.append(value)
        else:
            out.append(ch)
            i += 1
    if quote:
        raise PlanError(f"{at}: unterminated {quote} in {word!r}")
    return "".join(out)


def _variable(word: str, i: int, scope: dict, at: str) -> tuple[str, int]:
    if word[i] != "{":
        j = i
        while j < len(word) and (word[j].isalnum() or word[j] == "_"):
            j += 1
        if j == i:
            return "$", i
        return scope.get(word[i:j], ""), j
    end = word.find("}", i)
    if end < 0:
        raise PlanError(f"{at}: missing }} in {word!r}")
    body = word[i + 1:end]
    name, op, arg = body, "", ""
    for candidate in (":-", ":+"):
        if candidate in body:
            name, _, arg = body.partition(candidate)
            op = candidate
            break
    if not name.replace("_", "a").isalnum():
        raise PlanError(f"{at}: ${{{body}}}: only ${{NAME}}, ${{NAME:-default}} and ${{NAME:+value}} are implemented")
    value = scope.get(name, "")
    if op == ":-" and not value:
        value = expand(arg, scope, at)
    elif op == ":+":
        value = expand(arg, scope, at) if value else ""
    return value, end + 1
