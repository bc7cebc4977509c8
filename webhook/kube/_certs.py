"""The two Kubernetes objects certificates touch: the serving Secret, and the
MutatingWebhookConfiguration's `caBundle`. Calls go through webhook.kube.KubeApi (the
project's one narrow API module), speaking plain dicts.
"""

from __future__ import annotations

import base64

from cryptography import x509

from ._api import ADMISSION, KubeApi, KubeError, object_path

from certs import pki, store

_CONFLICT_RETRIES = 5

__all__ = ["read_secret", "read_secret_versioned", "write_secret", "read_ca_bundle", "inject_ca_bundle"]


def _secrets(namespace: str, name: str | None = None) -> str:
    return object_path("secrets", namespace, name)


def _webhook_config(name: str) -> str:
    return object_path("mutatingwebhookconfigurations", None, name, api=ADMISSION)


async def read_secret_versioned(api: KubeApi, namespace: str, name: str) -> tuple[dict[str, str] | None, str]:
    """The Secret's `data` (base64 values) and resourceVersion; (None, "") when it does not exist."""
    secret = await api.get_secret(namespace, name)
    if secret is None:
        return None, ""
    data = secret.get("data")
    version = str((secret.get("metadata") or {}).get("resourceVersion") or "")
    return (dict(data) if isinstance(data, dict) else {}), version


async def read_secret(api: KubeApi, namespace: str, name: str) -> dict[str, str] | None:
    """The Secret's `data` (base64 values), or None when it does not exist."""
    return (await read_secret_versioned(api, namespace, name))[0]


async def write_secret(api: KubeApi, namespace: str, name: str, data: dict[str, str], *,
                       create_only: bool = False, resource_version: str = "") -> bool:
    """Create the `kubernetes.io/tls` Secret, or replace its data if it exists.

    `create_only`: return False instead of overwriting a Secret someone else just created.
    `resource_version`: the version the caller read; the update is conditional on it, and a
    Secret another replica changed since is left alone (False), so two replicas rotating at
    once never overwrite each other.
    """
    body = {"apiVersion": "v1", "kind": "Secret", "type": store.SECRET_TYPE, "data": data,
            "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "initshift"}}}
    try:
        await api.request("POST", _secrets(namespace), body=body)
        return True
    except KubeError as e:
        if not e.conflict:
            raise
    if create_only:
        return False
    # The whole of `data`, not merged into what is there: a key left from before (the
    # self-managed server's ca.key beside another CA's ca.crt) would pair a CA with a key
    # that is not its own. A resourceVersion in the patched object is the apiserver's
    # precondition (409 when the Secret changed since it was read).
    patch = [{"op": "add", "path": "/data", "value": data}]
    if resource_version:
        patch.append({"op": "add", "path": "/metadata/resourceVersion", "value": resource_version})
    try:
        await api.request("PATCH", _secrets(namespace, name), body=patch,
                          content_type="application/json-patch+json")
    except KubeError as e:
        if resource_version and e.conflict:
            return False
        raise
    return True


def _bundle_of(webhook: dict) -> bytes:
    raw = (webhook.get("clientConfig") or {}).get("caBundle")
    if not raw:
        return b""
    try:
        return base64.b64decode(raw)
    except ValueError:
        return b""


async def read_ca_bundle(api: KubeApi, name: str) -> list[x509.Certificate]:
    """Every CA the configuration's webhooks trust today (empty if it has none yet)."""
    mwc = await api.request("GET", _webhook_config(name))
    out: list[x509.Certificate] = []
    for wh in (mwc or {}).get("webhooks") or []:
        try:
            out += pki.load_certs(_bundle_of(wh))
        except pki.PKIError:
            continue  # a garbage bundle is replaced, not trusted
    return out


async def inject_ca_bundle(api: KubeApi, name: str, bundle_pem: bytes) -> int:
    """Set `caBundle` on every webhook of the configuration; returns how many changed.

    Read-modify-replace with the resourceVersion, so a concurrent edit is never lost.
    """
    encoded = base64.b64encode(bundle_pem).decode()
    for _ in range(_CONFLICT_RETRIES):
        mwc = await api.request("GET", _webhook_config(name))
        hooks = (mwc or {}).get("webhooks") or []
        if not hooks:
            raise KubeError(0, f"MutatingWebhookConfiguration {name} has no webhooks")
        changed = 0
        for wh in hooks:
            cc = wh.setdefault("clientConfig", {})
            if cc.get("caBundle") != encoded:
                cc["caBundle"] = encoded
                changed += 1
        if not changed:
            return 0
        try:
            await api.request("PUT", _webhook_config(name), body=mwc)
            return changed
        except KubeError as e:
            if not e.conflict:  # someone else wrote in between: read again
                raise
    raise KubeError(0, f"MutatingWebhookConfiguration {name}: still conflicting after {_CONFLICT_RETRIES} tries")
