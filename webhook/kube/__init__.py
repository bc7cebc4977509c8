"""The one narrow module of Kubernetes API calls: a small async client over kubeconfig or the
in-cluster service account (found as kubectl finds them, `_config.py`), the two objects
certificates touch (the serving Secret and the MutatingWebhookConfiguration's caBundle), the
cluster's versions that native-sidecar detection reads (`read_versions`), and the list of
what the server calls, as RBAC attributes (`server_access`)."""

from ._access import ALWAYS, NODE_VERSIONS, PULL_SECRETS, SELF_MANAGED_CERTS, Access, server_access
from ._api import KubeApi, KubeError
from ._certs import inject_ca_bundle, read_ca_bundle, read_secret, read_secret_versioned, write_secret
from ._config import use_config
from ._versions import ClusterVersions, read_versions

__all__ = ["ALWAYS", "Access", "ClusterVersions", "KubeApi", "KubeError", "NODE_VERSIONS", "PULL_SECRETS",
           "SELF_MANAGED_CERTS", "inject_ca_bundle", "read_ca_bundle", "read_secret", "read_secret_versioned",
           "read_versions", "server_access", "use_config", "write_secret"]
