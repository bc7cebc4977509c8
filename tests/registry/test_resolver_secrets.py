"""Pull secrets read through the Kubernetes API (the in-process API double), used by the
resolver against the real registry."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from tests.support.kubedouble import KubeDouble
from tests.support.registryd import Env, shared_env
from tests.registry.test_resolver import NS, account, dockercfg, dockerconfigjson, pod, settings
from webhook.rewrite._entrypoint import Lookup, UnresolvedEntrypoint
from webhook.registry._pullsecrets import KubeSecretsSource
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
