"""containerd for the real node: its own configuration, root, state and socket, the CNI
network of the pods (a bridge on a private /24 that stays on this machine) and the images
imported from OCI layout tars (there is no registry)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tarfile
import time
from pathlib import Path

from .binaries import ClusterError

CNI_BIN = "/usr/lib/cni"
RUNC = "/usr/sbin/runc"
NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace
BRIDGE = "kfpt0"
NETWORK = "kfp-trainer-real"
SUBNET = "10.213.0.0/24"
GATEWAY = "10.213.0.1"  # the bridge's address: CoreDNS listens here


class Containerd:
    """containerd with everything under ``base`` (``containerd/root`` keeps the image store
    between runs; ``containerd/state``, the runc root and the socket are per run)."""

    def __init__(self, base: Path, sandbox_image: str) -> None:
        self.base = base
        self.root = base / "containerd" / "root"
        self.state = base / "containerd" / "state"
        self.runc_root = base / "containerd" / "runc"
        self.config = base / "containerd" / "config.toml"
        self.socket = base / "run" / "containerd.sock"
        self.cni_conf_dir = base / "cni" / "net.d"
        self.ipam_dir = base / "cni" / "ipam"
        self.log_file = base / "logs" / "containerd.log"
        self.sandbox_image = sandbox_image

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def config_text(self) -> str:
        """containerd 1.6's configuration (version 2): the CRI plugin with runc (cgroupfs),
        ``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE: runc could not give
        the sandbox its oom_score_adj), our pause image, our CNI directory."""
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return "\n".join(
            [
                "version = 2",
                f'root = "{self.root}"',
                f'state = "{self.state}"',
                "oom_score = 0",
                'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
                ' "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]',
                "[grpc]",
                f'  address = "{self.socket}"',
                "[ttrpc]",
                f'  address = "{self.socket}.ttrpc"',
                "[debug]",
                '  address = ""',
                "[metrics]",
                '  address = ""',
                '[plugins."io.containerd.internal.v1.opt"]',
                f'  path = "{self.base / "containerd" / "opt"}"',
                f"[{cri}]",
                f'  sandbox_image = "{self.sandbox_image}"',
                "  restrict_oom_score_adj = true",
                "  enable_selinux = false",
                "  disable_apparmor = true",
                "  enable_cdi = false",
                "  netns_mounts_under_state_dir = true",
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                '  default_runtime_name = "runc"',
                f"[{cri}.containerd.runtimes.runc]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"[{cri}.containerd.runtimes.runc.options]",
                "  SystemdCgroup = false",
                f'  BinaryName = "{RUNC}"',
                f'  Root = "{self.runc_root}"',
                f"[{cri}.cni]",
                f'  bin_dir = "{CNI_BIN}"',
                f'  conf_dir = "{self.cni_conf_dir}"',
                "  max_conf_num = 1",
                "",
            ]
        )

    def cni_config(self) -> dict:
        """The pods' network: the bridge (made beforehand with the gateway address, see
        :func:`ensure_bridge`) and host-local addresses; no masquerading, no default route,
        so nothing is forwarded off the bridge."""
        return {
            "cniVersion": "0.4.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY, "rangeStart": "10.213.0.10"}]],
                        "dataDir": str(self.ipam_dir),
                    },
                }
            ],
        }

    def write_config(self) -> None:
        for d in (self.root, self.state, self.runc_root, self.cni_conf_dir, self.ipam_dir, self.socket.parent, self.log_file.parent):
            d.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text())
        (self.cni_conf_dir / f"10-{NETWORK}.conflist").write_text(json.dumps(self.cni_config(), indent=1))

    def argv(self) -> list[str]:
        return ["containerd", "--config", str(self.config), "--log-level", "info"]

    def ctr(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """``ctr`` against this containerd, in the CRI namespace."""
        cmd = ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return proc

    def ready(self) -> bool:
        return self.socket.exists() and self.ctr("version", timeout=5, check=False).returncode == 0

    def image_digest(self, ref: str) -> str | None:
        """The manifest digest of image ``ref`` in the store, or None."""
        out = self.ctr("images", "ls", f"name=={ref}").stdout.splitlines()[1:]
        return out[0].split()[2] if out else None

    def import_image(self, tar: Path) -> str:
        """Import an OCI layout tar unless the store has that digest; returns the image's name."""
        ref, digest = image_ref(tar)
        if self.image_digest(ref) != digest:
            self.ctr("images", "import", "--all-platforms", str(tar))
            if self.image_digest(ref) != digest:
                raise ClusterError(f"importing {tar} did not give {ref}@{digest}")
        return ref

    def remove_all_containers(self) -> None:
        """Delete every task and container (sandboxes included) of the CRI namespace; their
        processes should be gone already (a task whose process lives is killed first)."""
        tasks = [ln.split()[0] for ln in self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:] if ln.strip()]
        for t in tasks:
            if self.ctr("tasks", "delete", "--force", t, check=False, timeout=30).returncode != 0:
                self.ctr("tasks", "kill", "--signal", "SIGKILL", t, check=False, timeout=30)
                time.sleep(0.2)
                self.ctr("tasks", "delete", "--force", t, check=False, timeout=30)
        for c in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", c, check=False, timeout=30)


def image_ref(tar: Path) -> tuple[str, str]:
    """The name and manifest digest an OCI layout tar's index gives its image."""
    with tarfile.open(tar) as t:
        member = t.extractfile("index.json")
        if member is None:
            raise ClusterError(f"{tar}: no index.json")
        index = json.load(member)
    m = index["manifests"][0]
    return m["annotations"]["io.containerd.image.name"], m["digest"]


CNI_CACHE = Path("/var/lib/cni/results")  # the CNI library's cache (not configurable in containerd 1.6)


def forget_cni_results() -> None:
    """Remove the CNI cache entries of our network's sandboxes (and of their loopback), left
    when sandboxes go without a CNI DEL (containers removed with ``ctr``)."""
    prefix = f"{NETWORK}-"
    for entry in CNI_CACHE.glob(f"{prefix}*"):
        sandbox = entry.name[len(prefix) :].rsplit("-", 1)[0]
        for f in (entry, CNI_CACHE / f"cni-loopback-{sandbox}-lo"):
            f.unlink(missing_ok=True)


def ensure_bridge() -> None:
    """The pods' bridge with the gateway address, up (before any pod: CoreDNS binds there)."""
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        routes = subprocess.run(["ip", "-4", "route", "show", SUBNET], capture_output=True, text=True).stdout.strip()
        if routes:
            raise ClusterError(f"the real node's pod subnet {SUBNET} is in use on this machine: {routes}")
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True, capture_output=True)
    with contextlib.suppress(subprocess.CalledProcessError):
        subprocess.run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE], check=True, capture_output=True)
    subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True, capture_output=True)
