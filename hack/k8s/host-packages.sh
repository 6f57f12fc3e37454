#!/usr/bin/env bash
# The host packages the test cluster's real node needs (Debian/Ubuntu, as root):
# containerd and runc (the container runtime), the CNI plugins (bridge, host-local,
# loopback), iptables (the bridge plugin's dependency), and for the images its pods run
# (hack/k8s/images.py) buildah, which builds them, and debootstrap, which makes their base.
# Installs only what is missing.
#
#   hack/k8s/host-packages.sh           # install what is missing
#   hack/k8s/host-packages.sh --check   # exit 1 (and name them) when some are missing
set -euo pipefail

# package -> a file it installs
declare -A PROBE=(
  [containerd]=/usr/bin/containerd
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [iptables]=/usr/sbin/iptables
  [debootstrap]=/usr/sbin/debootstrap
  [buildah]=/usr/bin/buildah
)
missing=()
for p in "${!PROBE[@]}"; do
  [[ -e "${PROBE[$p]}" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ "${1:-}" == --check ]]; then
  echo "missing host packages: ${missing[*]} (run hack/k8s/host-packages.sh)" >&2
  exit 1
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "the real node needs these Debian packages: ${missing[*]} (apt-get install them as root)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed: ${missing[*]}" >&2
