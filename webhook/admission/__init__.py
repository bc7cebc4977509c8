"""The admission server: the FastAPI app, AdmissionReview parsing, the JSONPatch, TLS with
reload, the front door's guards, the server's certificates and the cluster's native-sidecar
detection (the namespace views it reads are webhook.kube's).

Exports load on first use (PEP 562): `initshift mutate` and `review` need the patch and the
review's constants, and must not pay for FastAPI and uvicorn, which only serving needs.
Every name is the one its module defines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "create_app": "_app", "MUTATE_PATH": "_app",
    "CompanionStopped": "_https", "HttpsServer": "_https", "ListenError": "_https", "bind": "_https",
    "run_loop": "_https", "unbracketed": "_https",
    "API_V1": "_review", "API_V1BETA1": "_review", "KIND": "_review", "BadReview": "_review",
    "Review": "_review", "parse_review": "_review", "protected": "_review", "response": "_review",
    "make_patch": "_patch",
    "TLSError": "_tls", "CertReloader": "_tls",
    "ensure_certificates": "_certs", "keep_certificates_fresh": "_certs", "ensure_local_certificates": "_certs",
    "detect_native_support": "_cluster", "NativeSupport": "_cluster",
}

__all__ = ["API_V1", "API_V1BETA1", "BadReview", "CertReloader", "CompanionStopped", "HttpsServer", "KIND", "ListenError",
           "MUTATE_PATH", "NativeSupport", "Review", "TLSError", "bind", "create_app", "detect_native_support",
           "ensure_certificates", "ensure_local_certificates", "keep_certificates_fresh", "make_patch",
           "parse_review", "protected", "response", "run_loop", "unbracketed"]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from ._app import MUTATE_PATH, create_app
    from ._certs import ensure_certificates, ensure_local_certificates, keep_certificates_fresh
    from ._cluster import NativeSupport, detect_native_support
    from ._https import CompanionStopped, HttpsServer, ListenError, bind, run_loop, unbracketed
    from ._patch import make_patch
    from ._review import API_V1, API_V1BETA1, KIND, BadReview, Review, parse_review, protected, response
    from ._tls import CertReloader, TLSError
