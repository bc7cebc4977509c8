"""Pull Secrets and ServiceAccounts read from the Kubernetes API (only with
INITSHIFT_REGISTRY_PULL_SECRETS on: it needs `get` on secrets and serviceaccounts)."""

from __future__ import annotations

import collections
import re
import time
from typing import Callable

from ..kube import KubeApi

# Each object read is kept this long: a build's reviews, one per pod and often many at once,
# read the same Secrets and ServiceAccount. A changed or deleted Secret is seen within it.
CACHE_SECONDS = 10.0
# Objects kept at most (the oldest read goes first): reads of names a pod may invent are
# bounded by this, not by how many reviews come within CACHE_SECONDS.
CACHE_SIZE = 1024

# RFC 1123 subdomain: the names Secrets and ServiceAccounts can have. Pods are validated
# after mutating webhooks, so a name like "../../x" must be refused here, not by the API.
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class KubeSecretsSource:
    """`get_secret` / `get_service_account` as the API returns them; None when absent.
    The API client is built on first use (in-cluster config, else kubeconfig). Answers,
    "absent" included, are kept CACHE_SECONDS; a failed read is not kept (the next review
    asks again, e.g. once RBAC allows it)."""

    def __init__(self, api: KubeApi | None = None, *, clock: Callable[[], float] = time.monotonic,
                 cache_size: int = CACHE_SIZE) -> None:
        self._api = api
        self._owned = api is None
        self._clock, self._cache_size = clock, cache_size
        self._cache: collections.OrderedDict[tuple[str, str, str], tuple[float, dict | None]] = \
            collections.OrderedDict()

    async def _client(self) -> KubeApi:
        if self._api is None:
            self._api = await KubeApi.from_config()
        return self._api

    async def _get(self, kind: str, namespace: str, name: str) -> dict | None:
        for value in (namespace, name):
            if len(value) > 253 or not _NAME_RE.fullmatch(value):
                raise ValueError(f"invalid object name {value!r}")
        key = (kind, namespace, name)
        kept = self._cache.get(key)
        if kept is not None and kept[0] > self._clock():
            return kept[1]
        api = await self._client()
        found = await (api.get_secret if kind == "secrets" else api.get_service_account)(namespace, name)
        self._cache.pop(key, None)
        self._cache[key] = (self._clock() + CACHE_SECONDS, found)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return found

    async def get_secret(self, namespace: str, name: str) -> dict | None:
        return await self._get("secrets", namespace, name)

    async def get_service_account(self, namespace: str, name: str) -> dict | None:
        return await self._get("serviceaccounts", namespace, name)

    async def aclose(self) -> None:
        if self._owned and self._api is not None:
            await self._api.close()
            self._api = None
