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
from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch
from webhook.rewrite._podcheck import MAX_ANNOTATION_BYTES, MAX_OBJECT_BYTES, annotation_bytes, object_bytes
from webhook.rewrite._rewrite import plan, rewrite
from webhook.settings import RewriteSettings, Settings

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


# A required field that is JSON null (`- name:` left empty in YAML, for `initshift mutate`)
# is missing, as for the apiserver, which decodes it to "": the warning names it, whatever
# the strategy (hybrid spoke of initshift's annotations, the others of the rewritten pod).
@pytest.mark.parametrize("mode", [p.MODE_WAITER, p.MODE_HYBRID, p.MODE_NATIVE])
@pytest.mark.parametrize("where", ["containers", "initContainers"])
def test_a_required_field_that_is_null_is_missing(mode, where):
    pod = job() if where == "containers" else copy.deepcopy(CATALOGUE["kpack-istio"])
    pod["spec"][where][0]["name"] = None
    result = rewrite(pod, Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode, native_sidecars="true")))
    unchanged_saying(result, f"pod.spec.{where}[0].name is missing", "admitted unchanged")
    assert result.reason == "invalid"


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


# --- finding 1: linear in the number of mains ------------------------------------------------------
def with_mains(n: int) -> dict:
    pod = job()
    main = next(c for c in pod["spec"]["containers"] if c["name"] != "istio-proxy")
    pod["spec"]["containers"] += [{**copy.deepcopy(main), "name": f"main-{i}"} for i in range(n)]
    return pod


def test_each_main_costs_the_same_whatever_the_number_of_mains():
    outs = {}
    for n in (10, 1000):  # 1,000 mains once took 7 s, 700 MB and a 151 MB answer
        pod = with_mains(n)
        result = rewrite(pod, ON)
        assert result.changed, result.warnings
        outs[n] = (pod, result.pod)
    small, large = ({c["name"]: c for c in out["spec"]["containers"]} for _, out in outs.values())
    for name in ("main-0", "main-9"):  # the same main: the same number of flags and mounts
        assert len(small[name]["args"]) == len(large[name]["args"])
        assert len(small[name]["volumeMounts"]) == len(large[name]["volumeMounts"])
        assert flag_value(large[name], p.FLAG_MAINS) == str(1000 + 1)
    growth = {n: object_bytes(out) - object_bytes(pod) for n, (pod, out) in outs.items()}
    per_main = growth[10] / 11
    assert growth[1000] <= per_main * 1001 * 1.1 + 20_000, growth  # linear, not quadratic
    assert object_bytes(outs[1000][1]) < MAX_OBJECT_BYTES
    assert_valid_pod(rewrite(with_mains(30), ON).pod)


def flag_value(c: dict, flag: str) -> str:
    args = c["args"]
    return args[args.index(flag) + 1]


def test_the_issues_118_main_pod_now_fits_with_room_to_spare():
    """A valid 7 KB pod with 118 mains became 1.58 MB (over etcd's limit) with N² peers."""
    pod = with_mains(117)
    out = rewrite(pod, ON).pod
    assert object_bytes(out) < 200_000
    assert_valid_pod(out)


# --- finding 8: initshift's volumes and paths are reserved everywhere ----------------------------
def _unwrapped_pods() -> dict[str, tuple[dict, str]]:
    """(pod, container) where the container is one initshift does not wrap."""
    out = {}
    pod = job()
    out["istio-proxy"] = (pod, "istio-proxy")
    pod = job()
    out["mesh init"] = (pod, pod["spec"]["initContainers"][0]["name"])
    pod = copy.deepcopy(CATALOGUE["kpack-istio"])
    step = pod["spec"]["initContainers"][-1]["name"]
    pod["metadata"].setdefault("annotations", {})[p.ANNOTATION_KEEP_INIT] = step
    out["keep-init"] = (pod, step)
    pod = job()
    main = next(c for c in pod["spec"]["containers"] if c["name"] != "istio-proxy")["name"]
    pod["metadata"].setdefault("annotations", {})[p.ANNOTATION_SIDECARS] = main
    out["named sidecar"] = (pod, main)
    pod = job()
    pod["spec"]["initContainers"].insert(0, {"name": "agent", "image": "agent", "restartPolicy": "Always"})
    out["native sidecar"] = (pod, "agent")
    return out


@pytest.mark.parametrize("volume", [p.run_volume(0), p.BIN_VOLUME, p.MAINS_VOLUME, p.READY_VOLUME])
@pytest.mark.parametrize("kind", list(_unwrapped_pods()))
def test_a_container_initshift_does_not_wrap_may_not_mount_its_volumes(kind, volume):
    pod, name = _unwrapped_pods()[kind]
    c = next(c for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]] if c["name"] == name)
    c.setdefault("volumeMounts", []).append({"name": volume, "mountPath": "/forge"})
    result = rewrite(pod, ON)
    unchanged_saying(result, repr(name), repr(volume), "admitted unchanged")


@pytest.mark.parametrize("path", ["//initshift/run/0", "/./initshift/run/0", "/work/../initshift/bin", "/initshift/",
                                  "initshift/x"])
def test_reserved_paths_are_normalised(path):
    pod = job()
    step = pod["spec"]["initContainers"][-1]
    step.setdefault("volumeMounts", []).append({"name": pod["spec"]["volumes"][0]["name"], "mountPath": path})
    unchanged_saying(rewrite(pod, ON), "is reserved by initshift")


def test_a_container_injected_after_the_rewrite_may_not_mount_its_volumes():
    """Re-invocation: initshift's volumes exist now; a container another webhook added since
    must not reach them, and admitting the pod as it is would leave it so: denied."""
    first = rewrite(job(), ON).pod
    later = copy.deepcopy(first)
    later["spec"]["containers"].append({"name": "injected", "image": "x", "volumeMounts": [
        {"name": p.run_volume(0), "mountPath": "/forge"}]})
    result = rewrite(later, ON)
    assert result.denied and "'injected'" in result.denied and not result.changed
    assert not rewrite(first, ON).changed  # our own containers are fine


def test_start_order_collisions_deny():
    """A declared start order is never dropped silently: a collision denies the pod."""
    from tests.rewrite.test_start_order import web_pod

    pod = web_pod("istio-proxy;app")
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")
    proxy.setdefault("volumeMounts", []).append({"name": p.MARKER_VOLUME, "mountPath": "/forge"})
    result = rewrite(pod, ON)
    assert result.denied and p.MARKER_VOLUME in result.denied and "'istio-proxy'" in result.denied


def test_the_not_rewritten_note_is_left_off_a_pod_it_would_push_over_etcds_limit():
    """Found by the TLS fuzz: a skipped pod gets a note saying why, which must not push a
    pod that fits over the limit."""
    pod = copy.deepcopy(CATALOGUE["deployment-istio"])
    c = pod["spec"]["containers"][0]
    c.setdefault("env", []).append({"name": "PAD", "value": ""})
    c["env"][-1]["value"] = "x" * (MAX_OBJECT_BYTES - object_bytes(pod))
    assert object_bytes(pod) == MAX_OBJECT_BYTES
    result = rewrite(pod, ON)
    assert object_bytes(result.pod) <= MAX_OBJECT_BYTES and result.warnings
    small = rewrite(CATALOGUE["deployment-istio"], ON)
    assert small.pod is not CATALOGUE["deployment-istio"]  # with room, the note is there
