"""A small async client of the OCI distribution API: manifests and config blobs only.

It speaks what an entrypoint lookup needs: tags and digests, OCI indexes and Docker
manifest lists, Docker schema 2 and OCI manifests, the anonymous or credentialed Bearer
token flow driven by `WWW-Authenticate`, and Basic auth. Every body is size-capped and
every content-addressed body is checked against its digest, so a cache keyed by digest
can trust what it stores.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Iterable

import certifi
import httpx

from ._credentials import Credential
from ..rewrite import ImageConfig
from ..imageref import ImageRef
from ..errors import InitshiftError, connect_reason
from certs import pki

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
_ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))

_MANIFEST_LIMIT = 4 * 1024 * 1024  # the limit containerd puts on manifests
_CONFIG_LIMIT = 8 * 1024 * 1024
_DIGEST_HEADER = "Docker-Content-Digest"
_TOKEN_DEFAULT_SECONDS = 60  # the distribution token spec's default lifetime
_TOKEN_CACHE_SIZE = 1024


class RegistryError(InitshiftError):
    """A lookup failed; the message is one line fit for a user."""


class NotFound(RegistryError):
    pass


class AuthDenied(RegistryError):
    pass


class Unreachable(RegistryError):
    pass


class BadResponse(RegistryError):
    pass


@dataclass(frozen=True)
class _Reply:
    status_code: int
    headers: httpx.Headers
    content: bytes


@dataclass(frozen=True)
class Manifest:
    media_type: str
    digest: str
    body: dict[str, Any]


def platform_key(platform: dict[str, Any]) -> str | None:
    """`os/arch` or `os/arch/variant`; None for attestation or unknown entries."""
    os_, arch = platform.get("os") or "", platform.get("architecture") or ""
    if not os_ or not arch or os_ == "unknown" or arch == "unknown":
        return None
    variant = platform.get("variant") or ""
    return f"{os_}/{arch}/{variant}" if variant else f"{os_}/{arch}"


def image_config(blob: dict[str, Any]) -> tuple[str | None, ImageConfig]:
    """(platform key, ImageConfig) from an image configuration blob."""
    config = blob.get("config") or {}
    if not isinstance(config, dict):
        raise BadResponse("image configuration has a malformed `config` object")
    return platform_key(blob), ImageConfig(_argv(config.get("Entrypoint")), _argv(config.get("Cmd")))


def _argv(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise BadResponse("image configuration has a non-string Entrypoint or Cmd")
    return tuple(value) or None


def _digest_of(body: bytes, algorithm: str = "sha256") -> str:
    try:
        return f"{algorithm}:{hashlib.new(algorithm, body).hexdigest()}"
    except ValueError:
        raise BadResponse(f"unsupported digest algorithm {algorithm!r}") from None


_AUTH_ITEM_RE = re.compile(r'[\s,]*([A-Za-z0-9_.!#$%&\'*+^`|~-]+)(?:\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]*)))?')


def parse_challenges(header: str) -> dict[str, dict[str, str]]:
    """`WWW-Authenticate` -> {scheme (lower-case): {param (lower-case): value}}.
    A bare word starts a challenge; `name=value` items are its parameters."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    pos = 0
    while pos < len(header):
        m = _AUTH_ITEM_RE.match(header, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        name, quoted, bare = m.group(1), m.group(2), m.group(3)
        if quoted is None and bare is None:
            current = out.setdefault(name.lower(), {})
        elif current is not None:
            value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
            current.setdefault(name.lower(), value)
    return out


def _make_ssl_context(ca_file: str = "") -> ssl.SSLContext:
    """System (certifi) roots plus the configured extra CA bundle."""
    ctx = ssl.create_default_context(cafile=certifi.where())
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except ssl.SSLError:  # OpenSSL's `[X509: ...] (_ssl.c:N)`: said in words
            raise OSError(f"INITSHIFT_REGISTRY_CA_FILE {ca_file!r}: {_no_ca(ca_file)}") from None
        except OSError as e:
            raise OSError(f"INITSHIFT_REGISTRY_CA_FILE {ca_file!r}: {e.strerror or e}") from None
    return ctx


def _no_ca(path: str) -> str:
    """Why OpenSSL found no CA certificate in `path`."""
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as e:  # replaced since OpenSSL read it
        return e.strerror or str(e)
    return pki.cert_problem(pem) or "OpenSSL refuses it"


class RegistryClient:
    """One shared httpx client for every registry; bearer tokens cached per scope."""

    def __init__(self, *, ca_file: str = "", insecure: Iterable[str] = (), timeout: float = 10.0,
                 user_agent: str = "initshift") -> None:
        self._insecure = frozenset(insecure)
        self._http = httpx.AsyncClient(
            verify=_make_ssl_context(ca_file), timeout=httpx.Timeout(timeout), follow_redirects=True,
            headers={"User-Agent": user_agent}, trust_env=False)
        self._tokens: dict[tuple[str, str, str], tuple[str, float]] = {}
        # (host, credential) pairs whose registry answered with a Basic challenge: later
        # requests send the credentials at once instead of collecting a 401 each time.
        self._basic: set[tuple[str, str]] = set()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _base(self, ref: ImageRef) -> str:
        scheme = "http" if ref.registry in self._insecure or ref.api_host in self._insecure else "https"
        return f"{scheme}://{ref.api_host}/v2/{ref.repository}"

    async def head_digest(self, ref: ImageRef, reference: str, cred: Credential | None) -> str | None:
        """The manifest digest a tag points to, by HEAD (which Docker Hub does not count
        against pull limits); None when the registry does not say."""
        resp = await self._request("HEAD", f"{self._base(ref)}/manifests/{reference}", ref, cred,
                                   {"Accept": _ACCEPT}, limit=0)
        self._check(resp, ref, f"manifest {reference}", cred)
        digest = resp.headers.get(_DIGEST_HEADER)
        return digest if digest and ":" in digest else None

    async def manifest(self, ref: ImageRef, reference: str, cred: Credential | None) -> Manifest:
        resp = await self._request("GET", f"{self._base(ref)}/manifests/{reference}", ref, cred,
                                   {"Accept": _ACCEPT}, limit=_MANIFEST_LIMIT)
        self._check(resp, ref, f"manifest {reference}", cred)
        body = resp.content
        algorithm = reference.partition(":")[0] if ":" in reference else "sha256"
        digest = _digest_of(body, algorithm)
        if ":" in reference and digest != reference:
            raise BadResponse(f"registry {ref.registry} returned a manifest whose digest is not {reference}")
        if ":" not in reference and resp.headers.get(_DIGEST_HEADER, digest) != digest:
            raise BadResponse(f"registry {ref.registry} returned a manifest that does not match its digest header")
        doc = _json(body, f"manifest {reference} of {ref.name}")
        media_type = doc.get("mediaType") or resp.headers.get("Content-Type", "").split(";")[0].strip()
        if media_type not in INDEX_TYPES | MANIFEST_TYPES:
            if "manifests" in doc:
                media_type = OCI_INDEX
            elif "config" in doc and doc.get("schemaVersion") == 2:
                media_type = OCI_MANIFEST
            else:
                raise BadResponse(f"manifest {reference} of {ref.name} has unsupported type {media_type or 'unknown'!r}"
                                  " (schema 1 manifests are not supported)")
        return Manifest(media_type, digest, doc)

    async def config(self, ref: ImageRef, digest: str, cred: Credential | None) -> dict[str, Any]:
        resp = await self._request("GET", f"{self._base(ref)}/blobs/{digest}", ref, cred, {}, limit=_CONFIG_LIMIT)
        self._check(resp, ref, f"config blob {digest}", cred)
        if _digest_of(resp.content, digest.partition(":")[0]) != digest:
            raise BadResponse(f"registry {ref.registry} returned a config blob whose digest is not {digest}")
        return _json(resp.content, f"config blob {digest} of {ref.name}")

    # --- transport and auth -------------------------------------------------------------

    async def _request(self, method: str, url: str, ref: ImageRef, cred: Credential | None,
                       headers: dict[str, str], *, limit: int) -> _Reply:
        scope = f"repository:{ref.repository}:pull"
        token_key = (ref.api_host, scope, cred.fingerprint if cred else "")
        basic_key = (ref.api_host, token_key[2])
        auth = self._cached_token(token_key)
        if not auth and cred is not None and basic_key in self._basic:
            auth = {"Authorization": _basic(cred)}  # the registry asked for Basic before
        resp = await self._send(method, url, ref, {**headers, **auth}, limit)
        if resp.status_code != 401 or auth.get("Authorization", "").startswith("Basic "):
            return resp
        challenges = parse_challenges(resp.headers.get("WWW-Authenticate", ""))
        if "bearer" in challenges:
            token = await self._token(ref, challenges["bearer"], scope, cred, token_key)
            auth = {"Authorization": f"Bearer {token}"}
        elif "basic" in challenges and cred is not None:
            auth = {"Authorization": _basic(cred)}
            self._basic.add(basic_key)
        else:
            return resp  # anonymous against Basic, or an unknown scheme: 401 stands
        return await self._send(method, url, ref, {**headers, **auth}, limit)

    def _cached_token(self, key: tuple[str, str, str]) -> dict[str, str]:
        hit = self._tokens.get(key)
        if hit and hit[1] > time.monotonic():
            return {"Authorization": f"Bearer {hit[0]}"}
        self._tokens.pop(key, None)
        return {}

    async def _token(self, ref: ImageRef, challenge: dict[str, str], scope: str, cred: Credential | None,
                     key: tuple[str, str, str]) -> str:
        realm = challenge.get("realm")
        if not realm:
            raise AuthDenied(f"registry {ref.registry} asked for a Bearer token without a realm")
        realm_url = httpx.URL(realm)
        if cred is not None and realm_url.scheme != "https" and realm_url.netloc.decode() not in self._insecure:
            raise AuthDenied(f"registry {ref.registry} asked to send credentials to {realm} over plain HTTP; "
                             f"list {realm_url.netloc.decode()} in INITSHIFT_REGISTRY_INSECURE to allow it")
        params = {"scope": challenge.get("scope") or scope}
        if challenge.get("service"):
            params["service"] = challenge["service"]
        auth = httpx.BasicAuth(cred.username, cred.password) if cred else None
        try:
            resp = await self._http.get(realm_url, params=params, auth=auth)
        except httpx.HTTPError as e:
            raise Unreachable(f"token service {realm} of registry {ref.registry} is unreachable: {_why(e)}") from None
        if resp.status_code in (401, 403):
            raise AuthDenied(f"token service of registry {ref.registry} refused a token {_who(cred)} ({resp.status_code})")
        if resp.status_code != 200:
            raise BadResponse(f"token service {realm} of registry {ref.registry} answered {resp.status_code}")
        doc = _json(resp.content, f"token from {realm}")
        token = doc.get("token") or doc.get("access_token")
        if not isinstance(token, str) or not token:
            raise BadResponse(f"token service {realm} of registry {ref.registry} returned no token")
        lifetime = doc.get("expires_in")
        lifetime = lifetime if isinstance(lifetime, (int, float)) and lifetime > 0 else _TOKEN_DEFAULT_SECONDS
        # Renew a little early so a token does not expire between check and use.
        now = time.monotonic()
        if len(self._tokens) >= _TOKEN_CACHE_SIZE:  # bounded: drop the expired, else start over
            self._tokens = {k: v for k, v in self._tokens.items() if v[1] > now}
            if len(self._tokens) >= _TOKEN_CACHE_SIZE:
                self._tokens.clear()
        self._tokens[key] = (token, now + max(lifetime - 5, 1))
        return token

    async def _send(self, method: str, url: str, ref: ImageRef, headers: dict[str, str], limit: int) -> _Reply:
        cap = max(limit, 64 * 1024)  # error bodies are read too, for their message
        try:
            async with self._http.stream(method, url, headers=headers) as resp:
                declared = resp.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise BadResponse(f"registry {ref.registry} sent a body larger than {cap} bytes for {url}")
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > cap:
                        raise BadResponse(f"registry {ref.registry} sent a body larger than {cap} bytes for {url}")
                return _Reply(resp.status_code, resp.headers, bytes(body))
        except httpx.HTTPError as e:
            raise Unreachable(f"registry {ref.registry} is unreachable: {_why(e)}") from None

    @staticmethod
    def _check(resp: _Reply, ref: ImageRef, what: str, cred: Credential | None) -> None:
        if resp.status_code == 200:
            return
        detail = _error_detail(resp)
        if resp.status_code in (401, 403):
            raise AuthDenied(f"registry {ref.registry} denied pulling {ref.repository} {_who(cred)} "
                             f"({resp.status_code}{detail})")
        if resp.status_code == 404:
            raise NotFound(f"{what} of {ref.name} not found ({resp.status_code}{detail})")
        if resp.status_code == 429:
            raise Unreachable(f"registry {ref.registry} is rate-limiting requests (429{detail})")
        raise BadResponse(f"registry {ref.registry} answered {resp.status_code} for {what} of {ref.name}{detail}")


def _who(cred: Credential | None) -> str:
    if cred is None:
        return "anonymously (no matching pull secret)"
    return f"with the credentials of {cred.source}" if cred.source else "with the given credentials"


def _basic(cred: Credential) -> str:
    return "Basic " + base64.b64encode(f"{cred.username}:{cred.password}".encode()).decode()


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise BadResponse(f"{what} is not valid JSON") from None
    if not isinstance(doc, dict):
        raise BadResponse(f"{what} is not a JSON object")
    return doc


def _error_detail(resp: _Reply) -> str:
    """`: CODE message` from a distribution error body, when there is one."""
    try:
        errors = json.loads(resp.content or b"{}").get("errors") or []
        first = errors[0]
        return f": {first.get('code', '')} {first.get('message', '')}".rstrip()
    except (ValueError, AttributeError, IndexError, TypeError):
        return ""


def _why(e: BaseException) -> str:
    """A short reason for a transport error (httpx's messages are often empty)."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"TLS certificate not trusted ({cause.verify_message}); set INITSHIFT_REGISTRY_CA_FILE"
        if isinstance(cause, (socket.gaierror, ConnectionError)):  # the words the Kubernetes client uses
            return connect_reason(cause)
        cause = cause.__cause__ or cause.__context__
    text = str(e).strip()
    if isinstance(e, httpx.TimeoutException):
        return f"timed out ({type(e).__name__})"
    return text or type(e).__name__
