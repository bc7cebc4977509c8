"""What every scenario gets (`Env`: the cluster, the install, the mesh, the images), what it
hands back (`Record`: figures, notes, the namespaces to dump when it fails), and the
registry the runner reads (`scenario`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from waiter import protocol as p

from ._images import Images
from ._install import Install
from ._kube import Kube
from ._mesh import ISTIO_CNI_NS, NATIVE_NS, RUN_LABEL, Mesh

if TYPE_CHECKING:
    from tests.support.k8s import Cluster

    from ._lookup import LocalRegistry


@dataclass
class Env:
    kube: Kube
    admin: Path  # the admin kubeconfig
    minor: int  # the apiserver's minor version
    native: bool  # the cluster runs native sidecars
    images: Images
    install: Install
    mesh: Mesh
    run: str = field(default_factory=lambda: os.urandom(2).hex())
    registry: "LocalRegistry | None" = None  # a registry the node pulls from (the throwaway cluster's)
    cluster: "Cluster | None" = None  # the throwaway cluster's processes (None: a cluster of the user's)
    namespaces: list[str] = field(default_factory=list)
    keep_logs: bool = False  # keep the server's and watcher's logs (a failure, or --keep)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def build_strategy(self) -> str:
        """What `auto` gives a run-to-completion pod with steps."""
        return p.MODE_HYBRID if self.native else p.MODE_WAITER

    @property
    def job_strategy(self) -> str:
        """What `auto` gives a run-to-completion pod without steps (a Job's)."""
        return p.MODE_NATIVE if self.native else p.MODE_WAITER

    def namespace(self, short: str, *, mesh: str | None = "istio", opted: bool = True, native_mesh: bool = False,
                  labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
                  suffix: str = "") -> str:
        """A namespace of this run: opted in to initshift, with a mesh injecting (or not).
        `suffix` follows the run's id (a name that starts with another's)."""
        name = f"e2e-{short}-{self.run}{suffix}"
        all_labels = {**(labels or {}), RUN_LABEL: self.run}
        all_annotations = dict(annotations or {})
        if opted:
            all_labels[p.LABEL_NAMESPACE_ENABLED] = "true"
        if mesh == "istio":
            all_labels["istio-injection"] = "enabled"
        elif mesh == "istio-cni":
            all_labels |= {"istio-injection": "enabled", ISTIO_CNI_NS: "true"}
        elif mesh == "linkerd":
            all_annotations["linkerd.io/inject"] = "enabled"
        if native_mesh:
            all_labels[NATIVE_NS] = "true"
        self.kube.namespace(name, all_labels, all_annotations)
        with self._lock:
            self.namespaces.append(name)
        # the default ServiceAccount comes from the controller-manager; pods need it
        from ._kube import wait_for

        wait_for(lambda: self.kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), 60,
                 f"ServiceAccount {name}/default")
        return name


@dataclass
class Record:
    """A scenario's figures (printed after PASS/FAIL) and where to look when it fails."""

    figures: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)  # key -> the figure as printed
    namespaces: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # printed under the scenario's line

    def figure(self, label: str, value: float, unit: str = "ms") -> None:
        text = f"{value:.0f} ms" if unit == "ms" else f"{value:.2f} s" if unit == "s" else f"{value} {unit}"
        self.figures.append(f"{label} {text}")
        self.values[label] = text

    def note(self, text: str) -> None:
        self.figures.append(text)


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Env, Record], None]
    phase: int  # 1: concurrently with the others; 2: alone (timings, restarts)
    applies: Callable[[Env], bool]
    what: str

    @property
    def needs(self) -> str:
        """What a cluster needs for it: its `applies` check's docstring ("" for every cluster)."""
        return (self.applies.__doc__ or "").strip()


SCENARIOS: list[Scenario] = []


def any_cluster(env: Env) -> bool:
    return True


def scenario(name: str, *, phase: int = 1, applies: Callable[[Env], bool] = any_cluster):
    def register(fn: Callable[[Env, Record], None]) -> Callable[[Env, Record], None]:
        SCENARIOS.append(Scenario(name, fn, phase, applies, (fn.__doc__ or "").strip().splitlines()[0]))
        return fn
    return register


def native_only(env: Env) -> bool:
    """native sidecars (Kubernetes 1.29 or newer)"""
    return env.native


def own_cluster(env: Env) -> bool:
    """a cluster this run starts (not one from KUBECONFIG)"""
    return env.cluster is not None


def waiter_modes(env: Env) -> list[str]:
    """The strategies whose steps the waiter runs, where this cluster has them."""
    return [p.MODE_WAITER, *((p.MODE_HYBRID,) if env.native else ())]


def initshift(env: Env, *args: str, timeout: float = 300, kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, with the admin's kubeconfig (or `kubeconfig`)."""
    return subprocess.run([sys.executable, "-m", "webhook.cli", *args, "--kubeconfig", str(kubeconfig or env.admin)],
                          capture_output=True, text=True, timeout=timeout)


def check_report(env: Env, *args: str, kubeconfig: Path | None = None) -> tuple[int, list[dict]]:
    """`initshift check ARGS -o json`: its exit code and its lines (an AssertionError with
    what it printed where it printed no report)."""
    proc = initshift(env, "check", *args, "-o", "json", timeout=120, kubeconfig=kubeconfig)
    try:
        return proc.returncode, json.loads(proc.stdout)["checks"]
    except (ValueError, KeyError):
        raise AssertionError(f"check -o json printed no report (exit {proc.returncode}): {proc.stdout[-1000:]} "
                             f"{proc.stderr[-1000:]}") from None
