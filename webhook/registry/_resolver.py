"""The registry-backed EntrypointResolver: cache, coalescing, budget and pull secrets.

`resolve(pod, lookups)` maps every looked-up image, keyed exactly as written in the pod,
to its per-platform ENTRYPOINT/CMD. The whole call runs inside
`INITSHIFT_REGISTRY_BUDGET_SECONDS`, so the apiserver never waits on a slow registry.

Caching: a manifest digest's result never changes, so it is kept until evicted (LRU,
`INITSHIFT_REGISTRY_CACHE_SIZE` entries shared with tags); a tag's digest is kept for
`INITSHIFT_REGISTRY_TAG_TTL_SECONDS`. Every entry is scoped to the credential that
fetched it, so a pod never learns a private image's entrypoint through another pod's
pull secret. Concurrent lookups of the same image with the same credential share one
in-flight fetch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Hashable, Mapping, Protocol, Sequence

from .. import imageref
from ._credentials import Credential, Keyring, keyring_from_secrets
from ._platform import narrow, platform_filter
from ..rewrite import ImageConfig, ImageEntrypoints, Lookup, UnresolvedEntrypoint
from ._client import (INDEX_TYPES, MANIFEST_TYPES, AuthDenied, BadResponse, Manifest, RegistryClient, RegistryError,
    image_config, platform_key)
from ..settings import RegistrySettings, Settings

log = logging.getLogger("initshift.registry")

_ATTESTATION = ("vnd.docker.reference.type", "attestation-manifest")
_UNKNOWN_PLATFORM = "unknown"  # a single manifest whose config names no os/architecture


class _SecretsSource(Protocol):
    """Reads pull Secrets and ServiceAccounts as the API returns them (data base64)."""

    async def get_secret(self, namespace: str, name: str) -> dict | None: ...

    async def get_service_account(self, namespace: str, name: str) -> dict | None: ...


class _LRUCache:
    """A bounded map; the least recently used entry goes first."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self._data: OrderedDict[Hashable, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Hashable) -> Any:
        if key not in self._data:
            return None
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key: Hashable, value: Any) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def pop(self, key: Hashable) -> None:
        self._data.pop(key, None)


class RegistryResolver:
    """EntrypointResolver over the OCI distribution API."""

    def __init__(self, settings: RegistrySettings, *, secrets_source: _SecretsSource | None = None,
                 client: RegistryClient | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._secrets = secrets_source if settings.pull_secrets else None
        # One request never needs longer than the whole budget.
        self._client = client or RegistryClient(ca_file=settings.ca_file, insecure=settings.insecure_registries,
                                                timeout=max(settings.budget_seconds, 0.1))
        self._cache = _LRUCache(settings.cache_size)
        self._inflight: dict[tuple[str, str], asyncio.Task[ImageEntrypoints]] = {}
        self._clock = clock

    async def aclose(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        await self._client.aclose()
        closer = getattr(self._secrets, "aclose", None)
        if closer is not None:
            await closer()

    async def resolve(self, pod: Mapping, lookups: Sequence[Lookup], *,
                      namespace: str | None = None) -> dict[str, ImageEntrypoints]:
        """Each image of `lookups` -> its entrypoints, or raise UnresolvedEntrypoint naming
        the first container that needs the image. `namespace` overrides the pod's own
        (an AdmissionReview's pod often has none; the request carries it)."""
        containers: dict[str, str] = {}
        for item in lookups:
            containers.setdefault(item.image, item.container)
        refs: dict[str, imageref.ImageRef] = {}
        for image, container in containers.items():
            try:
                refs[image] = imageref.parse(image)
            except imageref.InvalidReference as e:
                raise UnresolvedEntrypoint(container, image, str(e)) from None
        if not refs:
            return {}
        done: dict[str, ImageEntrypoints] = {}
        budget = self.settings.budget_seconds

        async def one(image: str) -> None:
            try:
                done[image] = await self._lookup(refs[image], keyring)
            except RegistryError as e:
                raise UnresolvedEntrypoint(containers[image], image, str(e)) from None

        keyring: Keyring | None = None
        try:
            async with asyncio.timeout(budget):
                keyring = await self._keyring(pod, namespace)
                await _gather_all([one(image) for image in refs])
        except TimeoutError:
            image = next(i for i in refs if i not in done)
            raise UnresolvedEntrypoint(containers[image], image, f"timed out after {budget:g}s") from None
        fits = platform_filter(pod)
        return {image: narrow(entry, fits) for image, entry in done.items()}

    # --- credentials ------------------------------------------------------------------

    async def _keyring(self, pod: Mapping, namespace: str | None) -> Keyring | None:
        """The pod's pull secrets, or, when it lists none, its ServiceAccount's (what the
        ServiceAccount admission plugin would have copied into the pod)."""
        if self._secrets is None:
            return None
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        ns = namespace or meta.get("namespace")
        if not ns:
            return None
        names = _names(spec.get("imagePullSecrets"))
        if not names:
            account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
            sa = await self._read(self._secrets.get_service_account, ns, account, "serviceaccount")
            names = _names((sa or {}).get("imagePullSecrets"))
        secrets = await asyncio.gather(*(self._read(self._secrets.get_secret, ns, n, "secret") for n in names))
        ring, problems = keyring_from_secrets(s for s in secrets if s)
        for problem in problems:
            log.warning("pull secret skipped: %s", problem)
        return ring

    @staticmethod
    async def _read(get: Callable[[str, str], Awaitable[dict | None]], ns: str, name: str, kind: str) -> dict | None:
        # The kubelet pulls without a missing or unreadable secret; so do we.
        try:
            found = await get(ns, name)
        except Exception as e:  # noqa: BLE001 - any API failure means "no credentials from it"
            log.warning("cannot read %s %s/%s: %s", kind, ns, name, e)
            return None
        if found is None:
            log.info("%s %s/%s not found", kind, ns, name)
        return found

    # --- lookups ------------------------------------------------------------------------

    async def _lookup(self, ref: imageref.ImageRef, keyring: Keyring | None) -> ImageEntrypoints:
        """Try each matching credential in the kubelet's order; anonymous when none match."""
        candidates: list[Credential | None] = list(keyring.lookup(ref.name)) if keyring else []
        denied: AuthDenied | None = None
        for cred in candidates or [None]:
            try:
                return await self._coalesced(ref, cred)
            except AuthDenied as e:
                denied = e
        assert denied is not None
        raise denied

    async def _coalesced(self, ref: imageref.ImageRef, cred: Credential | None) -> ImageEntrypoints:
        key = (str(ref), cred.fingerprint if cred else "")
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._fetch(ref, cred))
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        # Shielded: one caller's budget running out must not cancel the others' fetch.
        return await asyncio.shield(task)

    def _finished(self, key: tuple[str, str], task: asyncio.Task) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: a fetch every caller gave up on logs nothing

    async def _fetch(self, ref: imageref.ImageRef, cred: Credential | None) -> ImageEntrypoints:
        # A fetch nobody waits for any more still ends within one budget.
        async with asyncio.timeout(self.settings.budget_seconds):
            scope = cred.fingerprint if cred else ""
            if ref.digest:
                return await self._by_digest(ref, ref.digest, cred, scope)
            tag_key = ("tag", ref.api_host, ref.repository, ref.reference, scope)
            hit = self._cache.get(tag_key)
            if hit is not None and hit[1] > self._clock():
                return await self._by_digest(ref, hit[0], cred, scope)
            manifest: Manifest | None = None
            digest = await self._client.head_digest(ref, ref.reference, cred)
            if digest is None:  # the registry did not say: read the manifest itself
                manifest = await self._client.manifest(ref, ref.reference, cred)
                digest = manifest.digest
            result = await self._by_digest(ref, digest, cred, scope, manifest)
            self._cache.put(tag_key, (digest, self._clock() + self.settings.tag_ttl_seconds))
            return result

    async def _by_digest(self, ref: imageref.ImageRef, digest: str, cred: Credential | None, scope: str,
                         manifest: Manifest | None = None) -> ImageEntrypoints:
        key = ("digest", ref.api_host, ref.repository, digest, scope)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        m = manifest or await self._client.manifest(ref, digest, cred)
        if m.media_type in INDEX_TYPES:
            entries = _platform_entries(m)
            children = await _gather_all([self._by_digest(ref, d, cred, scope) for _, d in entries])
            by_platform = {pkey: _only(child, ref) for (pkey, _), child in zip(entries, children)}
        else:
            config = m.body.get("config") or {}
            if not isinstance(config, dict) or not isinstance(config.get("digest"), str):
                raise BadResponse(f"manifest {digest} of {ref.name} names no config blob")
            pkey, cfg = image_config(await self._client.config(ref, config["digest"], cred))
            by_platform = {pkey or _UNKNOWN_PLATFORM: cfg}
        result = ImageEntrypoints(by_platform, digest)
        self._cache.put(key, result)
        return result


def _platform_entries(index: Manifest) -> list[tuple[str, str]]:
    """(platform key, manifest digest) of an index's images, first entry per platform;
    attestations, unknown platforms and nested indexes are skipped."""
    out: dict[str, str] = {}
    for item in index.body.get("manifests") or []:
        if not isinstance(item, dict) or not isinstance(item.get("digest"), str):
            continue
        annotations = item.get("annotations") or {}
        if annotations.get(_ATTESTATION[0]) == _ATTESTATION[1]:
            continue
        if item.get("mediaType") and item["mediaType"] not in MANIFEST_TYPES:
            continue
        key = platform_key(item.get("platform") or {})
        if key is not None:
            out.setdefault(key, item["digest"])
    if not out:
        raise BadResponse(f"image index {index.digest} lists no image for a known platform")
    return list(out.items())


def _only(child: ImageEntrypoints, ref: imageref.ImageRef) -> ImageConfig:
    if len(child.by_platform) != 1:
        raise BadResponse(f"index entry {child.digest} of {ref.name} is not a single image")
    return next(iter(child.by_platform.values()))


def _names(refs: Any) -> list[str]:
    out: list[str] = []
    for item in refs or []:
        name = item.get("name") if isinstance(item, dict) else None
        if name and name not in out:
            out.append(name)
    return out


async def _gather_all(aws: list[Awaitable[Any]]) -> list[Any]:
    """gather that cancels the siblings when one fails, so no request outlives its lookup."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def make_resolver(settings: Settings, *, secrets_source: _SecretsSource | None = None) -> RegistryResolver | None:
    """The resolver the settings ask for; None when registry lookups are off. With pull
    secrets on and no source given, Secrets are read through the in-cluster API."""
    reg = settings.registry
    if not reg.lookup:
        return None
    if reg.pull_secrets and secrets_source is None:
        from ._pullsecrets import KubeSecretsSource
        secrets_source = KubeSecretsSource()
    return RegistryResolver(reg, secrets_source=secrets_source)
