"""The cluster's Kubernetes versions, read for native-sidecar detection: the apiserver's
(GET /version) and every kubelet's (each node's `status.nodeInfo.kubeletVersion`).

The nodes are read as the apiserver prints them for `kubectl get nodes` (a Table, whose
"Version" column is the kubelet's), without the objects: a node with its status (images,
conditions) is ~13 KB of JSON, its row ~170 bytes. 1,000 such nodes on kube-apiserver
v1.34.9: 0.17 MB and 0.06 s of apiserver CPU instead of 13 MB and 0.27 s, and each page of
500 parsed in 1 ms instead of 93 ms on the server's event loop, at every refresh
(INITSHIFT_NATIVE_REFRESH_SECONDS). A server that answers with the plain list is read too.

Reading never raises: what could not be read is None with the reason, and the caller
(webhook/admission/_cluster.py) decides what an unknown version means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ._api import KubeApi, KubeError

Version = tuple[int, int]

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\D.*)?$")
_NUMBER = re.compile(r"^(\d+)\+?$")  # /version's major and minor ("29+" on some providers)
NODE_PAGE = 500  # nodes per list call: a large cluster's list stays bounded
# Server-side printing, as kubectl asks for it (the plain list as a fallback).
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


@dataclass(frozen=True)
class ClusterVersions:
    """What was read. `kubelets` is None when the nodes could not be listed (`nodes_error` says
    why); `apiserver` is None when /version could not be read (`error` says why)."""

    apiserver: Version | None
    kubelets: tuple[Version | None, ...] | None = None
    nodes_error: str | None = None
    error: str | None = None


def parse_version(text: object) -> Version | None:
    """(major, minor) of "v1.29.3-eks-abc", "1.30", "v1.28.0+k3s1"; None if it is not one."""
    m = _VERSION.match(text.strip()) if isinstance(text, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def apiserver_version(body: object) -> Version | None:
    """The apiserver's version from a GET /version body: gitVersion, else major/minor."""
    if not isinstance(body, dict):
        return None
    major, minor = (_NUMBER.match(str(body.get(k, "")).strip()) for k in ("major", "minor"))
    return parse_version(body.get("gitVersion")) or ((int(major.group(1)), int(minor.group(1)))
                                                     if major and minor else None)


def kubelet_versions(page: dict) -> list[Version | None]:
    """The kubelets' versions in one page of nodes: a Table's "Version" column, or each
    node's `status.nodeInfo.kubeletVersion` in a plain list."""
    if page.get("kind") != "Table":
        return [parse_version(((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion"))
                for node in page.get("items") or []]
    columns = [column.get("name") for column in page.get("columnDefinitions") or []]
    at = columns.index("Version") if "Version" in columns else None
    cells = [row.get("cells") or [] for row in page.get("rows") or []]
    return [parse_version(row[at]) if at is not None and len(row) > at else None for row in cells]


async def read_versions(api: KubeApi) -> ClusterVersions:
    """One look at the cluster: the apiserver's version, then every node's kubelet's."""
    try:
        apiserver = apiserver_version(await api.request("GET", "/version"))
    except Exception as e:  # noqa: BLE001 - any failure means "unknown"
        return ClusterVersions(None, error=f"GET /version: {e}")
    if apiserver is None:
        return ClusterVersions(None, error="GET /version has no usable version")
    kubelets: list[Version | None] = []
    token: str | None = None
    try:
        while True:
            body: Any = await api.request("GET", "/api/v1/nodes", accept=TABLE, query={
                "limit": NODE_PAGE, "continue": token, "includeObject": "None"}) or {}
            kubelets += kubelet_versions(body)
            token = (body.get("metadata") or {}).get("continue") or None
            if not token:
                return ClusterVersions(apiserver, tuple(kubelets))
    except KubeError as e:
        why = f"listing nodes is forbidden: {e}" if e.status == 403 else f"listing nodes failed: {e}"
    except Exception as e:  # noqa: BLE001
        why = f"listing nodes failed: {e}"
    return ClusterVersions(apiserver, None, nodes_error=why)
