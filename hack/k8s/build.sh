#!/usr/bin/env bash
# Build the test control plane from Go modules into cache directories keyed by the
# versions: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and
# kwokctl into one, and our controllers binary (the real Kubeflow Trainer and JobSet
# controllers, hack/k8s/controllers) into another, keyed also by a digest of its
# sources. The real node's pieces each into one of their own, keyed by version and a
# digest of their wrapper's files: the kubelet (hack/k8s/kube), CoreDNS
# (hack/k8s/coredns) and the node images (the pause image, compiled from the Kubernetes
# module's build/pause/linux/pause.c, and the probe test image, hack/k8s/testimage) as
# OCI image layout tars. The oldest Kubernetes version tested (hack/k8s/kube-1.32: kube-apiserver,
# kube-controller-manager, kube-scheduler) into one of its own. Kueue's manager (controllers and webhooks, hack/k8s/kueue: its
# cmd/kueue as a tool of a wrapper module) into one of its own, keyed by version and the
# wrapper's digest. Skips everything that is already there.
#
#   hack/k8s/build.sh            # build what is missing; print the bin dirs (see below)
#   hack/k8s/build.sh --print    # only print them (exit 1 if anything is missing)
#   hack/k8s/build.sh --locate   # only find the module sources read outside go build (downloads them)
#   hack/k8s/build.sh --force    # rebuild everything
#
# Older Trainer releases (OLD_TRAINERS) get a controllers binary each, in a cache directory
# of their own keyed by the Trainer and JobSet versions and a digest of the sources: the
# wrapper's Go files with the release's overlay hack/k8s/controllers/<version>/ (its go.mod,
# go.sum, its release.go -- what differs between the releases' APIs, behind the names
# that the shared main.go calls -- and any other file whose upstream APIs differ) copied over them.
#
# Output (stdout): lines CONTROLLERS_BIN=<path of the controllers binary>,
# KUBELET_BIN=<kubelet>, COREDNS_BIN=<coredns>, NODE_IMAGES=<dir of pause.tar and
# probe.tar>, KUBE_OLD_BIN=<dir of the 1.32 binaries>, KUEUE_BIN=<Kueue's manager>, then the directory of the Kubernetes/etcd/kwok
# binaries as the last line.
#
# The modules build side by side (the Kubernetes build is the long one; the others
# fill the gaps in its compile and link steps); KFP_TRAINER_BUILD_JOBS=1 builds one
# after the other.
#
# Environment:
#   KFP_TRAINER_CACHE       cache root (default: $HOME/.cache/kfp-trainer)
#   KFP_TRAINER_NICE        niceness for the compiler (default: 10)
#   KFP_TRAINER_BUILD_JOBS  1: build the modules one after the other (default: in parallel)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Keep in sync with hack/k8s/{kube,etcd,kwok,controllers}/go.mod and hack/k8s/cluster/.
K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
TRAINER_VERSION=v2.3.0
JOBSET_VERSION=v0.12.0
COREDNS_VERSION=v1.15.0
# The oldest supported API server, for the version-skew tests (hack/k8s/kube-1.32): its
# kube-apiserver, kube-controller-manager and kube-scheduler (none may be newer than the API server).
K8S_OLD_VERSION=v1.32.2
PAUSE_TAG=3.10.2  # build/pause/Makefile's TAG in the Kubernetes module
KUEUE_VERSION=v0.17.0

CACHE_ROOT="${KFP_TRAINER_CACHE:-$HOME/.cache/kfp-trainer}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION/bin"
BINARIES=(etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl)

ctrl_digest() {
  (cd "$HERE/controllers" && cat go.mod go.sum ./*.go) | sha256sum | cut -c1-12
}
CTRL_DIR="$CACHE_ROOT/controllers-trainer-$TRAINER_VERSION-jobset-$JOBSET_VERSION-$(ctrl_digest)/bin"
CTRL_BIN="$CTRL_DIR/controllers"

OLD_TRAINERS=(v2.1.0 v2.2.1)
old_ctrl_bin() { # <trainer version>: the path of its controllers binary
  local v="$1" ov="$HERE/controllers/$1" js digest
  js="$(awk '$1 == "sigs.k8s.io/jobset" {print $2}' "$ov/go.mod")"
  digest="$( (cd "$HERE/controllers" && cat ./*.go && cd "$ov" && cat go.mod go.sum ./*.go) | sha256sum | cut -c1-12)"
  echo "$CACHE_ROOT/controllers-trainer-$v-jobset-$js-$digest/bin/controllers"
}
declare -A OLD_CTRL_BIN=()
for v in "${OLD_TRAINERS[@]}"; do OLD_CTRL_BIN[$v]="$(old_ctrl_bin "$v")"; done

files_digest() { # <dir under hack/k8s> <file>...: a digest of those files
  local d="$1"; shift
  (cd "$HERE/$d" && cat "$@") | sha256sum | cut -c1-12
}
KUBELET_BIN="$CACHE_ROOT/kubelet-$K8S_VERSION-$(files_digest kube go.mod go.sum)/bin/kubelet"
COREDNS_BIN="$CACHE_ROOT/coredns-$COREDNS_VERSION-$(files_digest coredns go.mod go.sum main.go)/bin/coredns"
IMAGES_DIR="$CACHE_ROOT/node-images-$K8S_VERSION-pause-$PAUSE_TAG-$(files_digest . testimage/go.mod testimage/main.go testcluster/ociimage.py)"
IMAGES=(pause.tar probe.tar)
OLD_BIN_DIR="$CACHE_ROOT/k8s-$K8S_OLD_VERSION-$(files_digest kube-1.32 go.mod go.sum)/bin"
OLD_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler)
old_present() { local b; for b in "${OLD_BINARIES[@]}"; do [[ -x "$OLD_BIN_DIR/$b" ]] || return 1; done; }
KUEUE_BIN="$CACHE_ROOT/kueue-$KUEUE_VERSION-$(files_digest kueue go.mod go.sum main.sed)/bin/kueue"

all_present() {
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x "$BIN_DIR/$b" ]] || return 1
  done
  [[ -x "$CTRL_BIN" && -x "$KUBELET_BIN" && -x "$COREDNS_BIN" && -x "$KUEUE_BIN" ]] || return 1
  old_present || return 1
  for b in "${OLD_CTRL_BIN[@]}"; do
    [[ -x "$b" ]] || return 1
  done
  for b in "${IMAGES[@]}"; do
    [[ -f "$IMAGES_DIR/$b" ]] || return 1
  done
}

report() {
  echo "CONTROLLERS_BIN=$CTRL_BIN"
  echo "KUBELET_BIN=$KUBELET_BIN"
  echo "COREDNS_BIN=$COREDNS_BIN"
  echo "NODE_IMAGES=$IMAGES_DIR"
  echo "KUBE_OLD_BIN=$OLD_BIN_DIR"
  echo "KUEUE_BIN=$KUEUE_BIN"
  local v
  for v in "${OLD_TRAINERS[@]}"; do echo "CONTROLLERS_BIN_$v=${OLD_CTRL_BIN[$v]}"; done
  echo "$BIN_DIR"
}

# module_src <wrapper dir> <module>: the directory of the module that hack/k8s/<wrapper dir>/go.mod
# requires, in the Go module cache. It downloads the module first: `go list -m` prints
# nothing for a module not yet in the cache, and a fresh machine's cache holds none.
module_src() {
  local dir="$1" mod="$2" json src
  if ! json="$(cd "$HERE/$dir" && go mod download -json "$mod" 2>&1)"; then
    echo "cannot download $mod (required by hack/k8s/$dir/go.mod):" >&2
    printf '%s\n' "$json" >&2
    return 1
  fi
  src="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  if [[ -z "$src" || ! -d "$src" ]]; then
    echo "go mod download $mod (hack/k8s/$dir) named no source directory:" >&2
    printf '%s\n' "$json" >&2
    return 1
  fi
  echo "$src"
}

# The sources the builds read from modules rather than compile through go build, each checked
# for the files used: the pause image's pause.c (k8s.io/kubernetes) and Kueue's main.go, CRDs
# and webhook manifests (sigs.k8s.io/kueue).
pause_src() {
  local src
  src="$(module_src kube k8s.io/kubernetes)" || return 1
  [[ -f "$src/build/pause/linux/pause.c" ]] || { echo "build/pause/linux/pause.c not found in k8s.io/kubernetes ($src)" >&2; return 1; }
  echo "$src"
}
kueue_src() {
  local src f
  src="$(module_src kueue sigs.k8s.io/kueue)" || return 1
  for f in cmd/kueue/main.go config/components/webhook/manifests.yaml config/components/crd/bases; do
    [[ -e "$src/$f" ]] || { echo "$f not found in sigs.k8s.io/kueue ($src)" >&2; return 1; }
  done
  echo "$src"
}

mode="${1:-build}"
case "$mode" in
  --locate) # only find (downloading what is missing) the module sources read outside go build
    pause_src >/dev/null && kueue_src >/dev/null && echo "module sources found" >&2
    exit $? ;;
  --print)
    report
    all_present && exit 0
    exit 1 ;;
  --force) rm -rf "$BIN_DIR" "$CTRL_DIR" "$(dirname "$KUBELET_BIN")" "$(dirname "$COREDNS_BIN")" "$IMAGES_DIR" "$OLD_BIN_DIR" "$(dirname "$KUEUE_BIN")"
    for b in "${OLD_CTRL_BIN[@]}"; do rm -rf "$(dirname "$b")"; done ;;
  build|"") ;;
  *) echo "usage: $0 [--print|--locate|--force]" >&2; exit 2 ;;
esac

if all_present; then
  echo "control plane binaries present" >&2
  report
  exit 0
fi

# One build at a time per cache: `make test` starts this build beside the Python setup, and
# the integration tests call this script again when they start; the second waits for the
# first and then finds its binaries instead of compiling everything a second time.
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build.lock"
if ! flock -n 9; then
  echo "another build.sh is building into $CACHE_ROOT: waiting for it" >&2
  flock 9
  if all_present; then
    echo "control plane binaries present (built by the other build)" >&2
    report
    exit 0
  fi
fi

command -v go >/dev/null || { echo "go not found in PATH: cannot build the control plane" >&2; report; exit 1; }

# The wrappers must pin the versions this script names (the cache key).
check_pin() { # <module dir> <module path> <version>
  grep -Eq "^[[:space:]]*(require[[:space:]]+)?$2 $3( |$)" "$HERE/$1/go.mod" || {
    echo "hack/k8s/$1/go.mod does not require $2 $3 (build.sh names that version)" >&2; exit 1; }
}
check_pin controllers github.com/kubeflow/trainer/v2 "$TRAINER_VERSION"
check_pin controllers sigs.k8s.io/jobset "$JOBSET_VERSION"
check_pin kwok sigs.k8s.io/kwok "$KWOK_VERSION"
check_pin kube-1.32 k8s.io/kubernetes "$K8S_OLD_VERSION"
check_pin kueue sigs.k8s.io/kueue "$KUEUE_VERSION"
for v in "${OLD_TRAINERS[@]}"; do check_pin "controllers/$v" github.com/kubeflow/trainer/v2 "$v"; done

NICE="${KFP_TRAINER_NICE:-10}"
mkdir -p "$BIN_DIR" "$OLD_BIN_DIR" "$CTRL_DIR" "$(dirname "$KUBELET_BIN")" "$(dirname "$COREDNS_BIN")" "$IMAGES_DIR" "$(dirname "$KUEUE_BIN")"
# Build into temporary directories and move the finished binaries in, so an
# interrupted build never leaves a half-written binary behind.
WORK="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

export GOFLAGS="-trimpath -mod=readonly"
export CGO_ENABLED=0

gobuild() { # <module dir> <out dir> <ldflags> <package>...
  local dir="$1" out="$2" ldflags="$3"; shift 3
  mkdir -p "$out"
  (cd "$HERE/$dir" && nice -n "$NICE" go build -ldflags "$ldflags" -o "$out/" "$@")
}

need() { local b; for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 0; done; return 1; }

build_etcd() {
  gobuild etcd "$WORK/etcd" "-s -w" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3
  # go names the server binary after its module path ("server").
  mv "$WORK/etcd/server" "$WORK/etcd/etcd"
  mv -f "$WORK/etcd/"* "$BIN_DIR/"
}

build_kwok() {
  local kv="${KWOK_VERSION#v}"
  gobuild kwok "$WORK/kwok" "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kv -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" \
    sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
  mv -f "$WORK/kwok/"* "$BIN_DIR/"
}

kube_ldflags() { # [version]: the version stamp (default: $K8S_VERSION)
  local v="${1:-$K8S_VERSION}" vpkg=k8s.io/component-base/version ldf minor
  minor="${v#v1.}"
  minor="${minor%%.*}"
  ldf="-s -w -X $vpkg.gitVersion=$v -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor"
  ldf="$ldf -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
  # Also stamp the copy kube-apiserver uses for its compatibility version.
  echo "$ldf -X k8s.io/client-go/pkg/version.gitVersion=$v -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}

# The trio, and the kubelet in the same go build when it is missing too: they share most of
# their packages, which two go builds side by side would each compile.
build_kube() {
  local kubelet=()
  [[ -x "$KUBELET_BIN" ]] || kubelet=(k8s.io/kubernetes/cmd/kubelet)
  gobuild kube "$WORK/kube" "$(kube_ldflags)" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler "${kubelet[@]}"
  [[ ${#kubelet[@]} == 0 ]] || mv -f "$WORK/kube/kubelet" "$KUBELET_BIN"
  mv -f "$WORK/kube/"* "$BIN_DIR/"
}

# The oldest supported control plane: its own job and cache directory.
build_kube_old() {
  gobuild kube-1.32 "$WORK/kube-old" "$(kube_ldflags "$K8S_OLD_VERSION")" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
  mv -f "$WORK/kube-old/"* "$OLD_BIN_DIR/"
}

# The kubelet: its own job and cache directory, so that adding it never rebuilds the others.
build_kubelet() {
  gobuild kube "$WORK/kubelet" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kubelet
  mv -f "$WORK/kubelet/kubelet" "$KUBELET_BIN"
}

build_coredns() {
  gobuild coredns "$WORK/coredns" "-s -w" .
  mv -f "$WORK/coredns/coredns" "$COREDNS_BIN"
}

# The pause image (containerd's sandbox image) and the probe test image, as OCI layout tars.
build_images() {
  local src out="$WORK/images" py
  mkdir -p "$out"
  src="$(pause_src)" || return 1
  nice -n "$NICE" gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG" -o "$out/pause" "$src/build/pause/linux/pause.c"
  gobuild testimage "$out" "-s -w" .
  mv "$out/testimage" "$out/probe"
  py="$(command -v python3)"
  "$py" "$HERE/testcluster/ociimage.py" "$out/pause.tar" "kfp-trainer.test/pause:$PAUSE_TAG" --file "$out/pause:/pause" --entrypoint /pause
  "$py" "$HERE/testcluster/ociimage.py" "$out/probe.tar" "kfp-trainer.test/probe:$(basename "$IMAGES_DIR" | rev | cut -d- -f1 | rev)" \
    --file "$out/probe:/probe" --entrypoint /probe
  mv -f "$out/pause.tar" "$out/probe.tar" "$IMAGES_DIR/"
}

# Kueue's manager: the module's own cmd/kueue (a tool of the wrapper's go.mod), its main.go
# edited by kueue/main.sed and built as the main package of a copy of the wrapper (go build
# -overlay may not replace files in the module cache); its CRDs and webhook manifests copied
# from the module next to the binary (bin/../crds, bin/../webhook), the binary last.
build_kueue() {
  local src mod="$WORK/kueue-module" dst
  src="$(kueue_src)" || return 1
  dst="$(dirname "$(dirname "$KUEUE_BIN")")"
  mkdir -p "$mod" "$dst/crds" "$dst/webhook"
  cp "$HERE/kueue/go.mod" "$HERE/kueue/go.sum" "$mod/"
  sed -f "$HERE/kueue/main.sed" "$src/cmd/kueue/main.go" >"$mod/main.go"
  cmp -s "$src/cmd/kueue/main.go" "$mod/main.go" && { echo "kueue/main.sed changed nothing in $src/cmd/kueue/main.go"; return 1; }
  (cd "$mod" && nice -n "$NICE" go build -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" -o "$mod/bin/kueue" .)
  install -m 0644 "$src"/config/components/crd/bases/*.yaml "$dst/crds/"
  install -m 0644 "$src/config/components/webhook/manifests.yaml" "$dst/webhook/"
  mv -f "$mod/bin/kueue" "$KUEUE_BIN"
}

build_controllers() {
  gobuild controllers "$WORK/controllers" "-s -w" .
  mv -f "$WORK/controllers/controllers" "$CTRL_BIN"
}

# An older Trainer's controllers: the wrapper's files (the shared main.go, v2.3.0's
# release.go, ...) with the release's overlay (its go.mod, go.sum, release.go, ...) on top.
build_old_controllers() { # <trainer version>
  local v="$1" src="$WORK/src-$1" out="$WORK/out-$1"
  mkdir -p "$src" "$out" "$(dirname "${OLD_CTRL_BIN[$v]}")"
  cp "$HERE/controllers/"*.go "$src/"
  cp "$HERE/controllers/$v/go.mod" "$HERE/controllers/$v/go.sum" "$HERE/controllers/$v/"*.go "$src/"
  (cd "$src" && nice -n "$NICE" go build -ldflags "-s -w" -o "$out/" .)
  mv -f "$out/controllers" "${OLD_CTRL_BIN[$v]}"
}
build_controllers_v2_1_0() { build_old_controllers v2.1.0; }
build_controllers_v2_2_1() { build_old_controllers v2.2.1; }

jobs_to_run=()
need etcd etcdctl && jobs_to_run+=(etcd)
need kwok kwokctl && jobs_to_run+=(kwok)
[[ -x "$CTRL_BIN" ]] || jobs_to_run+=(controllers)
for v in "${OLD_TRAINERS[@]}"; do [[ -x "${OLD_CTRL_BIN[$v]}" ]] || jobs_to_run+=("controllers_${v//./_}"); done
if need kube-apiserver kube-controller-manager kube-scheduler; then
  jobs_to_run+=(kube)  # the kubelet with them
elif [[ ! -x "$KUBELET_BIN" ]]; then
  jobs_to_run+=(kubelet)
fi
old_present || jobs_to_run+=(kube_old)
[[ -x "$COREDNS_BIN" ]] || jobs_to_run+=(coredns)
[[ -x "$KUEUE_BIN" ]] || jobs_to_run+=(kueue)
[[ -f "$IMAGES_DIR/pause.tar" && -f "$IMAGES_DIR/probe.tar" ]] || jobs_to_run+=(images)

start=$(date +%s)
# The standard library first, once: every module builds it with the same flags, and builds
# side by side on an empty build cache would each compile it (about 50 CPU-seconds apiece).
if [[ " ${jobs_to_run[*]} " != " images " && ${#jobs_to_run[@]} -gt 0 ]]; then
  t=$(date +%s)
  nice -n "$NICE" go build std >"$WORK/std.log" 2>&1 || { echo "building the Go standard library failed:" >&2; tail -n 40 "$WORK/std.log" >&2; exit 1; }
  echo "built the standard library in $(( $(date +%s) - t )) s" >&2
fi
declare -A pids=()
failed=()
for j in "${jobs_to_run[@]}"; do
  echo "building $j" >&2
  if [[ "${KFP_TRAINER_BUILD_JOBS:-}" == 1 ]]; then
    t=$(date +%s)
    if "build_$j" >"$WORK/$j.log" 2>&1; then
      echo "built $j in $(( $(date +%s) - t )) s" >&2
    else
      failed+=("$j")
    fi
  else
    ( t=$(date +%s); "build_$j" >"$WORK/$j.log" 2>&1; rc=$?
      [[ $rc == 0 ]] && echo "built $j in $(( $(date +%s) - t )) s" >&2; exit $rc ) &
    pids[$j]=$!
  fi
done
for j in "${!pids[@]}"; do
  wait "${pids[$j]}" || failed+=("$j")
done
for j in "${failed[@]}"; do
  echo "building $j failed:" >&2
  tail -n 40 "$WORK/$j.log" >&2
done

if [[ ${#failed[@]} -gt 0 ]] || ! all_present; then
  echo "build incomplete; missing:" >&2
  for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || echo "  $BIN_DIR/$b" >&2; done
  for b in "${OLD_BINARIES[@]}"; do [[ -x "$OLD_BIN_DIR/$b" ]] || echo "  $OLD_BIN_DIR/$b" >&2; done
  for b in "$CTRL_BIN" "${OLD_CTRL_BIN[@]}" "$KUBELET_BIN" "$COREDNS_BIN" "$KUEUE_BIN" "$IMAGES_DIR/pause.tar" "$IMAGES_DIR/probe.tar"; do
    [[ -e "$b" ]] || echo "  $b" >&2
  done
  report
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s" >&2
report
