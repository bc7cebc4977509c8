"""Fuzz: 2,000+ random and mutated reviews against the ASGI app in-process. Whatever
arrives, the answer is a 200 AdmissionReview with the request's uid or a one-line 400;
never a 500, never a hang. (The table of malformed bodies hits the real server in
test_server.py.)"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import https_helpers as h
from tests.support.fixtures import pods
from webhook.admission._app import create_app

EXAMPLES = 2000
SEEDS = [
    h.review(h.kpack_istio(), namespace="builds"),
    h.review(pods.inject_linkerd(pods.load("job-git-clone")), namespace="jobs"),
    h.review(pods.inject_istio(pods.load("tekton-taskrun")), namespace="ci"),
    h.review(pods.without_init(h.kpack_istio()), namespace="builds"),
]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=False,
                    allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                           max_leaves=12)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


SEED_PATHS = [_paths(s) for s in SEEDS]


@st.composite
def mutated_reviews(draw) -> bytes:
    i = draw(st.integers(0, len(SEEDS) - 1))
    doc = copy.deepcopy(SEEDS[i])
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(SEED_PATHS[i]))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or retyped this path
    return json.dumps(doc).encode()


@st.composite
def random_reviews(draw) -> bytes:
    request = draw(st.dictionaries(st.sampled_from(["uid", "kind", "operation", "object", "namespace", "dryRun",
                                                    "resource", "subResource", "name"]), json_values, max_size=9))
    doc = {"apiVersion": draw(st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1", "v1", ""])),
           "kind": draw(st.sampled_from(["AdmissionReview", "Pod"])), "request": request}
    if draw(st.booleans()):
        doc = draw(json_values)
    return json.dumps(doc).encode()


@st.composite
def raw_bodies(draw) -> bytes:
    good = json.dumps(draw(st.sampled_from(SEEDS))).encode()
    return draw(st.one_of(st.binary(max_size=200), st.builds(lambda n: good[:n], st.integers(0, len(good)))))


# Shapes a real apiserver never sends but a direct client can (issue 24): each answered
# with a decision or a 400, never "internal error".
ODD_SHAPES = [("metadata", "labels", "x"), ("metadata", "labels", ["a"]), ("metadata", "labels", [None]),
              ("metadata", "annotations", {"a": "\udfff"}), ("metadata", "annotations", ["a"]),
              ("spec", [None]), ("spec", "x"), ("spec", 7), ("metadata", "x"), ("spec", "initContainers", "x"),
              ("spec", "initContainers", [None]), ("spec", "containers", {"a": 1})]


@st.composite
def odd_reviews(draw) -> bytes:
    doc = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    *path, value = draw(st.sampled_from(ODD_SHAPES))
    node = doc["request"]["object"]
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):  # the seed has it as another type: left as it is
            break
    else:
        node[path[-1]] = copy.deepcopy(value)
    # Not UTF-8 (UTF-16 and UTF-32, which json.loads would guess): a 400.
    return json.dumps(doc).encode(draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "utf-32", "utf-16-le"])))


bodies = st.one_of(mutated_reviews(), mutated_reviews(), random_reviews(), raw_bodies(), odd_reviews())


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("failure_mode", ["ignore"])  # "internal error" is checked: deny would say the same
def test_fuzzed_reviews_get_200_or_400(loop, failure_mode, tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    app = create_app(h.settings_for(Path(d), failure_mode=failure_mode))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fuzz")
    seen = {200: 0, 400: 0}

    async def post(body: bytes) -> httpx.Response:
        return await asyncio.wait_for(
            client.post("/mutate", content=body, headers={"content-type": "application/json"}), 10)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(bodies)
    def check(body: bytes) -> None:
        r = loop.run_until_complete(post(body))
        assert r.status_code in (200, 400), (r.status_code, r.text[:300])
        doc = r.json()
        if r.status_code == 400:
            assert doc["error"] and "\n" not in doc["error"]
        else:
            sent = json.loads(body)
            assert doc["response"]["uid"] == sent["request"]["uid"]
            assert isinstance(doc["response"]["allowed"], bool)
            assert "internal error" not in r.text, r.text[:300]
        seen[r.status_code] += 1

    try:
        check()
    finally:
        loop.run_until_complete(client.aclose())
    assert sum(seen.values()) >= EXAMPLES
    assert seen[200] > 100 and seen[400] > 100  # both paths were really exercised
