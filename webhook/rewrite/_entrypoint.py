"""Kubernetes command/args semantics, and the image facts the rewrite needs for them.

A container that sets `command` runs exactly `command + args`. One that does not runs
the image's ENTRYPOINT, followed by `args` when set, else by the image's CMD; an image
without ENTRYPOINT makes the first word of CMD (or of `args`) the executable. The
waiter replaces `command`, so for containers without one the rewrite needs the image
configuration, looked up by an `EntrypointResolver` (see webhook/resolver.py) before the
pure rewrite runs and handed to it as a plain mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence
from ..errors import InitshiftError


@dataclass(frozen=True)
class ImageConfig:
    """The two fields of an OCI image configuration that decide what runs."""

    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ImageEntrypoints:
    """What one image reference runs, per platform ("os/arch" or "os/arch/variant").

    A single-platform image has one entry. `digest` is the manifest (or index) digest
    the lookup saw; it is informational: the rewrite pins nothing the user did not pin.
    """

    by_platform: Mapping[str, ImageConfig]
    digest: str = ""


@dataclass(frozen=True)
class Lookup:
    """One image the rewrite cannot handle without its configuration."""

    container: str
    image: str


class UnresolvedEntrypoint(InitshiftError):
    """The image configuration could not be found; the message names container and image."""

    def __init__(self, container: str, image: str, why: str) -> None:
        self.container, self.image, self.why = container, image, why
        super().__init__(
            f"container {container!r} has no command and the ENTRYPOINT of image {image!r} "
            f"could not be looked up ({why}); set `command` on the container"
        )


class EntrypointResolver(Protocol):
    """Resolves images for a pod; implementations cache and enforce a time budget."""

    async def resolve(self, pod: Mapping, lookups: Sequence[Lookup], *,
                      namespace: str | None = None) -> dict[str, ImageEntrypoints]:
        """Map each looked-up image reference to its entrypoints, or raise UnresolvedEntrypoint.
        `namespace`: where the pod's pull secrets are (a CREATE review's pod often has none)."""
        ...


def escape_expansion(word: str) -> str:
    """`word` as it must be written in a container's `args` to reach the process unchanged:
    the kubelet expands $(VAR) and reduces $$ to $ there, never in the image's ENTRYPOINT/CMD
    nor in a probe's path."""
    return word.replace("$", "$$")


def reduce_expansion(written: str) -> str:
    """What the process gets of a word `escape_expansion` wrote."""
    return written.replace("$$", "$")


def effective_argv(container: Mapping, config: ImageConfig | None, *, for_args: bool = False) -> list[str] | None:
    """The argv the container runs under Kubernetes semantics; None if it needs the image
    config and none was given. An empty list means nothing would run (the kubelet fails it).
    `for_args`: the words from the image escaped, for an argv written into `args`."""
    command = container.get("command")
    args = container.get("args")
    if command:
        return [*command, *(args or [])]
    if config is None:
        return None
    image = escape_expansion if for_args else str
    entry = [image(w) for w in config.entrypoint or ()]
    tail = list(args) if args else [image(w) for w in config.cmd or ()]
    return entry + tail


def needs_image(container: Mapping) -> bool:
    return not container.get("command")


def argv_by_platform(container: Mapping, image: ImageEntrypoints | None, *,
                     for_args: bool = False) -> dict[str, list[str]] | None:
    """Each platform's argv for a container without command; None when not resolved."""
    if image is None:
        return None
    out: dict[str, list[str]] = {}
    for platform, config in sorted(image.by_platform.items()):
        argv = effective_argv(container, config, for_args=for_args)
        if argv is not None:
            out[platform] = argv
    return out or None
