"""The one narrow module of Kubernetes API calls: a small async client over kubeconfig or the
in-cluster service account (found as kubectl finds them, `_config.py`), and the two objects
certificates touch (the serving Secret and the MutatingWebhookConfiguration's caBundle)."""

from ._api import KubeApi, KubeError
from ._certs import inject_ca_bundle, read_ca_bundle, read_secret, read_secret_versioned, write_secret

__all__ = ["KubeApi", "KubeError", "inject_ca_bundle", "read_ca_bundle", "read_secret", "read_secret_versioned",
           "write_secret"]
