"""Hostile and heavy pods through the pure rewrite (issue 17): whatever arrives is an
unchanged pod with a warning or a valid rewritten pod, never an exception; watcher-owned
annotations never survive a CREATE; nothing emitted is too large to store."""

from __future__ import annotations

import copy
import json

import pytest

from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from waiter import protocol as p
from webhook.admission._patch import apply_patch, make_patch
from webhook.rewrite._podcheck import MAX_ANNOTATION_BYTES, MAX_OBJECT_BYTES, annotation_bytes, object_bytes
from webhook.rewrite._rewrite import plan, rewrite
from webhook.settings import Settings

ON = Settings(feature_gate=True)
CATALOGUE = pods.catalogue()


def job() -> dict:
    return copy.deepcopy(CATALOGUE["job-istio"])


def unchanged_saying(result, *words: str) -> None:
    assert not result.changed and result.denied is None, result.warnings
    text = " ".join(result.warnings)
    assert all(w in text for w in words), result.warnings


# --- finding 4: quantities and depth ----------------------------------------------------------
@pytest.mark.parametrize("value", ["1e3000000", "1" * 5000, "9" * 19 + "Ei", "0." + "1" * 5000])
def test_huge_quantities_leave_the_pod_unchanged(value):
    pod = job()
    pod["spec"]["initContainers"][-1]["resources"] = {"requests": {"cpu": value}}
    result = rewrite(pod, ON)
    unchanged_saying(result, "quantity", "admitted unchanged")
    assert result.reason == "invalid"


def nested(depth: int) -> dict:
    doc: dict = {}
    for _ in range(depth):
        doc = {"x": [doc]}
    return doc


def test_deep_nesting_is_refused_before_anything_recurses():
    pod = job()
    pod["spec"]["affinity"] = nested(900)  # copy.deepcopy overflowed the stack here
    assert plan(pod, ON).lookups() == []
    result = rewrite(pod, ON)
    unchanged_saying(result, "deeper than 100 levels")


def test_real_pods_are_nowhere_near_the_depth_limit():
    for name, pod in CATALOGUE.items():
        assert rewrite(pod, ON).reason != "invalid", name


# --- finding 2: the emitted pod must fit etcd and the annotation limit ---------------------------
def test_a_rewrite_that_would_not_fit_etcd_leaves_the_pod_unchanged():
    pod = job()
    main = pod["spec"]["containers"][-1]
    main.setdefault("env", []).append({"name": "PAD", "value": ""})
    main["env"][-1]["value"] = "x" * (MAX_OBJECT_BYTES - object_bytes(pod) - 200)  # fits, barely
    assert object_bytes(pod) <= MAX_OBJECT_BYTES
    result = rewrite(pod, ON)
    unchanged_saying(result, "would not fit", "object limit of etcd")
    assert result.reason == "too-large"
    # ...while the same pod with room to spare is rewritten, and fits
    main["env"][-1]["value"] = "x" * 100_000
    result = rewrite(pod, ON)
    assert result.changed and object_bytes(result.pod) <= MAX_OBJECT_BYTES
    assert_valid_pod(result.pod)


def test_a_rewrite_that_would_overflow_the_annotations_leaves_the_pod_unchanged():
    pod = job()
    annotations = pod["metadata"].setdefault("annotations", {})
    annotations["example.com/pad"] = ""
    annotations["example.com/pad"] = "x" * (MAX_ANNOTATION_BYTES - annotation_bytes(pod) - 10)
    result = rewrite(pod, ON)
    unchanged_saying(result, "would not fit", "annotations")


def test_a_pod_already_over_a_limit_is_left_to_the_apiserver_to_refuse():
    pod = job()
    pod["metadata"].setdefault("annotations", {})["example.com/pad"] = "x" * (MAX_ANNOTATION_BYTES + 1)
    unchanged_saying(rewrite(pod, ON), "would not fit")


# --- finding 9: watcher-owned annotations at CREATE -----------------------------------------------
FORGED = {p.ANNOTATION_READY: p.READY_TRUE, p.ANNOTATION_OUTCOME: json.dumps({"result": "Succeeded"}),
          f"{p.ANNOTATION_READY_PREFIX}istio-proxy": p.READY_TRUE}


@pytest.mark.parametrize("name", ["job-istio", "kpack-istio", "job", "deployment-istio"])
def test_watcher_annotations_are_removed_at_create(name):
    pod = copy.deepcopy(CATALOGUE[name])
    pod["metadata"].setdefault("annotations", {}).update(FORGED, **{"example.com/keep": "yes"})
    result = rewrite(pod, ON)
    assert result.changed and result.denied is None
    out = apply_patch(pod, make_patch(pod, result.pod))
    kept = out["metadata"]["annotations"]
    assert not set(FORGED) & set(kept) and kept["example.com/keep"] == "yes"
    assert "only the initshift watcher writes them" in result.warnings[0]
    for key in FORGED:
        assert key in result.warnings[0]
    assert_valid_pod(out)
    assert pod["metadata"]["annotations"][p.ANNOTATION_READY] == p.READY_TRUE  # the input is never mutated


def test_a_pod_without_forged_annotations_has_no_such_warning():
    result = rewrite(job(), ON)
    assert not any("watcher writes" in w for w in result.warnings)


def test_feature_gate_off_touches_nothing():
    pod = job()
    pod["metadata"].setdefault("annotations", {}).update(FORGED)
    assert not rewrite(pod, Settings(feature_gate=False)).changed
