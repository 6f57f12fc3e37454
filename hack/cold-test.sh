#!/usr/bin/env bash
# make test-cold: the whole CI run (.ci/run) on a fresh clone of HEAD, as a new machine runs it.
#
# Every cache that this project or its tools fill is pointed at an empty directory under one
# root: HOME (so ~/.cache/kfp-trainer: the Go-built binaries, the images, actionlint), the Go
# module cache and build cache, pip's cache and the XDG cache. Nothing this machine built or
# downloaded before can stand in for a missing step. The repository's ../shared is copied beside
# the clone, as CI lays it out. The Debian packages (`make host-packages`, `make browser`) are
# the machine's: apt installs them only where missing.
#
#   hack/cold-test.sh                 # clone, run, print the summary; remove the root afterwards
#   COLD_ROOT=/tmp/cold hack/cold-test.sh --keep   # keep the root (its caches and the log)
#
# Each line of the run's output is written to <root>/run.log with the seconds since the start
# in front, so the phases (downloads, Go builds, images, tests) can be read off it; the end
# prints the wall time, the phases and pytest's summary line. Exits with .ci/run's status.
set -euo pipefail

keep=0
[[ "${1:-}" == --keep ]] && keep=1
repo="$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)"
[[ -d "$repo/../shared" ]] || { echo "no ../shared beside $repo (CI lays a copy of it there)" >&2; exit 2; }
root="${COLD_ROOT:-$(mktemp -d /tmp/kfp-trainer-cold.XXXXXX)}"
if [[ -e "$root/main" ]]; then
  echo "$root/main exists: give COLD_ROOT an empty or new directory" >&2
  exit 2
fi
mkdir -p "$root"/{home,go/mod,go/build,pip-cache,xdg-cache}
cleanup() { [[ $keep == 1 ]] || rm -rf "$root"; }
trap cleanup EXIT

git clone -q "$repo" "$root/main"
cp -r "$repo/../shared" "$root/shared"
echo "cold run of $(git -C "$root/main" rev-parse --short HEAD) in $root" >&2

log="$root/run.log"
start=$(date +%s)
set +e
(
  cd "$root/main"
  exec env -u KFP_TRAINER_CACHE -u VIRTUAL_ENV HOME="$root/home" GOPATH="$root/go" GOMODCACHE="$root/go/mod" \
    GOCACHE="$root/go/build" PIP_CACHE_DIR="$root/pip-cache" XDG_CACHE_HOME="$root/xdg-cache" PYTHONUNBUFFERED=1 \
    CI=true bash .ci/run
) 2>&1 | while IFS= read -r line; do printf '[%5d s] %s\n' "$(( $(date +%s) - start ))" "$line"; done >"$log"
rc=${PIPESTATUS[0]}
set -e
wall=$(( $(date +%s) - start ))

echo "== .ci/run exit $rc, wall $((wall / 60)) min $((wall % 60)) s (log: $log$([[ $keep == 1 ]] || echo ', removed at exit: --keep keeps it'))"
echo "== phases (the first line of each):"
grep -E '\] (python3 -m venv|bash hack/k8s/build.sh|building [a-z_0-9]+$|built [a-z_0-9]+ in|built in|.*images.py build|=+ test session starts|control plane binaries present)' "$log" | head -40 || true
echo "== pytest:"
grep -E '\] =+ .*(passed|failed|error).* in ' "$log" | tail -1 || echo "(no pytest summary line)"
tail -n 5 "$log"
exit "$rc"
