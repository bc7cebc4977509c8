"""Registry credentials from pull Secrets, matched to images the way the kubelet does.

Mirrors the kubelet's keyring (pkg/credentialprovider/keyring.go) so the webhook sees
exactly the credentials the node would pull with:
- a key may carry a scheme (dropped), a path (a prefix of the image's repository path;
  `/v1/` and `/v2/` mean the bare host), `*` globs per host label (`*.example.com`
  matches `a.example.com`, not `a.b.example.com`), and a port that must match exactly;
- keys are tried in reverse lexical order, so `quay.io/team` wins over `quay.io`;
- `index.docker.io` credentials (e.g. `https://index.docker.io/v1/`) serve Docker Hub
  images when no key matched them directly.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from .. import imageref
from ..errors import InitshiftError

_SECRET_TYPE_DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"
_SECRET_TYPE_DOCKERCFG = "kubernetes.io/dockercfg"
_KEY_DOCKERCONFIGJSON = ".dockerconfigjson"
_KEY_DOCKERCFG = ".dockercfg"
_DEFAULT_REGISTRY_HOST = "index.docker.io"


class CredentialError(InitshiftError, ValueError):
    """A Secret's docker config cannot be read; the message names the Secret."""


@dataclass(frozen=True)
class Credential:
    username: str
    password: str = field(repr=False)
    source: str = ""  # e.g. "secret ns/name", for messages only

    @property
    def fingerprint(self) -> str:
        """Stable, non-reversible identity: cache keys never hold the secret itself."""
        raw = f"{self.username}\0{self.password}".encode()
        return hashlib.sha256(raw).hexdigest()[:16]


class Keyring:
    """Credentials indexed by registry key; `lookup(image)` returns them most specific first."""

    def __init__(self) -> None:
        self._creds: dict[str, list[Credential]] = {}

    def __bool__(self) -> bool:
        return bool(self._creds)

    def add(self, config: Mapping[str, Mapping[str, Any]], source: str = "") -> None:
        """Add one docker config (`{"registry": {"auth"|"username"/"password": ...}}`)."""
        for location, entry in config.items():
            cred = _entry_credential(entry, source)
            if cred is None:
                continue
            key = _key(location)
            if key and cred not in self._creds.setdefault(key, []):
                self._creds[key].append(cred)

    def lookup(self, image: str) -> list[Credential]:
        """Credentials for an image name such as `docker.io/library/busybox` or
        `registry.example.com:5000/team/app`, in the order the kubelet tries them."""
        out: list[Credential] = []
        for key in sorted(self._creds, reverse=True):
            if urls_match(key, image):
                out.extend(c for c in self._creds[key] if c not in out)
        if not out and is_default_registry_match(image):
            out = list(self._creds.get(_DEFAULT_REGISTRY_HOST, ()))
        return out


def _key(location: str) -> str:
    value = location if location.startswith(("https://", "http://")) else f"https://{location}"
    try:
        parsed = urlsplit(value)
        host = parsed.netloc
    except ValueError:
        return ""
    path = parsed.path
    if path.startswith(("/v2/", "/v1/")):
        path = path[3:]
    return host + path if path and path != "/" else host


def _split(schemeless: str) -> tuple[list[str], str, str]:
    """(host labels, port, path) of a scheme-less URL such as `host:5000/a/b`."""
    try:
        parsed = urlsplit(f"dummy://{schemeless}")
        netloc, path = parsed.netloc, parsed.path
    except ValueError:
        return [], "", ""
    host, port = netloc, ""
    if netloc.startswith("["):  # [v6]:port; brackets dropped as net.SplitHostPort does
        end = netloc.find("]")
        host, rest = netloc[1:end], netloc[end + 1:]
        port = rest[1:] if rest.startswith(":") else ""
    elif ":" in netloc:
        host, _, port = netloc.rpartition(":")
    return host.split("."), port, path


def urls_match(glob: str, target: str) -> bool:
    """The kubelet's URLsMatchStr: per-label globs, equal ports, path prefix."""
    glob_parts, glob_port, glob_path = _split(glob)
    target_parts, target_port, target_path = _split(target)
    if glob_port != target_port or len(glob_parts) != len(target_parts):
        return False
    if not target_path.startswith(glob_path):
        return False
    # filepath.Match semantics: case-sensitive glob per label.
    return all(fnmatch.fnmatchcase(t, g) for g, t in zip(glob_parts, target_parts))


def is_default_registry_match(image: str) -> bool:
    """Whether `image` pulls from Docker Hub (the kubelet's isDefaultRegistryMatch)."""
    first, sep, _ = image.partition("/")
    if not first:
        return False
    if not sep or first in ("docker.io", _DEFAULT_REGISTRY_HOST):
        return True
    return not any(c in first for c in ".:")


def _entry_credential(entry: Any, source: str) -> Credential | None:
    if not isinstance(entry, Mapping):
        raise CredentialError(f"{source}: registry entry is not an object")
    # What the kubelet reads of an entry (pkg/credentialprovider's dockerConfigEntryWithAuth):
    # an `identitytoken` or `registrytoken` is ignored by it, so here too.
    username = entry.get("username") or ""
    password = entry.get("password") or ""
    auth = entry.get("auth")
    if auth:
        try:
            decoded = base64.b64decode(str(auth), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialError(f"{source}: `auth` is not base64 of user:password") from None
        username, sep, password = decoded.partition(":")
        if not sep:
            raise CredentialError(f"{source}: `auth` does not hold user:password")
    if not username and not password:
        return None
    return Credential(str(username), str(password), source)


def docker_config(secret: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `{registry: entry}` map of a Secret as the API returns it (data base64);
    None for Secrets of other types. Raise CredentialError on a broken pull Secret."""
    source = _source(secret)
    kind = secret.get("type")
    data = secret.get("data") or {}
    if kind == _SECRET_TYPE_DOCKERCONFIGJSON:
        doc = _decode(data, _KEY_DOCKERCONFIGJSON, source)
        auths = doc.get("auths") if isinstance(doc, dict) else None
        if not isinstance(auths, dict):
            raise CredentialError(f"{source}: {_KEY_DOCKERCONFIGJSON} has no `auths` object")
        return auths
    if kind == _SECRET_TYPE_DOCKERCFG:
        doc = _decode(data, _KEY_DOCKERCFG, source)
        if not isinstance(doc, dict):
            raise CredentialError(f"{source}: {_KEY_DOCKERCFG} is not an object")
        return doc
    return None


def _source(secret: Mapping[str, Any]) -> str:
    meta = secret.get("metadata") or {}
    return f"secret {meta.get('namespace', '')}/{meta.get('name', '')}"


def _decode(data: Mapping[str, str], key: str, source: str) -> Any:
    raw = data.get(key)
    if not raw:
        raise CredentialError(f"{source}: missing data key {key}")
    try:
        return json.loads(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError):
        raise CredentialError(f"{source}: {key} is not base64-encoded JSON") from None


def keyring_from_secrets(secrets: Iterable[Mapping[str, Any]]) -> tuple[Keyring, list[str]]:
    """A keyring from Secrets, in order, and one message per Secret that was skipped."""
    ring, problems = Keyring(), []
    for secret in secrets:
        try:
            config = docker_config(secret)
            if config is not None:
                ring.add(config, _source(secret))
        except CredentialError as e:
            problems.append(str(e))
    return ring, problems


def credentials_for(image: str, secrets: Iterable[Mapping[str, Any]]) -> tuple[list[Credential], list[str]]:
    """What the kubelet tries when it pulls `image` with these pull Secrets (most specific
    first), and one message per Secret it skips (broken, or not of a pull Secret's type).
    InvalidReference for a malformed image."""
    secrets = list(secrets)
    ring, problems = keyring_from_secrets(secrets)
    problems += [f"{_source(s)} is of type {s.get('type') or 'Opaque'}, not {_SECRET_TYPE_DOCKERCONFIGJSON}"
                 for s in secrets if s.get("type") not in (_SECRET_TYPE_DOCKERCONFIGJSON, _SECRET_TYPE_DOCKERCFG)]
    return ring.lookup(imageref.parse(image).name), problems
