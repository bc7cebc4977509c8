"""Pull-secret parsing and kubelet-style registry matching."""

from __future__ import annotations

import base64
import json

import pytest

from webhook.registry._credentials import (CredentialError, Credential, Keyring, docker_config,
    is_default_registry_match, keyring_from_secrets, urls_match)


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def secret(name: str, auths: dict, *, kind: str = "kubernetes.io/dockerconfigjson", ns: str = "build") -> dict:
    """A Secret as the API returns it: data values base64."""
    if kind == "kubernetes.io/dockerconfigjson":
        key, doc = ".dockerconfigjson", {"auths": auths}
    else:
        key, doc = ".dockercfg", auths
    return {"apiVersion": "v1", "kind": "Secret", "type": kind, "metadata": {"name": name, "namespace": ns},
            "data": {key: base64.b64encode(json.dumps(doc).encode()).decode()}}


def ring(**keys: str) -> Keyring:
    """A keyring whose password for each key is the key's own label."""
    r = Keyring()
    for label, key in keys.items():
        r.add({key: {"username": "u", "password": label}})
    return r


def passwords(r: Keyring, image: str) -> list[str]:
    return [c.password for c in r.lookup(image)]


@pytest.mark.parametrize("glob, target, match", [
    ("registry.example.com", "registry.example.com/team/app", True),
    ("registry.example.com", "other.example.com/team/app", False),
    ("*.example.com", "registry.example.com/app", True),
    ("*.example.com", "a.registry.example.com/app", False),  # one label per *
    ("*.*.com", "a.example.com/app", True),
    ("registry.example.com:5000", "registry.example.com:5000/app", True),
    ("registry.example.com:5000", "registry.example.com/app", False),  # ports must match
    ("registry.example.com", "registry.example.com:5000/app", False),
    ("registry.example.com/team", "registry.example.com/team/app", True),
    ("registry.example.com/team", "registry.example.com/other/app", False),
    ("registry.example.com/team/app", "registry.example.com/team", False),
    ("prefix.*.io", "prefix.gcr.io/x", True),
    ("[::1]:5000", "[::1]:5000/app", True),
])
def test_urls_match(glob: str, target: str, match: bool) -> None:
    assert urls_match(glob, target) is match


def test_most_specific_key_first() -> None:
    r = ring(host="quay.io", team="quay.io/team", app="quay.io/team/app", star="*.io", other="quay.io/other")
    # Reverse lexical order, as the kubelet's index: longer paths of the same host first.
    assert passwords(r, "quay.io/team/app") == ["app", "team", "host", "star"]
    assert passwords(r, "quay.io/x/y") == ["host", "star"]
    assert passwords(r, "gcr.io/x") == ["star"]


def test_schemes_and_v1_v2_paths_are_the_bare_host() -> None:
    r = ring(a="https://reg.example.com/v2/", b="http://other.example.com/v1/", c="https://third.example.com/")
    assert passwords(r, "reg.example.com/app") == ["a"]
    assert passwords(r, "other.example.com/app") == ["b"]
    assert passwords(r, "third.example.com/x/y") == ["c"]


@pytest.mark.parametrize("key", ["https://index.docker.io/v1/", "index.docker.io", "docker.io"])
def test_docker_hub_aliases(key: str) -> None:
    r = ring(hub=key)
    assert passwords(r, "docker.io/library/busybox") == ["hub"]
    assert passwords(r, "docker.io/team/app") == ["hub"]
    assert passwords(r, "ghcr.io/team/app") == []


def test_default_registry_match() -> None:
    assert is_default_registry_match("busybox")
    assert is_default_registry_match("library/busybox")
    assert is_default_registry_match("docker.io/library/busybox")
    assert is_default_registry_match("index.docker.io/x/y")
    assert not is_default_registry_match("ghcr.io/x/y")
    assert not is_default_registry_match("localhost:5000/x")
    assert not is_default_registry_match("/x")


def test_auth_field_overrides_username_password() -> None:
    r = Keyring()
    r.add({"reg.io": {"username": "ignored", "password": "ignored", "auth": _auth("real", "pw:with:colons")}})
    assert r.lookup("reg.io/app") == [Credential("real", "pw:with:colons")]


@pytest.mark.parametrize("entry", [{"email": "a@b.c"}, {"identitytoken": "refresh-token"},
                                   {"registrytoken": "bearer-token", "email": "a@b.c"}])
def test_entries_without_credentials_are_skipped(entry: dict) -> None:
    # The kubelet reads username, password, email and auth of a pull Secret's entry, nothing
    # else: with only a token it pulls anonymously, and so does the lookup.
    r = Keyring()
    r.add({"reg.io": entry})
    assert not r and r.lookup("reg.io/app") == []


def test_secrets_of_both_types_in_order() -> None:
    secrets = [
        secret("json", {"reg.io": {"auth": _auth("a", "1")}}),
        secret("cfg", {"https://reg.io": {"username": "b", "password": "2"}}, kind="kubernetes.io/dockercfg"),
        {"type": "Opaque", "metadata": {"name": "other"}, "data": {"x": "eA=="}},
    ]
    r, problems = keyring_from_secrets(secrets)
    assert problems == []
    assert [(c.username, c.source) for c in r.lookup("reg.io/app")] == [("a", "secret build/json"),
                                                                       ("b", "secret build/cfg")]


@pytest.mark.parametrize("broken, why", [
    ({"type": "kubernetes.io/dockerconfigjson", "data": {}}, "missing data key .dockerconfigjson"),
    ({"type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "!!"}}, "not base64"),
    ({"type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": base64.b64encode(b"[]").decode()}},
     "no `auths`"),
    ({"type": "kubernetes.io/dockercfg", "data": {".dockercfg": base64.b64encode(b"[1]").decode()}},
     "not an object"),
])
def test_broken_secrets_are_reported_not_fatal(broken: dict, why: str) -> None:
    broken = {**broken, "metadata": {"name": "bad", "namespace": "build"}}
    good = secret("good", {"reg.io": {"auth": _auth("a", "1")}})
    r, problems = keyring_from_secrets([broken, good])
    assert len(problems) == 1 and why in problems[0] and "secret build/bad" in problems[0]
    assert [c.username for c in r.lookup("reg.io/x")] == ["a"]


def test_bad_auth_field() -> None:
    with pytest.raises(CredentialError, match="user:password"):
        Keyring().add(docker_config(secret("s", {"reg.io": {"auth": base64.b64encode(b"nocolon").decode()}})))


def test_fingerprint_hides_the_password() -> None:
    c = Credential("user", "hunter2")
    assert "hunter2" not in c.fingerprint and "hunter2" not in repr(c)
    assert c.fingerprint != Credential("user", "hunter3").fingerprint
