"""Pull Secrets and ServiceAccounts read from the Kubernetes API (only with
INITSHIFT_REGISTRY_PULL_SECRETS on: it needs `get` on secrets and serviceaccounts)."""

from __future__ import annotations

import re

from ..kube import KubeApi, KubeError

# RFC 1123 subdomain: the names Secrets and ServiceAccounts can have. Pods are validated
# after mutating webhooks, so a name like "../../x" must be refused here, not by the API.
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class KubeSecretsSource:
    """`get_secret` / `get_service_account` as the API returns them; None when absent.
    The API client is built on first use (in-cluster config, else kubeconfig)."""

    def __init__(self, api: KubeApi | None = None) -> None:
        self._api = api
        self._owned = api is None

    async def _client(self) -> KubeApi:
        if self._api is None:
            self._api = await KubeApi.from_config()
        return self._api

    async def _get(self, kind: str, namespace: str, name: str) -> dict | None:
        for value in (namespace, name):
            if len(value) > 253 or not _NAME_RE.fullmatch(value):
                raise ValueError(f"invalid object name {value!r}")
        path = f"/api/v1/namespaces/{namespace}/{kind}/{name}"
        api = await self._client()
        try:
            return await api.request("GET", path)
        except KubeError as e:
            if e.not_found:
                return None
            raise

    async def get_secret(self, namespace: str, name: str) -> dict | None:
        return await self._get("secrets", namespace, name)

    async def get_service_account(self, namespace: str, name: str) -> dict | None:
        return await self._get("serviceaccounts", namespace, name)

    async def aclose(self) -> None:
        if self._owned and self._api is not None:
            await self._api.close()
            self._api = None
