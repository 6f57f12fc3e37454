"""Runs one command in a root file system stacked from layer directories, in a mount namespace.

``run()`` starts ``unshare --mount --pid --fork`` with this file as the namespace's first process:
it mounts the layers (overlayfs: the layers as lower directories, an upper directory that
receives the changes when one is given), ``/proc``, ``/sys`` (read-only), ``/dev`` and the given
bind mounts, then runs the command chrooted as the given user. Every mount lives in the private
namespace, so all of them are gone when it ends, however it ends. Mount points it had to create
are listed in a report so that the caller can take them out of the new layer.

Run as a script it is the namespace side (``python sandbox.py <spec.json>``); it imports only the
standard library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OVERLAY_OPTIONS = "redirect_dir=off,metacopy=off,index=off,xino=off"


class SandboxError(RuntimeError):
    """The command could not be run, or it failed (its output's tail is in the message)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


def run(*, lowers: list[Path], root: Path, argv: list[str], env: dict[str, str], user: str = "0", workdir: str = "/",
        upper: Path | None = None, work: Path | None = None, binds: list[tuple[str, str, bool]] = (),
        log: Path | None = None, timeout: float | None = None) -> list[str]:
    """Runs ``argv`` on the stacked ``lowers`` (top first); returns the mount points it created (relative)."""
    report = root.parent / (root.name + ".created.json")
    spec = {"lowers": [str(p) for p in lowers], "upper": str(upper) if upper else None, "work": str(work) if work else None,
            "root": str(root), "binds": [list(b) for b in binds], "argv": list(argv), "env": env, "user": user,
            "workdir": workdir, "report": str(report)}
    spec_file = root.parent / (root.name + ".spec.json")
    spec_file.write_text(json.dumps(spec))
    root.mkdir(exist_ok=True)
    command = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
               sys.executable, "-I", str(Path(__file__).resolve()), str(spec_file)]
    try:
        with open(log, "ab") if log else open(os.devnull, "wb") as out:
            done = subprocess.run(command, stdout=out if log else subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        if done.returncode != 0:
            tail = log.read_bytes()[-4000:] if log else (done.stdout or b"")[-4000:]
            raise SandboxError(f"{argv!r} exited with {done.returncode}:\n{tail.decode(errors='replace')}", done.returncode)
        return json.loads(report.read_text()) if report.exists() else []
    finally:
        spec_file.unlink(missing_ok=True)
        report.unlink(missing_ok=True)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _user_ids(root: Path, user: str, env: dict) -> tuple[int, int, str]:
    name, _, group = user.partition(":")
    passwd = [line.split(":") for line in _lines(root / "etc/passwd")]
    entry = next((e for e in passwd if len(e) > 6 and (e[0] == name or e[2] == name)), None)
    if name.isdigit():
        uid = int(name)
    elif entry:
        uid = int(entry[2])
    else:
        raise SystemExit(f"USER {user}: no user {name!r} in the image's /etc/passwd")
    gid = int(entry[3]) if entry else 0
    if group:
        groups = [line.split(":") for line in _lines(root / "etc/group")]
        found = next((g for g in groups if len(g) > 2 and (g[0] == group or g[2] == group)), None)
        if group.isdigit():
            gid = int(group)
        elif found:
            gid = int(found[2])
        else:
            raise SystemExit(f"USER {user}: no group {group!r} in the image's /etc/group")
    home = entry[5] if entry else "/"
    return uid, gid, env.get("HOME") or home


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _mount_point(root: Path, rel: str, is_dir: bool, created: list[str]) -> Path:
    parts = [p for p in rel.strip("/").split("/") if p]
    path = root
    for i, part in enumerate(parts):
        path = path / part
        if path.exists() or path.is_symlink():
            continue
        if i < len(parts) - 1 or is_dir:
            path.mkdir(mode=0o755)
        else:
            path.touch(mode=0o644)
        created.append("/".join(parts[: i + 1]))
    return path


def namespace_main(spec_file: str) -> int:
    """The namespace's first process: mounts, runs the command chrooted, returns its exit status."""
    spec = json.loads(Path(spec_file).read_text())
    root = Path(spec["root"])
    lowers = spec["lowers"]
    if spec["upper"]:
        _mount("-t", "overlay", "overlay", "-o",
               f"lowerdir={':'.join(lowers)},upperdir={spec['upper']},workdir={spec['work']},{OVERLAY_OPTIONS}", str(root))
    elif len(lowers) == 1:
        _mount("--bind", "-o", "ro", lowers[0], str(root))
    else:
        _mount("-t", "overlay", "overlay", "-o", f"lowerdir={':'.join(lowers)},{OVERLAY_OPTIONS}", str(root))
    created: list[str] = []
    writable = bool(spec["upper"])
    if writable:
        for name in ("proc", "sys", "dev"):
            _mount_point(root, name, True, created)
    _mount("-t", "proc", "proc", str(root / "proc"))
    _mount("-t", "sysfs", "-o", "ro", "sysfs", str(root / "sys"))
    _mount("--rbind", "/dev", str(root / "dev"))
    for source, target, read_only in spec["binds"]:
        point = _mount_point(root, target, Path(source).is_dir(), created) if writable else root / target.strip("/")
        _mount("--bind", source, str(point))
        if read_only:
            _mount("-o", "remount,bind,ro", str(point))
    Path(spec["report"]).write_text(json.dumps(created))
    env = dict(spec["env"])
    uid, gid, home = _user_ids(root, spec["user"], env)
    env["HOME"] = home
    pid = os.fork()
    if pid == 0:  # the command: chrooted, unprivileged when asked
        try:
            os.chroot(root)
            os.chdir(spec["workdir"])
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.execvpe(spec["argv"][0], spec["argv"], env)
        except OSError as e:
            print(f"cannot run {spec['argv']!r} as {uid}:{gid} in {spec['workdir']}: {e}", file=sys.stderr, flush=True)
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(namespace_main(sys.argv[1]))
