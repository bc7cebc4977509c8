"""Image references as the container runtime reads them.

The grammar and the Docker Hub normalisation follow distribution/reference (the code
containerd and the kubelet use): `busybox` is `docker.io/library/busybox:latest`,
`index.docker.io/x/y` is `docker.io/x/y`, and the first path component is a registry
only when it contains `.` or `:`, is `localhost`, or has upper-case letters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from .errors import InitshiftError

__all__ = ["DOCKER_HUB_API", "ImageRef", "InvalidReference", "parse"]

_DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's distribution API answers
_LEGACY_HUB = "index.docker.io"
_OFFICIAL = "library"
_DEFAULT_TAG = "latest"
_NAME_MAX = 255

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

_PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_DOMAIN_RE = re.compile(_DOMAIN)
_TAG_RE = re.compile(_TAG)
_DIGEST_RE = re.compile(_DIGEST)
# Digest lengths fixed by the algorithms the OCI spec registers.
_DIGEST_HEX_LEN = {"sha256": 64, "sha512": 128}


class InvalidReference(InitshiftError, ValueError):
    """The string is not an image reference; the message says why."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # normalised: "docker.io", "ghcr.io", "127.0.0.1:5000"
    repository: str  # "library/busybox"
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What to ask the registry for: the digest when pinned (the tag is then ignored,
        as the runtimes do), else the tag, else `latest`."""
        return self.digest or self.tag or _DEFAULT_TAG

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == _DOCKER_HUB else self.registry

    @property
    def name(self) -> str:
        """`registry/repository`: the string the kubelet matches credentials against."""
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        out = self.name
        if self.tag or not self.digest:
            out += f":{self.tag or _DEFAULT_TAG}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse(image: str) -> ImageRef:
    """Parse and normalise `image`; raise InvalidReference with a one-line reason."""
    if not isinstance(image, str) or not image:
        raise InvalidReference("empty image reference")
    if image != image.strip() or any(c.isspace() for c in image):
        raise InvalidReference(f"image reference {image!r} contains whitespace")
    rest, digest = image, None
    if "@" in rest:
        rest, _, digest = rest.partition("@")
        _check_digest(image, digest)
    tag = None
    # A tag is after the last ':' that follows the last '/', so registry ports stay put.
    colon = rest.rfind(":")
    if colon > rest.rfind("/"):
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG_RE.fullmatch(tag):
            raise InvalidReference(f"image reference {image!r} has an invalid tag {tag!r}")
    registry, path = _split_domain(rest)
    if registry is not None and not _DOMAIN_RE.fullmatch(registry):
        raise InvalidReference(f"image reference {image!r} has an invalid registry {registry!r}")
    if not _PATH_RE.fullmatch(path):
        raise InvalidReference(
            f"image reference {image!r} has an invalid repository {path!r} "
            "(lower-case letters, digits and . _ - separators only)")
    if len(rest) > _NAME_MAX:
        raise InvalidReference(f"image reference {image!r} is longer than {_NAME_MAX} characters")
    if registry is None or registry == _LEGACY_HUB:
        registry = _DOCKER_HUB
    if registry == _DOCKER_HUB and "/" not in path:
        path = f"{_OFFICIAL}/{path}"
    return ImageRef(registry, path, tag, digest)


def _split_domain(name: str) -> tuple[str | None, str]:
    first, sep, remainder = name.partition("/")
    if not sep:
        return None, name
    if any(c in first for c in ".:") or first == "localhost" or first.lower() != first:
        return first, remainder
    return None, name


def _check_digest(image: str, digest: str) -> None:
    if not _DIGEST_RE.fullmatch(digest):
        raise InvalidReference(f"image reference {image!r} has an invalid digest {digest!r}")
    algorithm, _, hexpart = digest.partition(":")
    want = _DIGEST_HEX_LEN.get(algorithm)
    if want is not None and (len(hexpart) != want or hexpart != hexpart.lower()):
        raise InvalidReference(f"image reference {image!r} has a malformed {algorithm} digest")
