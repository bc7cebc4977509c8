"""Real Kubernetes for the tests, from the binaries in ../shared/k8s (or $E2E_K8S_DIR).

- `control_plane(version)`: etcd + kube-apiserver alone (a context manager yielding a
  `ControlPlane` with an admin `kubeconfig`), e.g. for `make bench-watcher`.
- `cluster(version)`: a whole single-node cluster (controller-manager, scheduler,
  containerd, kubelet, a CNI bridge) around it, torn down on exit, leaks checked.
- `Image`, `busybox_image()`: images as docker-archive tars, imported into the node.
- `binaries(version)`: the verified binaries, decompressed once into `.cache/k8s/`.

Everything listens on 127.0.0.1 on ports picked at run time and keeps its state in a
directory of its own, so several runs share a machine.
"""

from __future__ import annotations

from ._binaries import available, binaries, resolve, shared_dir
from ._cluster import Cluster, cluster, missing_commands
from ._controlplane import ControlPlane, control_plane, write_kubeconfig
from ._errors import ClusterError
from ._images import BUSYBOX, PAUSE, REGISTRY, Image, busybox_image, compile_static
from ._procs import Process, free_port, wait_for

__all__ = [
    "BUSYBOX", "PAUSE", "REGISTRY", "Cluster", "Image", "busybox_image", "cluster", "compile_static",
    "missing_commands", "ClusterError", "ControlPlane", "Process", "available", "binaries", "control_plane", "free_port",
    "resolve", "shared_dir", "wait_for", "write_kubeconfig",
]
