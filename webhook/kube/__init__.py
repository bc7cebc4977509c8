"""The one package of Kubernetes API calls: a small async client over kubeconfig or the
in-cluster service account (found as kubectl finds them, `_config.py`), informers (client-go's
reflector, `_informer.py`) and the views of LimitRanges, ResourceQuotas and Namespaces the
server keeps with them (`_views.py`), the two objects certificates touch (the serving Secret
and the MutatingWebhookConfiguration's caBundle), the cluster's versions that native-sidecar
detection reads (`read_versions`), a port-forward to a pod (`PortForward`: `initshift check`'s
way in from outside the cluster), and the list of what the server calls, as RBAC attributes
(`server_access`)."""

from ._access import ALWAYS, NODE_VERSIONS, PULL_SECRETS, SELF_MANAGED_CERTS, Access, server_access
from ._api import KubeApi, KubeError, StreamCut
from ._certs import inject_ca_bundle, read_ca_bundle, read_secret, read_secret_versioned, write_secret
from ._config import use_config
from ._informer import BACKOFF_CAP, Backoff, Informer, rv_of
from ._portforward import PortForward
from ._versions import ClusterVersions, read_versions
from ._views import LimitRanges, Namespaces, NamespaceView, ResourceQuotas

__all__ = ["ALWAYS", "Access", "BACKOFF_CAP", "Backoff", "ClusterVersions", "Informer", "KubeApi", "KubeError",
           "LimitRanges", "NODE_VERSIONS", "Namespaces", "NamespaceView", "PULL_SECRETS", "PortForward",
           "ResourceQuotas", "SELF_MANAGED_CERTS", "StreamCut", "inject_ca_bundle",
           "read_ca_bundle", "read_secret", "read_secret_versioned", "read_versions", "rv_of", "server_access",
           "use_config", "write_secret"]
