"""Registry lookups through the real HTTPS server: a step without `command` gets its
image's ENTRYPOINT from a real registry, for an ordinary review (worked on the event loop)
and for a large one (worked on its lane's thread, the lookups on the loop between)."""

from __future__ import annotations

import copy
import dataclasses
import json

import httpx
import pytest

from tests.support import https_helpers as h
from tests.support.fixtures import pods
from tests.support.registryd import Env, shared_env
from waiter import protocol as p
from webhook.admission import _review as admission
from webhook.settings import RegistrySettings
from tests.support.patching import apply_patch, decode_patch


@pytest.fixture(scope="module")
def env() -> Env:
    return shared_env()


def _job(image: str, pad: int) -> dict:
    pod = copy.deepcopy(pods.catalogue()["job-istio"])
    step = next(c for c in pod["spec"]["initContainers"] if c["name"] == "git-clone")
    step["image"] = image
    step.pop("command")
    step.pop("args")
    if pad:  # over INLINE_MAX_BYTES and INITSHIFT_LARGE_REVIEW_BYTES: the large lane
        step.setdefault("env", []).append({"name": "PAD", "value": "x" * pad})
    return pod


@pytest.mark.parametrize("pad", [0, 300 * 1024], ids=["ordinary", "large"])
def test_a_step_without_command_is_resolved_through_the_server(env, tmp_path, pad):
    ca = h.make_certs(tmp_path)
    settings = dataclasses.replace(h.settings_for(tmp_path), registry=RegistrySettings(
        lookup=True, ca_file=str(env.pki.ca_file), budget_seconds=10))
    from webhook.registry import make_resolver

    pod = _job(f"{env.bearer.host}/public/tool", pad)
    body = json.dumps(h.review(pod, namespace="builds")).encode()
    assert (len(body) > 300 * 1024) == bool(pad)
    with h.running(settings, resolver=make_resolver(settings)) as srv, \
            httpx.Client(verify=h.client_context(ca), timeout=30) as c:
        r = c.post(f"{h.base_url(srv)}/mutate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    out = apply_patch(pod, decode_patch(r.json()))
    assert out["metadata"]["labels"].get(p.LABEL_MANAGED) == p.MODE_WAITER, r.json()["response"]
    step = next(s for s in out["spec"]["containers"] if s["name"] == "git-clone")
    argv = [*step["command"], *step.get("args", [])]
    assert argv[0] == p.WAITER_PATH and argv[-2:] == [p.ARGV_SEPARATOR, "/bin/tool"]
