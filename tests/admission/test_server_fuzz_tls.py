"""Fuzz over real TLS (issue 17): structure-aware mutations of real build pods, with the
hostile shapes the issue found (many mains, huge quantities, deep nesting, odd namespaces,
initshift's own volumes and paths mounted, watcher annotations pre-set, pods near etcd's
limit) and random JSON values at random paths, sent to the real HTTPS server on one
kept-alive connection. Fixed seed, bounded budget.

Whatever arrives: the answer is a 200 AdmissionReview or a one-line 400, never a 5xx; a
patch always applies; the patched pod fits etcd's 1.5 MiB; and when the pod sent was
valid, the pod emitted is valid (the Kubernetes schemas and the apiserver's own rules)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.admission.test_server_fuzz import ODD_SHAPES, _paths, json_values
from tests.support import https_helpers as h
from tests.support.fixtures import pods
from tests.support.podvalidate import OLDEST, assert_valid_pod
from waiter import protocol as p
from webhook.admission import _review as admission
from tests.support.patching import apply_patch, decode_patch
from webhook.cli._review import wrap
from webhook.rewrite._podcheck import MAX_OBJECT_BYTES, object_bytes, pod_problems

EXAMPLES = 200
UID = "00000000-0000-4000-8000-000000000017"
CATALOGUE = pods.catalogue()
NAMES = sorted(CATALOGUE)

HOSTILE_QUANTITIES = ["1e3000000", "1" * 5000, "9" * 19, "8Ei", "-1", "0.0000000001", "1e-9999", 2**70, 1e300,
                      "1.5Gi", "250m", 3, 0.5, "", "lots", None, [], {"a": 1}, True]
RESERVED_MOUNTS = [
    {"name": p.run_volume(0), "mountPath": "/x"}, {"name": p.BIN_VOLUME, "mountPath": "/y"},
    {"name": "scratch", "mountPath": "//initshift/run/0"}, {"name": "scratch", "mountPath": "/./initshift/run/0"},
    {"name": "scratch", "mountPath": p.BIN_MOUNT + "/"}, {"name": "scratch", "mountPath": p.RUN_MOUNT_ROOT},
]


def _containers(pod: dict) -> list[dict]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


KINDS = ["mains", "quantity", "depth", "namespace", "mount", "annotations", "pad", "odd", "random", "random"]
# A recipe, not the pod: what hypothesis prints on a failure must stay small (and shallow).
steps = st.tuples(st.sampled_from(KINDS), st.integers(0, 10**6), st.integers(0, 10**6), json_values)
recipes = st.tuples(st.sampled_from(NAMES), st.lists(steps, min_size=1, max_size=3))


def build(recipe: tuple) -> dict:
    name, changes = recipe
    pod = copy.deepcopy(CATALOGUE[name])
    for change in changes:
        try:
            _change(pod, *change)
        except (KeyError, IndexError, TypeError, AttributeError):
            pass  # an earlier random change removed what this one edits: the pod stays as it is
    return pod


def _change(pod: dict, kind: str, a: int, b: int, value: Any) -> None:
    spec = pod["spec"]
    containers = _containers(pod)
    if kind == "mains":  # findings 1 and 2: work and size per main
        template = next((c for c in spec["containers"] if c["name"] not in p.DEFAULT_SIDECAR_NAMES),
                        spec["containers"][0])
        for i in range(1 + a % 120):
            spec["containers"].append({**copy.deepcopy(template), "name": f"main-{i}"})
    elif kind == "quantity":  # finding 4
        c = containers[a % len(containers)]
        c.setdefault("resources", {})[("requests", "limits")[b % 2]] = {
            ("cpu", "memory", "example.com/gpu")[b % 3]: HOSTILE_QUANTITIES[a % len(HOSTILE_QUANTITIES)]}
    elif kind == "depth":  # finding 4
        doc: dict = {}
        for _ in range((20, 150, 900)[a % 3]):
            doc = {"a": doc}
        spec["affinity"] = doc
    elif kind == "namespace":  # finding 3
        pod["metadata"]["namespace"] = (["kube-system"], {"a": 1}, 7, "kube-system", None)[a % 5]
    elif kind == "mount":  # finding 8
        spec.setdefault("volumes", []).append({"name": "scratch", "emptyDir": {}})
        containers[a % len(containers)].setdefault("volumeMounts", []).append(
            copy.deepcopy(RESERVED_MOUNTS[b % len(RESERVED_MOUNTS)]))
    elif kind == "annotations":  # finding 9
        pod["metadata"].setdefault("annotations", {}).update({
            p.ANNOTATION_READY: p.READY_TRUE, p.ANNOTATION_OUTCOME: "{}", f"{p.ANNOTATION_READY_PREFIX}x": "true"})
    elif kind == "odd":  # issue 24: shapes no apiserver sends (a decision or a 400, never an internal error)
        *path, odd = ODD_SHAPES[a % len(ODD_SHAPES)]
        parent = pod
        for key in path[:-1]:
            parent = parent.setdefault(key, {})
        parent[path[-1]] = copy.deepcopy(odd)
    elif kind == "pad":  # finding 2: near etcd's limit
        c = spec["containers"][0]
        c.setdefault("env", []).append({"name": "PAD", "value": ""})
        c["env"][-1]["value"] = "x" * max(0, MAX_OBJECT_BYTES - object_bytes(pod) - a % 60000)
    else:
        paths = _paths(pod)
        path = paths[a % len(paths)]
        parent: Any = pod
        try:
            for key in path[:-1]:
                parent = parent[key]
            if b % 2 and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = copy.deepcopy(value)
        except (KeyError, IndexError, TypeError):
            pass


def valid(pod: Any) -> bool:
    if not isinstance(pod, dict) or object_bytes(pod) > MAX_OBJECT_BYTES:
        return False
    try:
        kubernetes_validate.validate(pod, OLDEST, strict=True)
        return not pod_problems(pod)
    except Exception:  # noqa: BLE001 - anything the validator or the checks reject is invalid
        return False


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    h.make_certs(d)
    return d


def test_fuzz_over_tls_no_5xx_patches_apply_and_valid_pods_stay_valid(pki):
    seen = {"patched": 0, "unchanged": 0, "denied": 0, "400": 0, "checked": 0, "warned": 0}
    with h.running(h.settings_for(pki)) as server, \
            httpx.Client(verify=h.client_context(pki / "ca.crt"), base_url=h.base_url(server), timeout=30) as client:

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(recipes)
        def check(recipe: tuple) -> None:
            pod = build(recipe)
            review = wrap(pod, namespace="builds", uid=UID)  # no deep copy: the pod may nest 900 deep
            try:
                body = json.dumps(review).encode()
            except (ValueError, RecursionError):
                return
            r = client.post("/mutate", content=body, headers={"content-type": "application/json"})
            assert r.status_code in (200, 400, 413), (r.status_code, r.text[:300])
            if r.status_code == 413:  # over INITSHIFT_MAX_BODY_BYTES (what no apiserver sends)
                assert len(body) > server.settings.server.max_body_bytes
                return
            if r.status_code == 400:
                assert "\n" not in r.json()["error"]
                seen["400"] += 1
                return
            answer = r.json()
            assert answer["response"]["uid"] == review["request"]["uid"]
            assert "internal error" not in r.text, r.text[:300]
            patch = decode_patch(answer)
            if not patch:
                assert answer["response"].get("warnings")  # an unchanged pod says why
                seen["unchanged"] += 1
                return
            seen["patched"] += 1
            seen["warned"] += bool(answer["response"].get("warnings"))
            out = apply_patch(pod, patch)
            # The rewrite never makes a pod too large for etcd (one already is, left unchanged
            # but for its forged annotations, stays so: etcd refuses it, not the webhook).
            assert object_bytes(out) <= max(MAX_OBJECT_BYTES, object_bytes(pod))
            if valid(pod):
                assert_valid_pod(out)
                seen["checked"] += 1

        check()
    # Skipped pods with init containers get a note on themselves (a patch), so "unchanged" is
    # rare: what matters is that every path was exercised.
    assert seen["patched"] > 20 and seen["checked"] > 10 and seen["400"] > 5, seen
    assert seen["unchanged"] + seen["warned"] > 20, seen
