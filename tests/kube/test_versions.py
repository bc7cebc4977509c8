"""The cluster's versions as native-sidecar detection reads them: version parsing, the
apiserver's /version body, the node list's pagination, and failures turned into reasons."""

from __future__ import annotations

import pytest

from webhook.kube import KubeError, read_versions
from webhook.kube._versions import NODE_PAGE, TABLE, apiserver_version, kubelet_versions, parse_version


@pytest.mark.parametrize("text, expected", [
    ("v1.29.3-eks-abc", (1, 29)),
    ("v1.30.0", (1, 30)),
    ("1.28", (1, 28)),
    ("v1.28.5+k3s1", (1, 28)),
    ("v1.31.1-gke.1146000", (1, 31)),
    ("v2.0.0", (2, 0)),
    ("", None),
    ("latest", None),
    ("v1", None),
    (None, None),
    (129, None),
])
def test_parse_version(text, expected):
    assert parse_version(text) == expected


@pytest.mark.parametrize("body, expected", [
    ({"gitVersion": "v1.29.3-eks-abc", "major": "1", "minor": "29"}, (1, 29)),
    ({"gitVersion": "", "major": "1", "minor": "29+"}, (1, 29)),  # GKE/EKS style minor
    ({"major": "1", "minor": "30"}, (1, 30)),
    ({"major": "1", "minor": "x"}, None),
    ({}, None),
    ("not a mapping", None),
])
def test_apiserver_version(body, expected):
    assert apiserver_version(body) == expected


class PagedApi:
    """A KubeApi stand-in for the node list's pagination, answering as a plain list (a server
    without server-side printing)."""

    def __init__(self, pages: list[list[str]], nodes_error: KubeError | None = None) -> None:
        self.pages, self.queries, self.nodes_error = pages, [], nodes_error

    async def request(self, method: str, path: str, *, query: dict | None = None, accept: str = "") -> dict:
        if path == "/version":
            return {"gitVersion": "v1.30.2"}
        if self.nodes_error is not None:
            raise self.nodes_error
        self.queries.append(dict(query or {}))
        index = int((query or {}).get("continue") or 0)
        more = {"continue": str(index + 1)} if index + 1 < len(self.pages) else {}
        return {"items": [{"status": {"nodeInfo": {"kubeletVersion": v}}} for v in self.pages[index]],
                "metadata": more}


async def test_node_list_follows_continue_tokens():
    api = PagedApi([["v1.30.0"], ["v1.30.0"], ["v1.28.0", "garbage"]])
    seen = await read_versions(api)  # type: ignore[arg-type]
    assert seen.apiserver == (1, 30) and seen.kubelets == ((1, 30), (1, 30), (1, 28), None)
    assert [q.get("continue") for q in api.queries] == [None, "1", "2"]
    assert all(q["limit"] == NODE_PAGE for q in api.queries)


async def test_nodes_are_read_as_a_table_without_their_objects(kube):
    """The kubelets' versions come from the Table `kubectl get nodes` prints (the "Version"
    column), never from the node objects (~13 KB each with their status)."""
    for i, version in enumerate(["v1.31.2", "v1.29.4-eks-1", "v1.31.0"] * 2):
        kube.put_node(f"n{i}", kubelet_version=version)
    api = kube.kube_api("detector")
    try:
        seen = await read_versions(api)
    finally:
        await api.close()
    assert seen.kubelets == ((1, 31), (1, 29), (1, 31)) * 2
    (nodes,) = [r for r in kube.requests if r.path == "/api/v1/nodes"]
    assert nodes.query.get("includeObject") == "None" and nodes.accept == TABLE


def test_a_table_without_a_version_column_reads_as_unknown():
    table = {"kind": "Table", "columnDefinitions": [{"name": "Name"}], "rows": [{"cells": ["n0"]}, {"cells": []}]}
    assert kubelet_versions(table) == [None, None]
    moved = {"kind": "Table", "columnDefinitions": [{"name": "Version"}, {"name": "Name"}],
             "rows": [{"cells": ["v1.33.1", "n0"]}, {"cells": []}]}
    assert kubelet_versions(moved) == [(1, 33), None]


@pytest.mark.parametrize("error, words", [(KubeError(403, "nodes is forbidden"), "listing nodes is forbidden"),
                                          (KubeError(0, "connection refused"), "listing nodes failed")])
async def test_nodes_not_read_say_why(error, words):
    seen = await read_versions(PagedApi([], error))  # type: ignore[arg-type]
    assert seen.apiserver == (1, 30) and seen.kubelets is None and words in (seen.nodes_error or "")
