"""Image entrypoint lookup: image references, kubelet-style credentials, an OCI distribution
client, and the cached, coalescing resolver the admission server calls."""

from ._resolver import RegistryResolver, make_resolver

__all__ = ["RegistryResolver", "make_resolver"]
