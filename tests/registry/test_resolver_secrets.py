"""Pull secrets read through the Kubernetes API (the in-process API double), used by the
resolver against the real registry."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from tests.support.kubedouble import KubeDouble
from tests.support.registryd import Env, shared_env
from tests.registry.test_resolver import NS, FakeClock, account, dockercfg, dockerconfigjson, pod, settings
from webhook.kube import KubeError
from webhook.rewrite._entrypoint import Lookup, UnresolvedEntrypoint
from webhook.registry._pullsecrets import CACHE_SECONDS, KubeSecretsSource
from webhook.registry._resolver import RegistryResolver


@pytest.fixture(scope="module")
def env() -> Env:
    return shared_env()


@pytest.fixture
async def kube(env: Env) -> AsyncIterator[KubeDouble]:
    async with KubeDouble() as double:
        double.put("secrets", dockerconfigjson("regcred", [env.basic.host]))
        double.put("secrets", dockercfg("legacy", [env.basic.host]))
        double.put("serviceaccounts", account("builder", ["legacy"]))
        yield double


def reads(kube: KubeDouble) -> list[str]:
    return [r.path for r in kube.requests if "/secrets/" in r.path or "/serviceaccounts/" in r.path]


@pytest.fixture
async def source(kube: KubeDouble) -> AsyncIterator[KubeSecretsSource]:
    api = kube.kube_api()
    yield KubeSecretsSource(api)
    await api.close()


async def test_source_returns_api_json(kube: KubeDouble, source: KubeSecretsSource) -> None:
    got = await source.get_secret(NS, "regcred")
    assert got["type"] == "kubernetes.io/dockerconfigjson" and ".dockerconfigjson" in got["data"]
    assert (await source.get_service_account(NS, "builder"))["imagePullSecrets"] == [{"name": "legacy"}]
    assert await source.get_secret(NS, "absent") is None
    with pytest.raises(ValueError, match="invalid object name"):
        await source.get_secret(NS, "../../kube-system/secrets/x")  # never sent
    assert not any("kube-system" in r.path for r in kube.requests)


@pytest.mark.parametrize("kwargs, expected_reads", [
    ({"pull_secrets": ["regcred"]}, [f"/api/v1/namespaces/{NS}/secrets/regcred"]),
    ({"sa": "builder"}, [f"/api/v1/namespaces/{NS}/serviceaccounts/builder", f"/api/v1/namespaces/{NS}/secrets/legacy"]),
])
async def test_resolver_reads_secrets_through_the_api(env: Env, kube: KubeDouble, source: KubeSecretsSource,
                                                      kwargs: dict, expected_reads: list[str]) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    p = pod(("clone", image), **kwargs)
    r = RegistryResolver(settings(env), secrets_source=source)
    try:
        got = await r.resolve(p, [Lookup("clone", image)])
    finally:
        await r.aclose()
    assert got[image].digest == env.images["entry"].digest
    assert reads(kube) == expected_reads


async def test_forbidden_secret_falls_back_to_anonymous(env: Env, kube: KubeDouble,
                                                        source: KubeSecretsSource) -> None:
    kube.fail_next(f"/api/v1/namespaces/{NS}/secrets/regcred", 403, message="secrets is forbidden")
    image = f"{env.basic.host}/steps/entry:v1"
    r = RegistryResolver(settings(env), secrets_source=source)
    try:
        with pytest.raises(UnresolvedEntrypoint, match="container 'clone'.*anonymously"):
            await r.resolve(pod(("clone", image), pull_secrets=["regcred"]), [Lookup("clone", image)])
    finally:
        await r.aclose()


async def test_a_builds_pods_read_their_pull_secrets_once(env: Env, kube: KubeDouble,
                                                          source: KubeSecretsSource) -> None:
    """Reviews of one build's pods, one after another: the ServiceAccount and its Secret are
    read for the first only."""
    image = f"{env.basic.host}/steps/entry:v1"
    r = RegistryResolver(settings(env), secrets_source=source)
    try:
        for _ in range(3):
            await r.resolve(pod(("clone", image), sa="builder"), [Lookup("clone", image)])
    finally:
        await r.aclose()
    assert reads(kube) == [f"/api/v1/namespaces/{NS}/serviceaccounts/builder", f"/api/v1/namespaces/{NS}/secrets/legacy"]


async def test_reads_are_kept_for_a_while_failures_not(kube: KubeDouble) -> None:
    clock, api = FakeClock(), kube.kube_api()
    source = KubeSecretsSource(api, clock=clock)
    regcred, absent = f"/api/v1/namespaces/{NS}/secrets/regcred", f"/api/v1/namespaces/{NS}/secrets/absent"
    try:
        for _ in range(2):
            assert (await source.get_secret(NS, "regcred"))["metadata"]["name"] == "regcred"
            assert await source.get_secret(NS, "absent") is None  # "absent" is an answer too
        assert reads(kube) == [regcred, absent]
        clock.now += CACHE_SECONDS - 0.1
        await source.get_secret(NS, "regcred")
        assert reads(kube) == [regcred, absent]
        clock.now += 0.1
        await source.get_secret(NS, "regcred")  # changed or deleted Secrets are seen from here
        assert reads(kube) == [regcred, absent, regcred]
        denied = f"/api/v1/namespaces/{NS}/secrets/later"
        kube.fail_next(denied, 403, message="secrets is forbidden")
        with pytest.raises(KubeError):
            await source.get_secret(NS, "later")
        assert await source.get_secret(NS, "later") is None  # asked again, not kept
        assert reads(kube)[-2:] == [denied, denied]
    finally:
        await api.close()


async def test_the_cache_keeps_the_latest_reads(kube: KubeDouble) -> None:
    """Names a pod may invent fill the cache only up to its size, the oldest going first."""
    api = kube.kube_api()
    source = KubeSecretsSource(api, cache_size=2)
    try:
        for name in ("a", "b", "c", "c", "b", "a"):
            await source.get_secret(NS, name)
    finally:
        await api.close()
    assert [r.rsplit("/", 1)[1] for r in reads(kube)] == ["a", "b", "c", "a"]
