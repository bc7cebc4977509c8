"""etcd + kube-apiserver on loopback, on ports picked at run time, in a directory of their
own; an admin kubeconfig for whoever needs the API (the e2e cluster, `make bench-watcher`).

    from tests.support.k8s import control_plane
    with control_plane("1.34") as cp:
        run(["kubectl", "--kubeconfig", cp.kubeconfig, "get", "ns"])

Nothing listens beyond 127.0.0.1; etcd keeps its data in memory-backed /dev/shm when the
machine has it (a throwaway cluster needs no durable fsync).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import yaml

from . import _binaries, _pki
from ._errors import ClusterError
from ._procs import Process, free_port, wait_for

SERVICE_CIDR = "10.96.0.0/24"  # virtual: nothing routes it, no kube-proxy runs
SERVICE_IP = "10.96.0.1"
ADMIN_USER = "initshift-e2e-admin"
START_TIMEOUT = 90.0  # a loaded 2-core machine; idle, the apiserver is ready in ~3 s


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(path: Path, server: str, ca: bytes, user: str, *, cert: _pki.Pem | None = None,
                     token: str | None = None, namespace: str | None = None) -> Path:
    """A kubeconfig with one cluster, one user (client certificate or bearer token), one context."""
    creds: dict[str, str] = {}
    if cert:
        creds = {"client-certificate-data": _b64(cert.cert), "client-key-data": _b64(cert.key)}
    if token:
        creds["token"] = token
    context: dict[str, str] = {"cluster": "e2e", "user": user}
    if namespace:
        context["namespace"] = namespace
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "e2e", "context": context}],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver. `kubeconfig` is an admin's (group system:masters)."""

    version: str  # the full version, e.g. "v1.34.9"
    dir: Path
    bin: Path
    server: str = ""
    kubeconfig: Path = Path()
    ca: _pki.Authority = field(default_factory=_pki.Authority)
    etcd: Process | None = None
    apiserver: Process | None = None
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    log: Callable[[str], None] = lambda _msg: None
    _etcd_data: Path | None = None

    @property
    def ca_file(self) -> Path:
        return self.dir / "pki" / "ca.crt"

    @property
    def processes(self) -> list[Process]:
        return [p for p in (self.apiserver, self.etcd) if p]

    def gates_flag(self) -> list[str]:
        if not self.feature_gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))]

    def client_kubeconfig(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for another identity, authenticated by a client certificate of this CA."""
        return write_kubeconfig(self.dir / f"{name}.kubeconfig", self.server, self.ca.pem.cert, user,
                                cert=self.ca.client(user, groups))

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET `path` as the admin (for readiness checks)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.dir / "pki" / "admin.crt"), str(self.dir / "pki" / "admin.key"))
        host, port = self.server.removeprefix("https://").rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    # --- start and stop ---------------------------------------------------------------

    def start(self) -> None:
        pki = self.dir / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        (pki / "ca.crt").write_bytes(self.ca.pem.cert)
        self.ca.client(ADMIN_USER, ("system:masters",)).write(pki, "admin")
        self.ca.serving("kube-apiserver", ["localhost", "kubernetes", "kubernetes.default",
                                           "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
                        ["127.0.0.1", SERVICE_IP]).write(pki, "apiserver")
        self.ca.client("kube-apiserver-kubelet-client", ("system:masters",)).write(pki, "apiserver-kubelet-client")
        sa = _pki.signing_key()
        (pki / "sa.pub").write_bytes(sa.cert)
        (pki / "sa.key").write_bytes(sa.key)
        self._start_etcd()
        self._start_apiserver()
        self.kubeconfig = write_kubeconfig(self.dir / "admin.kubeconfig", self.server, self.ca.pem.cert, ADMIN_USER,
                                           cert=_pki.Pem((pki / "admin.crt").read_bytes(), (pki / "admin.key").read_bytes()))

    def _start_etcd(self) -> None:
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and shm.stat().st_mode & 0o002 else self.dir
        self._etcd_data = Path(tempfile.mkdtemp(prefix="initshift-etcd-", dir=base))
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        self.etcd = Process("etcd", [
            "etcd", "--name", "e2e", "--data-dir", str(self._etcd_data),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"e2e=http://127.0.0.1:{peer}", "--initial-cluster-state", "new",
            "--logger", "zap", "--log-level", "warn", "--quota-backend-bytes", str(2 << 30),
        ], self.dir / "etcd.log")
        self._etcd_url = url

        def healthy() -> bool:
            conn = http.client.HTTPConnection("127.0.0.1", client, timeout=2)
            try:
                conn.request("GET", "/health")
                return json.loads(conn.getresponse().read()).get("health") == "true"
            finally:
                conn.close()

        wait_for(healthy, START_TIMEOUT, "etcd /health", watch=[self.etcd])
        self.log(f"etcd ready on {url}")

    def _start_apiserver(self) -> None:
        pki = self.dir / "pki"
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self.apiserver = Process("kube-apiserver", [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers={self._etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--advertise-address=127.0.0.1",
            # The `kubernetes` Service would get 127.0.0.1 as its endpoint, which the API
            # refuses; nothing in these tests reaches the apiserver through the Service.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            # the node is "localhost" (the kubelet listens on 127.0.0.1 only; a loopback node IP is refused)
            "--kubelet-preferred-address-types=Hostname,InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # A Service's ClusterIP leads nowhere (no kube-proxy): a webhook (or an aggregated
            # API) named by its Service is called at the Service's endpoints instead.
            "--enable-aggregator-routing=true",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            *self.gates_flag(),
        ], self.dir / "kube-apiserver.log")

        def ready() -> bool:
            return self.get("/readyz")[0] == 200

        wait_for(ready, START_TIMEOUT, "kube-apiserver /readyz", watch=[self.etcd, self.apiserver], interval=0.1)
        self.log(f"kube-apiserver {self.version} ready on {self.server}")

    def restart_apiserver(self, down: float = 0.0) -> float:
        """Stop kube-apiserver (SIGTERM: it stops listening at once, then drains; after 15 s
        it is killed), start it again as it was (the same port and etcd) no sooner than
        `down` seconds after the SIGTERM, as a control-plane upgrade does. Returns the
        seconds from the SIGTERM until it was ready again."""
        assert self.apiserver is not None
        asked = time.monotonic()
        self.apiserver.stop()
        time.sleep(max(0.0, asked + down - time.monotonic()))
        self.apiserver = Process("kube-apiserver", self.apiserver.argv, self.apiserver.log)
        wait_for(lambda: self.get("/readyz")[0] == 200, START_TIMEOUT, "the restarted kube-apiserver's /readyz",
                 watch=[self.etcd, self.apiserver], interval=0.1)
        return time.monotonic() - asked

    def stop(self) -> None:
        for proc in self.processes:
            proc.stop()
        if self._etcd_data:
            shutil.rmtree(self._etcd_data, ignore_errors=True)


def _workdir(parent: Path | None, prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


@contextlib.contextmanager
def control_plane(version: str = "1.34", *, workdir: Path | None = None, keep: bool = False,
                  feature_gates: Mapping[str, bool] | None = None,
                  log: Callable[[str], None] | None = None) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver of `version` ("1.34", "1.28" or a full "v1.34.9"), stopped on exit.

    `workdir`: where the directory of this control plane is made (default: the system's
    temporary directory); `keep`: leave the directory (logs, kubeconfig, PKI) afterwards.
    """
    bin_dir = _binaries.binaries(version)
    if not shutil.which("etcd"):
        raise ClusterError("etcd is not installed (Debian: etcd-server)")
    cp = ControlPlane(version=bin_dir.name, dir=_workdir(workdir, "initshift-k8s-"), bin=bin_dir,
                      feature_gates=dict(feature_gates or {}), log=log or (lambda _m: None))
    started = time.monotonic()
    try:
        cp.start()
        cp.log(f"control plane up in {time.monotonic() - started:.1f} s; kubeconfig {cp.kubeconfig}")
        yield cp
    finally:
        cp.stop()
        if not keep:
            shutil.rmtree(cp.dir, ignore_errors=True)
