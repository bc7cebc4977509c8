"""Image entrypoint lookup: image references, kubelet-style credentials, an OCI distribution
client, and the cached, coalescing resolver the admission server calls."""

from ._credentials import credentials_for
from ..imageref import InvalidReference
from ._resolver import RegistryResolver, make_resolver

__all__ = ["InvalidReference", "RegistryResolver", "credentials_for", "make_resolver"]
