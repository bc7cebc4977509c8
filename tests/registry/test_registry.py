"""The OCI distribution client against a real registry (Distribution 2.8, TLS, htpasswd
or token auth)."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from tests.support.registryd import PASSWORD, USER, Env, free_port, shared_env
from webhook.registry import _client as oci
from webhook.registry._credentials import Credential
from webhook.rewrite._entrypoint import ImageConfig
from webhook.imageref import parse

GOOD = Credential(USER, PASSWORD, "secret build/regcred")
BAD = Credential(USER, "wrong", "secret build/stale")


@pytest.fixture(scope="module")
def env() -> Env:
    return shared_env()


@pytest.fixture
async def client(env: Env) -> AsyncIterator[oci.RegistryClient]:
    c = oci.RegistryClient(ca_file=str(env.pki.ca_file), timeout=10)
    yield c
    await c.aclose()


def test_parse_challenges() -> None:
    got = oci.parse_challenges('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
                               'scope="repository:library/ubuntu:pull,push", Basic realm="a \\"q\\" b"')
    assert got == {"bearer": {"realm": "https://auth.docker.io/token", "service": "registry.docker.io",
                              "scope": "repository:library/ubuntu:pull,push"},
                   "basic": {"realm": 'a "q" b'}}
    assert oci.parse_challenges('basic realm=x') == {"basic": {"realm": "x"}}
    assert oci.parse_challenges("") == {}


def test_platform_key() -> None:
    assert oci.platform_key({"os": "linux", "architecture": "arm64", "variant": "v8"}) == "linux/arm64/v8"
    assert oci.platform_key({"os": "linux", "architecture": "amd64"}) == "linux/amd64"
    assert oci.platform_key({"os": "unknown", "architecture": "unknown"}) is None
    assert oci.platform_key({}) is None


def test_image_config_rejects_non_strings() -> None:
    with pytest.raises(oci.BadResponse, match="non-string"):
        oci.image_config({"config": {"Entrypoint": "/bin/sh -c"}})
    assert oci.image_config({"os": "linux", "architecture": "amd64", "config": {"Entrypoint": [], "Cmd": None}}) \
        == ("linux/amd64", ImageConfig(None, None))


async def test_basic_auth_manifest_and_config(env: Env, client: oci.RegistryClient) -> None:
    ref = parse(f"{env.basic.host}/steps/both:v1")
    assert await client.head_digest(ref, "v1", GOOD) == env.images["both"].digest
    m = await client.manifest(ref, "v1", GOOD)
    assert (m.media_type, m.digest) == (oci.OCI_MANIFEST, env.images["both"].digest)
    blob = await client.config(ref, m.body["config"]["digest"], GOOD)
    assert oci.image_config(blob) == ("linux/amd64", ImageConfig(("/bin/tini", "--"), ("/bin/build", "--all")))
    by_digest = await client.manifest(ref, env.images["both"].digest, GOOD)
    assert by_digest.body == m.body


@pytest.mark.parametrize("name, media_type", [("multi", oci.OCI_INDEX), ("multi-list", oci.DOCKER_LIST)])
async def test_index_types(env: Env, client: oci.RegistryClient, name: str, media_type: str) -> None:
    tag = "v1" if name == "multi" else "list"
    m = await client.manifest(parse(f"{env.basic.host}/steps/multi:{tag}"), tag, GOOD)
    assert m.media_type == media_type and m.digest == env.images[name].digest
    assert len(m.body["manifests"]) >= 2


async def test_wrong_password_is_denied(env: Env, client: oci.RegistryClient) -> None:
    with pytest.raises(oci.AuthDenied, match=r"denied pulling steps/entry with the credentials of secret build/stale"):
        await client.manifest(parse(f"{env.basic.host}/steps/entry:v1"), "v1", BAD)


async def test_anonymous_against_basic_is_denied(env: Env, client: oci.RegistryClient) -> None:
    with pytest.raises(oci.AuthDenied, match="anonymously"):
        await client.head_digest(parse(f"{env.basic.host}/steps/entry:v1"), "v1", None)


async def test_missing_tag_and_repository(env: Env, client: oci.RegistryClient) -> None:
    with pytest.raises(oci.NotFound, match="manifest nope of .*/steps/entry not found \\(404"):
        await client.manifest(parse(f"{env.basic.host}/steps/entry:nope"), "nope", GOOD)
    with pytest.raises(oci.NotFound, match="MANIFEST_UNKNOWN|NAME_UNKNOWN"):
        await client.manifest(parse(f"{env.basic.host}/no/such"), "latest", GOOD)


async def test_bearer_anonymous_pull_of_public_repository(env: Env, client: oci.RegistryClient) -> None:
    ref = parse(f"{env.bearer.host}/public/tool")
    before = env.tokens.requests
    m = await client.manifest(ref, "latest", None)
    assert m.digest == env.images["public"].digest
    await client.config(ref, m.body["config"]["digest"], None)
    assert env.tokens.requests == before + 1  # the token is reused within its lifetime


async def test_bearer_with_credentials(env: Env, client: oci.RegistryClient) -> None:
    ref = parse(f"{env.bearer.host}/steps/cmd:v1")
    assert await client.head_digest(ref, "v1", GOOD) == env.images["cmd"].digest
    with pytest.raises(oci.AuthDenied, match="anonymously"):
        await client.head_digest(ref, "v1", None)  # token without access: the registry says 401
    with pytest.raises(oci.AuthDenied, match="token service .* refused a token with the credentials of secret"):
        await client.head_digest(ref, "v1", BAD)


async def test_untrusted_certificate(env: Env) -> None:
    c = oci.RegistryClient(timeout=5)  # system roots only
    try:
        with pytest.raises(oci.Unreachable, match="not trusted.*INITSHIFT_REGISTRY_CA_FILE"):
            await c.head_digest(parse(f"{env.basic.host}/steps/entry:v1"), "v1", GOOD)
    finally:
        await c.aclose()


async def test_connection_refused(client: oci.RegistryClient) -> None:
    with pytest.raises(oci.Unreachable, match="unreachable: connection refused"):
        await client.manifest(parse(f"127.0.0.1:{free_port()}/x/y:v1"), "v1", None)


async def test_a_registry_whose_name_does_not_resolve_says_so_in_words(client: oci.RegistryClient) -> None:
    """Not Python's `[Errno -2] Name or service not known` (.invalid never resolves: RFC 6761)."""
    with pytest.raises(oci.Unreachable) as e:
        await client.manifest(parse("registry.nonexistent.invalid/x/y:v1"), "v1", None)
    assert str(e.value) == "registry registry.nonexistent.invalid is unreachable: the name does not resolve"


async def test_plain_http_for_insecure_registries(env: Env) -> None:
    proxy = env.proxy(tls=False)
    ref = parse(f"{proxy.host}/steps/entry:v1")
    c = oci.RegistryClient(insecure=[proxy.host], timeout=10)
    try:
        assert await c.head_digest(ref, "v1", GOOD) == env.images["entry"].digest
    finally:
        await c.aclose()
    assert proxy.count() == 2  # 401 challenge, then the request with Basic auth
