"""Which platforms a pod can run on (webhook/registry/_platform.py), read as the scheduler
reads nodeSelector and required node affinity, with nodes labelled by os and arch."""

from __future__ import annotations

import pytest

from webhook.registry._platform import narrow, platform_filter
from webhook.rewrite import ImageConfig, ImageEntrypoints

PLATFORMS = [("linux", "amd64"), ("linux", "arm64"), ("linux", "s390x"), ("windows", "amd64")]
ARCH, OS = "kubernetes.io/arch", "kubernetes.io/os"


def expr(key: str, operator: str, *values: str) -> dict:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def pod(node_selector: dict | None = None, *terms: dict) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "i"}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if terms:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": list(terms)}}}
    return {"spec": spec}


def allowed(p: dict) -> list[tuple[str, str]] | None:
    fits = platform_filter(p)
    return None if fits is None else [x for x in PLATFORMS if fits(*x)]


@pytest.mark.parametrize("p, want", [
    (pod(), None),  # nothing narrows
    (pod({"topology.kubernetes.io/zone": "a"}), None),  # not about the platform
    (pod({ARCH: "arm64"}), [("linux", "arm64")]),
    (pod({OS: "windows"}), [("windows", "amd64")]),
    (pod(None, {"matchExpressions": [expr(ARCH, "In", "arm64", "s390x")]}), [("linux", "arm64"), ("linux", "s390x")]),
    (pod(None, {"matchExpressions": [expr(ARCH, "NotIn", "amd64")]}), [("linux", "arm64"), ("linux", "s390x")]),
    # Terms are ORed, a term's expressions ANDed.
    (pod(None, {"matchExpressions": [expr(ARCH, "In", "arm64")]}, {"matchExpressions": [expr(OS, "In", "windows")]}),
     [("linux", "arm64"), ("windows", "amd64")]),
    (pod(None, {"matchExpressions": [expr(OS, "In", "linux"), expr(ARCH, "In", "amd64", "arm64")]}),
     [("linux", "amd64"), ("linux", "arm64")]),
    # nodeSelector and affinity both hold.
    (pod({OS: "linux"}, {"matchExpressions": [expr(ARCH, "NotIn", "arm64")]}), [("linux", "amd64"), ("linux", "s390x")]),
    # Exists, and expressions on other labels, hold on a node of any platform; DoesNotExist on none.
    (pod(None, {"matchExpressions": [expr(ARCH, "Exists"), expr("pool", "In", "builds")]}), [*PLATFORMS]),
    (pod(None, {"matchExpressions": [expr(ARCH, "DoesNotExist")]}, {"matchExpressions": [expr(ARCH, "In", "s390x")]}),
     [("linux", "s390x")]),
    # A DaemonSet's pod names its node by matchFields: any platform. An empty term matches no node.
    (pod(None, {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}), [*PLATFORMS]),
    (pod(None, {}, {"matchExpressions": [expr(ARCH, "In", "arm64")]}), [("linux", "arm64")]),
])
def test_the_platforms_a_pod_can_be_scheduled_on(p: dict, want: list | None) -> None:
    assert allowed(p) == want


def test_narrow_keeps_the_fitting_platforms_or_all_when_none_fits() -> None:
    entry = ImageEntrypoints({"linux/amd64": ImageConfig(("a",), ()), "linux/arm64/v8": ImageConfig(("b",), ()),
                              "unknown": ImageConfig(("c",), ())}, "sha256:x")
    arm = platform_filter(pod(None, {"matchExpressions": [expr(ARCH, "In", "arm64")]}))
    assert list(narrow(entry, arm).by_platform) == ["linux/arm64/v8"]
    assert narrow(entry, None) is entry
    assert narrow(entry, platform_filter(pod({ARCH: "riscv64"}))) is entry  # the pull will say the image lacks it
