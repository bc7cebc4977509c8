"""Image reference parsing and Docker Hub normalisation (distribution/reference rules)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from webhook.imageref import DOCKER_HUB_API, ImageRef, InvalidReference, parse

D = "sha256:" + "a" * 64


@pytest.mark.parametrize("image, registry, repository, tag, digest", [
    ("busybox", "docker.io", "library/busybox", None, None),
    ("busybox:1.36", "docker.io", "library/busybox", "1.36", None),
    ("library/busybox", "docker.io", "library/busybox", None, None),
    ("docker.io/busybox", "docker.io", "library/busybox", None, None),
    ("index.docker.io/busybox", "docker.io", "library/busybox", None, None),
    ("index.docker.io/team/app:v1", "docker.io", "team/app", "v1", None),
    ("team/app", "docker.io", "team/app", None, None),
    ("ghcr.io/org/tool:v2", "ghcr.io", "org/tool", "v2", None),
    ("localhost/app", "localhost", "app", None, None),
    ("localhost:5000/app:dev", "localhost:5000", "app", "dev", None),
    ("127.0.0.1:5000/a/b/c", "127.0.0.1:5000", "a/b/c", None, None),
    ("Registry/app", "Registry", "app", None, None),  # upper case: a host, as in distribution
    (f"busybox@{D}", "docker.io", "library/busybox", None, D),
    (f"quay.io/x/y:tag@{D}", "quay.io", "x/y", "tag", D),
    ("[::1]:5000/app", "[::1]:5000", "app", None, None),
    ("a.b/c__d/e-f.g_h", "a.b", "c__d/e-f.g_h", None, None),
])
def test_parse(image: str, registry: str, repository: str, tag: str | None, digest: str | None) -> None:
    assert parse(image) == ImageRef(registry, repository, tag, digest)


def test_reference_and_hosts() -> None:
    ref = parse("busybox")
    assert (ref.reference, ref.api_host, ref.name, str(ref)) == (
        "latest", DOCKER_HUB_API, "docker.io/library/busybox", "docker.io/library/busybox:latest")
    pinned = parse(f"quay.io/x/y:tag@{D}")
    assert pinned.reference == D  # the digest wins, as the runtimes do
    assert pinned.api_host == "quay.io"
    assert str(pinned) == f"quay.io/x/y:tag@{D}"
    assert str(parse(f"quay.io/x/y@{D}")) == f"quay.io/x/y@{D}"


@pytest.mark.parametrize("image, why", [
    ("", "empty"),
    (" busybox", "whitespace"),
    ("Busybox", "invalid repository"),
    ("team//app", "invalid repository"),
    ("app:", "invalid tag"),
    ("app:-x", "invalid tag"),
    ("app@sha256:abc", "invalid digest"),
    ("app@sha256:" + "A" * 64, "malformed sha256"),
    ("app@sha256:" + "a" * 63 + "g", "invalid digest"),
    ("ex ample.com/app", "whitespace"),
    ("-bad.com/app", "invalid registry"),
    ("a/" + "b" * 300, "longer than"),
])
def test_invalid(image: str, why: str) -> None:
    with pytest.raises(InvalidReference, match=why):
        parse(image)


# No "." in components: "a.b/c" would (rightly) make "a.b" a registry.
_component = st.from_regex(r"[a-z0-9]{1,8}(?:[_-][a-z0-9]{1,8})?", fullmatch=True)
_tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)


@settings(max_examples=60)
@given(host=st.sampled_from(["", "ghcr.io/", "127.0.0.1:5000/", "registry.example.com/"]),
       parts=st.lists(_component, min_size=1, max_size=3), tag=st.none() | _tag,
       digest=st.none() | st.binary(min_size=32, max_size=32).map(lambda b: f"sha256:{b.hex()}"))
def test_round_trip(host: str, parts: list[str], tag: str | None, digest: str | None) -> None:
    image = host + "/".join(parts) + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    ref = parse(image)
    assert str(parse(str(ref))) == str(ref)  # the canonical form is a fixed point
    assert (ref.tag, ref.digest) == (tag, digest)
    assert ref.repository.endswith("/".join(parts))
