"""The registry-backed EntrypointResolver against a real registry: Kubernetes
command/args semantics, image indexes, digests, auth failures, a registry that stops or
hangs, the time budget, the cache and coalescing."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, AsyncIterator

import pytest

from tests.support.registryd import PASSWORD, USER, Env, shared_env
from webhook.rewrite._entrypoint import ImageConfig, Lookup, UnresolvedEntrypoint, argv_by_platform, effective_argv
from webhook.registry._resolver import RegistryResolver, make_resolver
from webhook.settings import RegistrySettings, Settings

NS = "build"


class FakeClock:
    """Monotonic time the test moves by hand, for tag TTLs."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class DictSecrets:
    """Secrets and ServiceAccounts as the API returns them, with a log of what was read."""

    def __init__(self, secrets: list[dict] = (), accounts: list[dict] = ()) -> None:  # type: ignore[assignment]
        self.objects = {("secret", s["metadata"]["namespace"], s["metadata"]["name"]): s for s in secrets}
        self.objects |= {("sa", a["metadata"]["namespace"], a["metadata"]["name"]): a for a in accounts}
        self.reads: list[str] = []

    def add(self, secret: dict) -> None:
        self.objects[("secret", secret["metadata"]["namespace"], secret["metadata"]["name"])] = secret

    async def get_secret(self, namespace: str, name: str) -> dict | None:
        self.reads.append(f"secret {namespace}/{name}")
        return self.objects.get(("secret", namespace, name))

    async def get_service_account(self, namespace: str, name: str) -> dict | None:
        self.reads.append(f"sa {namespace}/{name}")
        return self.objects.get(("sa", namespace, name))


def dockerconfigjson(name: str, hosts: list[str], password: str = PASSWORD) -> dict:
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    doc = {"auths": {h: {"auth": auth} for h in hosts}}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": NS},
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(doc).encode()).decode()}}


def dockercfg(name: str, hosts: list[str]) -> dict:
    doc = {f"https://{h}": {"username": USER, "password": PASSWORD, "email": "ci@example.com"} for h in hosts}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockercfg",
            "metadata": {"name": name, "namespace": NS},
            "data": {".dockercfg": base64.b64encode(json.dumps(doc).encode()).decode()}}


def account(name: str, secrets: list[str]) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NS},
            "imagePullSecrets": [{"name": s} for s in secrets]}


def pod(*steps: tuple[str, str], pull_secrets: list[str] = (), sa: str | None = None,  # type: ignore[assignment]
        node_selector: dict | None = None, namespace: str | None = NS) -> dict:
    spec: dict[str, Any] = {"restartPolicy": "Never",
                            "initContainers": [{"name": n, "image": i} for n, i in steps],
                            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    if sa:
        spec["serviceAccountName"] = sa
    if node_selector:
        spec["nodeSelector"] = node_selector
    meta = {"name": "p", "namespace": namespace} if namespace else {"name": "p"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def lookups(p: dict) -> list[Lookup]:
    return [Lookup(c["name"], c["image"]) for c in p["spec"]["initContainers"]]


@pytest.fixture(scope="module")
def env() -> Env:
    return shared_env()


def regcred_for(secrets: DictSecrets, env: Env, *hosts: str) -> None:
    """Extend `regcred` to registries and proxies a test started (ports must match)."""
    secrets.add(dockerconfigjson("regcred", [env.basic.host, env.bearer.host, *hosts]))


@pytest.fixture
def secrets(env: Env) -> DictSecrets:
    return DictSecrets([dockerconfigjson("regcred", [env.basic.host, env.bearer.host]),
                        dockerconfigjson("stale", [env.basic.host, env.bearer.host], password="wrong"),
                        dockercfg("legacy", [env.basic.host])],
                       [account("builder", ["legacy"]), account("default", [])])


def settings(env: Env, **kw: Any) -> RegistrySettings:
    base: dict[str, Any] = {"lookup": True, "pull_secrets": True, "ca_file": str(env.pki.ca_file),
                            "budget_seconds": 10.0}
    return RegistrySettings(**(base | kw))


@pytest.fixture
async def resolver(env: Env, secrets: DictSecrets) -> AsyncIterator[RegistryResolver]:
    r = RegistryResolver(settings(env), secrets_source=secrets)
    yield r
    await r.aclose()


async def closing(r: RegistryResolver, p: dict, **kw: Any) -> dict:
    try:
        return await r.resolve(p, lookups(p), **kw)
    finally:
        await r.aclose()


# --- command/args semantics ------------------------------------------------------------------

CASES = [  # image, args, argv the container runs
    ("entry", None, ["/bin/entry", "--flag"]),
    ("entry", ["x"], ["/bin/entry", "--flag", "x"]),
    ("cmd", None, ["/bin/sh", "-c", "echo hi"]),  # no ENTRYPOINT: CMD is the executable
    ("cmd", ["x", "y"], ["x", "y"]),  # and args replace CMD
    ("both", None, ["/bin/tini", "--", "/bin/build", "--all"]),
    ("both", ["x"], ["/bin/tini", "--", "x"]),
    ("neither", None, []),  # nothing to run: the kubelet fails it, the rewrite must see it
    ("neither", ["x"], ["x"]),
]


async def test_command_args_semantics(env: Env, resolver: RegistryResolver) -> None:
    p = pod(*[(name, f"{env.basic.host}/steps/{name}:v1") for name in ("entry", "cmd", "both", "neither")],
            pull_secrets=["regcred"])
    images = await resolver.resolve(p, lookups(p))
    assert set(images) == {c["image"] for c in p["spec"]["initContainers"]}  # keyed as written
    for name, args, argv in CASES:
        image = images[f"{env.basic.host}/steps/{name}:v1"]
        assert list(image.by_platform) == ["linux/amd64"]
        container = {"name": name, "image": "x", **({"args": args} if args is not None else {})}
        assert effective_argv(container, image.by_platform["linux/amd64"]) == argv, (name, args)
        assert effective_argv({**container, "command": ["/own"]}, image.by_platform["linux/amd64"]) \
            == ["/own", *(args or [])]
    assert images[f"{env.basic.host}/steps/entry:v1"].digest == env.images["entry"].digest


@pytest.mark.parametrize("tag, name", [("v1", "multi"), ("list", "multi-list")])
async def test_index_resolves_every_platform(env: Env, resolver: RegistryResolver, tag: str, name: str) -> None:
    image = f"{env.basic.host}/steps/multi:{tag}"
    got = (await resolver.resolve(pod(("s", image), pull_secrets=["regcred"]), [Lookup("s", image)]))[image]
    assert got.digest == env.images[name].digest  # pinned to nothing: the index digest, for information
    assert got.by_platform == {"linux/amd64": ImageConfig(("/bin/amd",), ("run",)),
                               "linux/arm64/v8": ImageConfig(("/bin/arm",), ("run",))}  # attestation skipped
    assert argv_by_platform({"name": "s", "args": ["go"]}, got) == {"linux/amd64": ["/bin/amd", "go"],
                                                                    "linux/arm64/v8": ["/bin/arm", "go"]}


async def test_index_with_identical_platforms(env: Env, resolver: RegistryResolver) -> None:
    image = f"{env.basic.host}/steps/same:v1"
    got = (await resolver.resolve(pod(("s", image), pull_secrets=["regcred"]), [Lookup("s", image)]))[image]
    assert set(got.by_platform) == {"linux/amd64", "linux/arm64"}
    assert len(set(got.by_platform.values())) == 1


async def test_node_selector_and_affinity_narrow_the_platforms(env: Env, resolver: RegistryResolver) -> None:
    image = f"{env.basic.host}/steps/multi:v1"
    arm = pod(("s", image), pull_secrets=["regcred"], node_selector={"kubernetes.io/arch": "arm64"})
    assert list((await resolver.resolve(arm, lookups(arm)))[image].by_platform) == ["linux/arm64/v8"]
    # A platform the image lacks narrows nothing: the pull, not the webhook, reports it.
    s390 = pod(("s", image), pull_secrets=["regcred"], node_selector={"kubernetes.io/arch": "s390x"})
    assert len((await resolver.resolve(s390, lookups(s390)))[image].by_platform) == 2
    # Required node affinity narrows as the scheduler reads it (tests/registry/test_platform.py).
    affine = pod(("s", image), pull_secrets=["regcred"])
    affine["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "NotIn",
                                                     "values": ["amd64"]}]}]}}}
    assert list((await resolver.resolve(affine, lookups(affine)))[image].by_platform) == ["linux/arm64/v8"]


async def test_digest_references(env: Env, resolver: RegistryResolver) -> None:
    digest = env.images["both"].digest
    by_digest = f"{env.basic.host}/steps/both@{digest}"
    tag_and_digest = f"{env.basic.host}/steps/both:ignored@{digest}"
    p = pod(("a", by_digest), ("b", tag_and_digest), pull_secrets=["regcred"])
    images = await resolver.resolve(p, lookups(p))
    assert images[by_digest] == images[tag_and_digest]
    assert images[by_digest].by_platform["linux/amd64"].entrypoint == ("/bin/tini", "--")


async def test_token_registry(env: Env, resolver: RegistryResolver) -> None:
    public = f"{env.bearer.host}/public/tool"
    private = f"{env.bearer.host}/steps/cmd:v1"
    anonymous = pod(("a", public))
    assert (await resolver.resolve(anonymous, lookups(anonymous)))[public].by_platform["linux/amd64"].cmd \
        == ("/bin/tool",)
    p = pod(("b", private), pull_secrets=["regcred"])
    assert (await resolver.resolve(p, lookups(p)))[private].digest == env.images["cmd"].digest


# --- failures ---------------------------------------------------------------------------------

async def test_wrong_password(env: Env, resolver: RegistryResolver) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    with pytest.raises(UnresolvedEntrypoint) as err:
        await resolver.resolve(pod(("clone", image), pull_secrets=["stale"]), [Lookup("clone", image)])
    msg = str(err.value)
    assert "container 'clone'" in msg and repr(image) in msg and "set `command`" in msg
    assert "denied pulling steps/entry with the credentials of secret build/stale (401" in msg
    assert (err.value.container, err.value.image) == ("clone", image)


async def test_wrong_password_for_token_service(env: Env, resolver: RegistryResolver) -> None:
    image = f"{env.bearer.host}/steps/entry:v1"
    with pytest.raises(UnresolvedEntrypoint, match="refused a token with the credentials of secret build/stale"):
        await resolver.resolve(pod(("clone", image), pull_secrets=["stale"]), [Lookup("clone", image)])


async def test_next_credential_is_tried_after_a_denial(env: Env, resolver: RegistryResolver) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    p = pod(("clone", image), pull_secrets=["stale", "regcred"])  # the kubelet tries both, in order
    assert (await resolver.resolve(p, lookups(p)))[image].digest == env.images["entry"].digest


async def test_missing_tag(env: Env, resolver: RegistryResolver) -> None:
    image = f"{env.basic.host}/steps/entry:nope"
    with pytest.raises(UnresolvedEntrypoint, match=r"container 'fetch'.*manifest nope of .* not found \(404"):
        await resolver.resolve(pod(("fetch", image), pull_secrets=["regcred"]), [Lookup("fetch", image)])


async def test_invalid_reference_needs_no_network(resolver: RegistryResolver) -> None:
    with pytest.raises(UnresolvedEntrypoint, match="container 'x'.*invalid repository"):
        await resolver.resolve(pod(("x", "Not/Valid")), [Lookup("x", "127.0.0.1:1/Bad_Repo")])


async def test_error_names_the_first_container_of_the_image(env: Env, resolver: RegistryResolver) -> None:
    image = f"{env.basic.host}/steps/entry:nope"
    p = pod(("first", image), ("second", image), pull_secrets=["regcred"])
    with pytest.raises(UnresolvedEntrypoint, match="container 'first'"):
        await resolver.resolve(p, lookups(p))


async def test_registry_stopped_mid_test(env: Env, secrets: DictSecrets) -> None:
    reg = env.registry()
    regcred_for(secrets, env, reg.host)
    r = RegistryResolver(settings(env), secrets_source=secrets)
    try:
        known = f"{reg.host}/steps/entry:v1"
        assert (await r.resolve(pod(("a", known), pull_secrets=["regcred"]), [Lookup("a", known)]))[known]
        reg.stop()
        other = f"{reg.host}/steps/cmd:v1"
        with pytest.raises(UnresolvedEntrypoint, match=f"container 'b'.*{other}.*unreachable: connection refused"):
            await r.resolve(pod(("b", other), pull_secrets=["regcred"]), [Lookup("b", other)])
        # What was resolved before the outage is still served from the cache.
        again = await r.resolve(pod(("a", known), pull_secrets=["regcred"]), [Lookup("a", known)])
        assert again[known].digest == env.images["entry"].digest
    finally:
        await r.aclose()


async def test_slow_registry_beyond_the_budget(env: Env, secrets: DictSecrets) -> None:
    reg = env.registry()
    regcred_for(secrets, env, reg.host)
    reg.pause()  # accepts connections (kernel backlog), never answers
    r = RegistryResolver(settings(env, budget_seconds=0.5), secrets_source=secrets)
    image = f"{reg.host}/steps/entry:v1"
    try:
        with pytest.raises(UnresolvedEntrypoint) as err:
            # The guard only turns a hang into a failure; the budget is what must fire.
            await asyncio.wait_for(r.resolve(pod(("slow", image), pull_secrets=["regcred"]),
                                             [Lookup("slow", image)]), 30)
        assert "container 'slow'" in str(err.value) and "timed out after 0.5s" in str(err.value)
    finally:
        reg.resume()
        await r.aclose()
        reg.stop()


# --- pull secrets -----------------------------------------------------------------------------

async def test_service_account_secrets_when_the_pod_lists_none(env: Env, secrets: DictSecrets) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    got = await closing(RegistryResolver(settings(env), secrets_source=secrets), pod(("a", image), sa="builder"))
    assert got[image].digest == env.images["entry"].digest  # through the SA's dockercfg Secret
    assert secrets.reads == ["sa build/builder", "secret build/legacy"]


async def test_pod_secrets_take_precedence_over_the_service_account(env: Env, secrets: DictSecrets) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    p = pod(("a", image), pull_secrets=["regcred"], sa="builder")
    await closing(RegistryResolver(settings(env), secrets_source=secrets), p)
    assert secrets.reads == ["secret build/regcred"]  # as the kubelet: the pod's list only


async def test_missing_secret_means_anonymous(env: Env, secrets: DictSecrets) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    with pytest.raises(UnresolvedEntrypoint, match="anonymously"):
        await closing(RegistryResolver(settings(env), secrets_source=secrets), pod(("a", image), pull_secrets=["gone"]))
    assert secrets.reads == ["secret build/gone"]


async def test_pull_secrets_setting_off_reads_nothing(env: Env, secrets: DictSecrets) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    r = RegistryResolver(settings(env, pull_secrets=False), secrets_source=secrets)
    with pytest.raises(UnresolvedEntrypoint, match="anonymously"):
        await closing(r, pod(("a", image), pull_secrets=["regcred"]))
    assert secrets.reads == []


async def test_namespace_from_the_request(env: Env, secrets: DictSecrets) -> None:
    image = f"{env.basic.host}/steps/entry:v1"
    p = pod(("a", image), pull_secrets=["regcred"], namespace=None)  # as in many AdmissionReviews
    got = await closing(RegistryResolver(settings(env), secrets_source=secrets), p, namespace=NS)
    assert got[image].digest == env.images["entry"].digest


async def test_failing_secret_reads_are_not_fatal(env: Env) -> None:
    class Forbidden(DictSecrets):
        async def get_secret(self, namespace: str, name: str) -> dict | None:
            raise PermissionError("secrets is forbidden")

    image = f"{env.bearer.host}/public/tool"
    got = await closing(RegistryResolver(settings(env), secrets_source=Forbidden()), pod(("a", image),
                                                                                          pull_secrets=["x"]))
    assert got[image].digest == env.images["public"].digest


# --- cache and coalescing -----------------------------------------------------------------------

async def test_second_lookup_of_a_digest_makes_no_request(env: Env, secrets: DictSecrets) -> None:
    proxy = env.proxy()
    regcred_for(secrets, env, proxy.host)
    r = RegistryResolver(settings(env), secrets_source=secrets)
    image = f"{proxy.host}/steps/multi@{env.images['multi'].digest}"
    p = pod(("a", image), pull_secrets=["regcred"])
    try:
        first = await r.resolve(p, lookups(p))
        assert proxy.count() >= 5  # index, two manifests, two configs
        before = proxy.count()
        assert await r.resolve(p, lookups(p)) == first
        assert proxy.count() == before
    finally:
        await r.aclose()


async def test_tag_cache_expires_after_its_ttl(env: Env, secrets: DictSecrets) -> None:
    proxy, clock = env.proxy(), FakeClock()
    regcred_for(secrets, env, proxy.host)
    r = RegistryResolver(settings(env, tag_ttl_seconds=60), secrets_source=secrets, clock=clock)
    image = f"{proxy.host}/steps/entry:v1"
    p = pod(("a", image), pull_secrets=["regcred"])
    try:
        first = await r.resolve(p, lookups(p))
        n = proxy.count()
        clock.now += 59
        assert await r.resolve(p, lookups(p)) == first
        assert proxy.count() == n  # tag still fresh
        clock.now += 2
        assert await r.resolve(p, lookups(p)) == first
        assert proxy.requests[n:] == ["HEAD /v2/steps/entry/manifests/v1"]  # one HEAD; the digest is cached
    finally:
        await r.aclose()


async def test_cache_is_bounded(env: Env, secrets: DictSecrets) -> None:
    proxy = env.proxy()
    regcred_for(secrets, env, proxy.host)
    r = RegistryResolver(settings(env, cache_size=2), secrets_source=secrets)
    images = [f"{proxy.host}/steps/{n}@{env.images[n].digest}" for n in ("entry", "cmd", "both")]
    try:
        for image in images:
            await r.resolve(pod(("a", image), pull_secrets=["regcred"]), [Lookup("a", image)])
        n = proxy.count()
        await r.resolve(pod(("a", images[2]), pull_secrets=["regcred"]), [Lookup("a", images[2])])
        assert proxy.count() == n  # recent: cached
        await r.resolve(pod(("a", images[0]), pull_secrets=["regcred"]), [Lookup("a", images[0])])
        assert proxy.count() > n  # the oldest was evicted
    finally:
        await r.aclose()


async def test_cache_is_scoped_to_the_credential(env: Env, secrets: DictSecrets) -> None:
    image = f"{env.basic.host}/steps/entry@{env.images['entry'].digest}"
    r = RegistryResolver(settings(env), secrets_source=secrets)
    try:
        await r.resolve(pod(("a", image), pull_secrets=["regcred"]), [Lookup("a", image)])
        # Another pod without the secret does not learn the private image's entrypoint.
        with pytest.raises(UnresolvedEntrypoint, match="anonymously"):
            await r.resolve(pod(("b", image)), [Lookup("b", image)])
    finally:
        await r.aclose()


async def test_concurrent_lookups_coalesce(env: Env, secrets: DictSecrets) -> None:
    image_path = "steps/multi:v1"
    reference = env.proxy()
    regcred_for(secrets, env, reference.host)
    fresh = RegistryResolver(settings(env), secrets_source=secrets)
    await closing(fresh, pod(("a", f"{reference.host}/{image_path}"), pull_secrets=["regcred"]))
    single = reference.count()

    reg = env.registry()
    proxy = env.proxy(reg)
    regcred_for(secrets, env, proxy.host)
    image = f"{proxy.host}/{image_path}"
    r = RegistryResolver(settings(env), secrets_source=secrets)
    try:
        reg.pause()  # hold the first fetch in flight while the others join it
        calls = [asyncio.create_task(r.resolve(pod((f"s{i}", image), pull_secrets=["regcred"]),
                                               [Lookup(f"s{i}", image)])) for i in range(3)]
        while proxy.count() == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        reg.resume()
        results = await asyncio.gather(*calls)
        assert results[0] == results[1] == results[2]
        assert proxy.count() == single  # three lookups, the requests of one
    finally:
        reg.resume()
        await r.aclose()


# --- construction -------------------------------------------------------------------------------

async def test_make_resolver() -> None:
    assert make_resolver(Settings()) is None  # lookups are off by default
    on = Settings().replace(registry=RegistrySettings(lookup=True))
    r = make_resolver(on, secrets_source=DictSecrets())
    assert isinstance(r, RegistryResolver)
    await r.aclose()
    with_secrets = make_resolver(Settings().replace(registry=RegistrySettings(lookup=True, pull_secrets=True)))
    assert type(with_secrets._secrets).__name__ == "KubeSecretsSource"  # built lazily, no API call yet
    await with_secrets.aclose()
