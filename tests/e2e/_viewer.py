"""A user granted exactly what the docs list for initshift's tools, and nothing more:
docs/install.md ("Verify the install": `check`, `check --smoke`, the port-forward from
outside the cluster) and docs/cli.md ("Seeing a rewritten pod": `status`, `logs`). "Read"
there is get, list and watch. The e2e runs the tools with its token; a verb they need that
the docs do not name shows as a Forbidden line or exit code."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from ._env import Env
from ._install import NAMESPACE
from ._kube import token_kubeconfig

_READ = ["get", "list", "watch"]
CLUSTER_RULES = [
    {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations",
     "validatingadmissionpolicies", "validatingadmissionpolicybindings"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": _READ},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]
INSTALL_RULES = [  # in initshift's namespace
    {"apiGroups": [""], "resources": ["services", "pods"], "verbs": _READ},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": _READ},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": _READ},
    {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["get"]},
]
BUILDS_RULES = [  # in the namespace of the builds: --smoke's pods, then status and logs
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]
_RBAC = "/apis/rbac.authorization.k8s.io/v1"
ACCOUNT = "viewer"


@contextlib.contextmanager
def viewer(env: Env, builds: str) -> Iterator[Path]:
    """A kubeconfig of ServiceAccount `viewer` in namespace `builds`, granted the rules above;
    its roles outside `builds` are deleted afterwards (`builds` goes with the scenario)."""
    name = f"e2e-viewer-{env.run}-{builds}"[:63]
    env.kube.create(f"/api/v1/namespaces/{builds}/serviceaccounts", {"metadata": {"name": ACCOUNT}})
    made: list[str] = []
    try:
        for where, rules in (("", CLUSTER_RULES), (f"/namespaces/{NAMESPACE}", INSTALL_RULES),
                             (f"/namespaces/{builds}", BUILDS_RULES)):
            kind = "Role" if where else "ClusterRole"
            made += [f"{_RBAC}{where}/{kind.lower()}s/{name}", f"{_RBAC}{where}/{kind.lower()}bindings/{name}"]
            env.kube.create(f"{_RBAC}{where}/{kind.lower()}s", {"metadata": {"name": name}, "rules": rules})
            env.kube.create(f"{_RBAC}{where}/{kind.lower()}bindings", {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
                "subjects": [{"kind": "ServiceAccount", "namespace": builds, "name": ACCOUNT}]})
        yield token_kubeconfig(env.admin, builds, ACCOUNT, env.admin.with_name(f"{ACCOUNT}-{builds}.kubeconfig"))
    finally:
        for path in made:
            env.kube.delete(path)

