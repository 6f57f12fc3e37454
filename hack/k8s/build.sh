#!/usr/bin/env bash
# Build the test control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok, kwokctl) from Go modules into a cache directory keyed by
# the versions.  Skips everything when all binaries are already there.
#
#   hack/k8s/build.sh            # build if missing, print the bin dir on the last line
#   hack/k8s/build.sh --print    # only print the bin dir (exit 1 if incomplete)
#   hack/k8s/build.sh --force    # rebuild
#
# Environment:
#   KFP_TRAINER_CACHE   cache root (default: $HOME/.cache/kfp-trainer)
#   KFP_TRAINER_NICE    niceness for the compiler (default: 10)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Keep in sync with hack/k8s/{kube,etcd,kwok}/go.mod and hack/k8s/cluster.py.
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0

CACHE_ROOT="${KFP_TRAINER_CACHE:-$HOME/.cache/kfp-trainer}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION/bin"
BINARIES=(etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl)

all_present() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "$BIN_DIR/$b" ]] || return 1
  done
}

mode="${1:-build}"
case "$mode" in
  --print)
    if all_present; then echo "$BIN_DIR"; exit 0; fi
    echo "$BIN_DIR"; exit 1 ;;
  --force) rm -rf "$BIN_DIR" ;;
  build|"") ;;
  *) echo "usage: $0 [--print|--force]" >&2; exit 2 ;;
esac

if all_present; then
  echo "control plane binaries present" >&2
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "go not found in PATH: cannot build the control plane" >&2; echo "$BIN_DIR"; exit 1; }

NICE="${KFP_TRAINER_NICE:-10}"
mkdir -p "$BIN_DIR"
# Build into a temporary directory and move the finished binaries in, so an
# interrupted build never leaves a half-written binary behind.
TMP_OUT="$(mktemp -d "$BIN_DIR/../.build.XXXXXX")"
trap 'rm -rf "$TMP_OUT"' EXIT

export GOFLAGS="-trimpath -mod=readonly"
export CGO_ENABLED=0

gobuild() { # <module dir> <ldflags> <package>...
  local dir="$1" ldflags="$2"; shift 2
  echo "building in $dir: $*" >&2
  (cd "$HERE/$dir" && nice -n "$NICE" go build -ldflags "$ldflags" -o "$TMP_OUT/" "$@")
}

start=$(date +%s)

need() { local b; for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 0; done; return 1; }

if need etcd etcdctl; then
  gobuild etcd "-s -w" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3
  # go names the server binary after its module path ("server").
  mv "$TMP_OUT/server" "$TMP_OUT/etcd"
fi

if need kwok kwokctl; then
  kv="${KWOK_VERSION#v}"
  gobuild kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kv -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" \
    sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
fi

if need kube-apiserver kube-controller-manager kube-scheduler; then
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  vpkg=k8s.io/component-base/version
  ldf="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
  ldf="$ldf -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  # Also stamp the copy kube-apiserver uses for its compatibility version.
  ldf="$ldf -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  gobuild kube "$ldf" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
fi

for f in "$TMP_OUT"/*; do
  [[ -e "$f" ]] || continue
  mv -f "$f" "$BIN_DIR/"
done

if ! all_present; then
  echo "build incomplete; missing in $BIN_DIR:" >&2
  for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || echo "  $b" >&2; done
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$BIN_DIR"
