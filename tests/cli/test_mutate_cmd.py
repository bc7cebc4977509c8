"""`initshift mutate` as a user runs it: a real subprocess of the installed console script."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import registryd
from tests.support.fixtures import pods
from tests.support.kubedouble import KubeDouble
from tests.support.podstatus import write_kubeconfig
from waiter import protocol as p
from tests.support.patching import apply_patch

ROOT = Path(__file__).resolve().parents[2]
INITSHIFT = [sys.executable, "-m", "webhook.cli"]


def run(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*INITSHIFT, "mutate", *args], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)


def istio_job_yaml() -> str:
    return yaml.safe_dump(pods.catalogue()["job-istio"])


def test_a_workloads_diff_is_labelled_with_its_kind_and_name(tmp_path):
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
               "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": pods.catalogue()["job-istio"]}}}}
    diff = run("-", "-o", "diff", stdin=yaml.safe_dump(cronjob))
    assert diff.returncode == 0 and diff.stdout.startswith("--- CronJob/nightly\n+++ CronJob/nightly (initshift)\n")


def test_yaml_json_patch_and_diff_outputs():
    src = pods.catalogue()["job-istio"]
    out = run("-", stdin=istio_job_yaml())
    assert out.returncode == 0, out.stderr
    pod = yaml.safe_load(out.stdout)
    assert pod["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    as_json = run("-", "-o", "json", stdin=istio_job_yaml())
    assert json.loads(as_json.stdout) == pod
    patch = run("-", "-o", "patch", stdin=istio_job_yaml())
    assert apply_patch(src, json.loads(patch.stdout)) == pod
    diff = run("-", "-o", "diff", stdin=istio_job_yaml())
    label = "Pod/site-build-"  # Kind/name (here the generateName), as kubectl names objects
    assert diff.stdout.startswith(f"--- {label}\n+++ {label} (initshift)\n") and "+  - name: initshift-init" in diff.stdout


def test_admission_review_input(tmp_path):
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "1", "namespace": "builds", "object": pods.catalogue()["kpack-istio"]}}
    f = tmp_path / "review.json"
    f.write_text(json.dumps(review))
    out = run(str(f), "-o", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER


@pytest.mark.parametrize("request_, said", [
    ({"operation": "UPDATE"}, "the AdmissionReview is an UPDATE of v1 Pod; the webhook rewrites a Pod CREATE only"),
    ({"kind": {"group": "apps", "version": "v1", "kind": "Deployment"}}, "is a CREATE of apps/v1 Deployment;"),
    ({"subResource": "ephemeralcontainers", "operation": "UPDATE"}, "is an UPDATE of v1 Pod (pods/ephemeralcontainers);"),
    ({"kind": {"kind": "Pod"}}, "is a CREATE of Pod;"),  # no version: the server's is_pod_create says no too
    ({"operation": 5}, "one the webhook refuses (HTTP 400): request.operation must be a string"),
    ({"kind": "Pod"}, "one the webhook refuses (HTTP 400): request.kind must be an object"),
])
def test_admission_review_the_server_would_not_rewrite(tmp_path, request_, said):
    """The review's request read as the server reads it: one it lets pass or refuses is said,
    not rewritten as if it were a Pod CREATE; the fields a hand-written review leaves out
    are a Pod CREATE's (test_admission_review_input)."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "1", "object": pods.catalogue()["kpack-istio"], **request_}}
    for command in ("mutate", "review"):
        out = subprocess.run([sys.executable, "-m", "webhook.cli", command, "-"],
                             input=json.dumps(review).encode(), capture_output=True)
        assert out.returncode == 2 and not out.stdout, out
        assert said in out.stderr.decode() and "Traceback" not in out.stderr.decode()


def test_unchanged_pod_warns_and_check_exit_code():
    job = yaml.safe_dump(pods.catalogue()["job"])
    out = run("-", stdin=job)
    assert out.returncode == 0 and yaml.safe_load(out.stdout) == pods.not_rewritten(pods.catalogue()["job"], "no-sidecar")
    assert "warning: initshift: no sidecar" in out.stderr
    assert run("-", "--check", stdin=job).returncode == 1
    patch = run("-", "-o", "patch", stdin=job)
    assert patch.returncode == 0, patch.stderr  # the reason recorded, nothing else
    assert apply_patch(pods.catalogue()["job"], json.loads(patch.stdout)) == yaml.safe_load(out.stdout)


def test_the_servers_protected_namespaces_are_left_as_the_server_leaves_them(tmp_path):
    """kube-system and initshift's own namespace (INITSHIFT_NAMESPACE): the server never mutates
    a pod there; mutate says so and prints it unchanged, as it does a pod left unchanged."""
    env = {**os.environ, "INITSHIFT_NAMESPACE": "platform"}
    src = pods.catalogue()["job-istio"]
    for namespace in ("kube-system", "platform"):
        pod = {**src, "metadata": {**src["metadata"], "namespace": namespace}}
        out = run("-", "-o", "json", stdin=json.dumps(pod), env=env)
        assert out.returncode == 0 and json.loads(out.stdout) == pod, out.stderr
        assert out.stderr == f"warning: initshift: namespace {namespace!r} is never mutated\n"
        assert run("-", "--check", stdin=json.dumps(pod), env=env).returncode == 1
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "1", "namespace": "platform", "object": src}}
    out = run("-", "-o", "patch", stdin=json.dumps(review), env=env)
    assert out.returncode == 0 and json.loads(out.stdout) == [], out.stderr
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "kube-system"},
                  "spec": {"template": {"metadata": {}, "spec": pods.catalogue()["deployment-istio"]["spec"]}}}
    both = run("-", "-o", "json", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [deployment, src]}),
               env=env)
    assert both.returncode == 0 and "Deployment/d: initshift: namespace 'kube-system' is never mutated" in both.stderr
    assert json.loads(both.stdout)["items"][1]["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER, \
        "a pod elsewhere in the same manifest is rewritten"


def test_denied_and_bad_input(tmp_path):
    pod = pods.catalogue()["job-istio"]
    del pod["spec"]["initContainers"][1]["command"]
    out = run("-", stdin=yaml.safe_dump(pod))
    assert out.returncode == 3 and "denied: initshift: " in out.stderr and "set `command`" in out.stderr
    for text, message in [("x: [", "not YAML or JSON"), ("[1, 2]", "expected a Pod"),
                          ("kind: Service\nspec: {}", "got a Service"),
                          ("kind: Deployment\nspec: {}", "the Deployment has no pod template")]:
        out = run("-", stdin=text)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    missing = run(str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_gate_and_mode_flags():
    env_off = {"PATH": "/usr/bin:/bin", p.FEATURE_GATE_ENV: "false"}
    out = run("-", "--respect-gate", "--check", stdin=istio_job_yaml(), env=env_off)
    assert out.returncode == 1 and "is off" in out.stderr
    assert run("-", "--mode", "disabled", "--check", stdin=istio_job_yaml()).returncode == 1
    bad_env = run("-", stdin=istio_job_yaml(), env={"PATH": "/usr/bin:/bin", "INITSHIFT_RESOURCES_POLICY": "half"})
    assert bad_env.returncode == 2 and "INITSHIFT_RESOURCES_POLICY" in bad_env.stderr


def test_workload_templates_are_rewritten_in_place():
    template = pods.pod_template(pods.catalogue()["job-istio"])
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
               "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}}}
    out = run("-", "-o", "json", stdin=yaml.safe_dump(cronjob))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "CronJob" and doc["spec"]["schedule"] == "0 3 * * *"
    rewritten = doc["spec"]["jobTemplate"]["spec"]["template"]
    assert rewritten["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert [c["name"] for c in rewritten["spec"]["initContainers"]] == ["istio-init", p.INIT_CONTAINER_NAME]


def test_a_template_left_unchanged_is_printed_as_it_came():
    """A Deployment whose pods the rewrite leaves alone (restartPolicy Always beside an init
    container): its template stays as it came, without the initshift.io/not-rewritten note
    the webhook puts on the pods themselves, so applying the output rolls nothing out. A
    bare Pod still gets the note, as the webhook gives it."""
    pod = pods.catalogue()["job-istio"]
    pod["spec"]["restartPolicy"] = "Always"
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                  "spec": {"selector": {"matchLabels": {"app": "web"}},
                           "template": pods.pod_template(pod, app="web")}}
    text = yaml.safe_dump(deployment, sort_keys=False)
    out = run("-", stdin=text)
    assert out.returncode == 0 and "admitted unchanged" in out.stderr, out.stderr
    assert yaml.safe_load(out.stdout) == deployment
    diff = run("-", "-o", "diff", stdin=text)
    assert (diff.returncode, diff.stdout) == (0, "")
    assert json.loads(run("-", "-o", "patch", stdin=text).stdout) == []
    bare = run("-", stdin=yaml.safe_dump(pod))
    assert yaml.safe_load(bare.stdout)["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "restart-policy"


def test_a_reader_that_stops_early_ends_it_with_141(tmp_path):
    """`mutate many.yaml -o diff | head -1`: the diff is one write far larger than the pipe
    holds; the reader's close is exit 141, as for smaller writes (it was 0, the rest lost)."""
    many = []
    for i in range(60):
        pod = pods.catalogue()["job-istio"]
        pod["metadata"].pop("generateName", None)
        pod["metadata"]["name"] = f"build-{i}"
        many.append(pod)
    (tmp_path / "many.yaml").write_text(yaml.safe_dump_all(many))
    proc = subprocess.Popen([*INITSHIFT, "mutate", str(tmp_path / "many.yaml"), "-o", "diff"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"--- Pod/build-0\n"
    proc.stdout.close()  # as `head -1` exits
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (141, b"")


def test_limit_ranges_of_the_namespace(tmp_path):
    """--limit-ranges: what `kubectl get limitranges -o yaml` prints; the requests initshift
    writes pass its min and ratio; anything but LimitRanges is refused with exit 2."""
    lrs = {"apiVersion": "v1", "kind": "List", "items": [{
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "tenant"},
        "spec": {"limits": [{"type": "Container", "min": {"cpu": "20m"}, "maxLimitRequestRatio": {"cpu": "25"}}]}}]}
    f = tmp_path / "lr.yaml"
    f.write_text(yaml.safe_dump(lrs))
    plain = run("-", stdin=istio_job_yaml())
    fitted = run("-", "--limit-ranges", str(f), stdin=istio_job_yaml())
    assert plain.returncode == fitted.returncode == 0, fitted.stderr

    def init(out: str) -> dict:
        pod = yaml.safe_load(out)
        return next(c for c in pod["spec"]["initContainers"] if c["name"] == p.INIT_CONTAINER_NAME)["resources"]

    assert init(plain.stdout)["requests"]["cpu"] == "10m"
    assert init(fitted.stdout)["requests"]["cpu"] == "20m"  # 500m / 25 = 20m, and min 20m
    f.write_text(istio_job_yaml())
    bad = run("-", "--limit-ranges", str(f), stdin=istio_job_yaml())
    assert bad.returncode == 2 and bad.stderr.strip() == f"initshift mutate: {f}: expected LimitRanges, got a Pod"


def test_quotas_of_the_namespace(tmp_path):
    """--quotas: what `kubectl get resourcequotas -o yaml` prints, with the status the quota
    controller keeps; a rewrite whose steps' limits would exceed one is left unchanged
    (exit 1 with --check); anything but ResourceQuotas is refused with exit 2."""
    def quotas(limit: str) -> dict:
        hard = {"limits.memory": limit}
        return {"apiVersion": "v1", "kind": "List", "items": [{
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"},
            "spec": {"hard": hard}, "status": {"hard": hard, "used": {"limits.memory": "0"}}}]}
    f = tmp_path / "quotas.yaml"
    pod = copy.deepcopy(pods.catalogue()["kpack-istio"])  # six steps
    for c in pod["spec"]["initContainers"]:
        c["resources"] = {"limits": {"memory": "1Gi"}}
    f.write_text(yaml.safe_dump(quotas("100Gi")))
    assert run("-", "--quotas", str(f), "--check", stdin=yaml.safe_dump(pod)).returncode == 0
    f.write_text(yaml.safe_dump(quotas("2Gi")))
    tight = run("-", "--quotas", str(f), "--check", stdin=yaml.safe_dump(pod))
    assert tight.returncode == 1 and "exceeded quota: compute, requested: limits.memory=" in tight.stderr, tight.stderr
    f.write_text(istio_job_yaml())
    bad = run("-", "--quotas", str(f), stdin=istio_job_yaml())
    assert bad.returncode == 2 and bad.stderr.strip() == f"initshift mutate: {f}: expected ResourceQuotas, got a Pod"


def test_the_namespace_of_the_pod(tmp_path):
    """--namespace: what `kubectl get namespace NS -o yaml` prints; its mesh label asks for a
    proxy the pod waits for under a quota (exit 1 with --check); one Namespace, else exit 2."""
    hard = {"limits.cpu": "100"}
    q = tmp_path / "quotas.yaml"
    q.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"},
                                 "spec": {"hard": hard}, "status": {"hard": hard, "used": {"limits.cpu": "0"}}}))
    ns = tmp_path / "namespace.yaml"
    pod = yaml.safe_dump(pods.catalogue()["job-linkerd"])
    for labels, code in (({}, 0), ({"istio-injection": "enabled"}, 1)):
        ns.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "builds", "labels": labels}}))
        out = run("-", "--quotas", str(q), "--namespace", str(ns), "--check", stdin=pod)
        assert out.returncode == code, out.stderr
    assert "has not injected its proxy yet" in out.stderr
    ns.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": []}))
    none = run("-", "--namespace", str(ns), stdin=pod)
    assert none.returncode == 2 and none.stderr.strip() == f"initshift mutate: {ns}: expected one Namespace, got 0"


def _as_job(pod: dict, name: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": pods.pod_template(pod)}}


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}


def test_a_manifest_of_several_objects(tmp_path):
    """`helm template ... | initshift mutate -`: every pod and workload rewritten, any other
    object printed as it is, in order: a YAML stream, a JSON List, a diff per object; the
    warnings name their object; --check fails on the one pod left unchanged."""
    job, plain = _as_job(pods.catalogue()["job-istio"], "build"), pods.catalogue()["job"]
    stream = yaml.safe_dump_all([SERVICE, job, plain])
    out = run("-", stdin=stream)
    assert out.returncode == 0, out.stderr
    service, built, left = yaml.safe_load_all(out.stdout)
    assert service == SERVICE and left == pods.not_rewritten(plain, "no-sidecar")
    assert built["spec"]["template"]["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert "warning: Pod/site-build-: initshift: no sidecar" in out.stderr
    as_json = json.loads(run("-", "-o", "json", stdin=stream).stdout)
    assert as_json["kind"] == "List" and as_json["items"] == [service, built, left]
    diff = run("-", "-o", "diff", stdin=stream).stdout
    assert diff.startswith("--- Job/build\n+++ Job/build (initshift)\n") and "--- Service/web" not in diff
    assert run("-", "--check", stdin=stream).returncode == 1
    assert run("-", "--check", stdin=yaml.safe_dump_all([SERVICE, job])).returncode == 0
    # One pod among other objects: its patch, as for a lone pod.
    patch = run("-", "-o", "patch", stdin=yaml.safe_dump_all([SERVICE, job]))
    assert apply_patch(job, json.loads(patch.stdout)) == built
    several = run("-", "-o", "patch", stdin=stream)
    assert several.returncode == 2 and several.stdout == "" and several.stderr == (
        "initshift mutate: -o patch prints one pod's JSONPatch; <stdin> holds 2 (Job/build, Pod/site-build-): use -o diff\n")


def test_lists_as_kubectl_and_the_api_print_them():
    """`kubectl get jobs -o yaml` (a List) and the API's JobList, whose items carry no kind:
    each item rewritten as a Job."""
    job = _as_job(pods.catalogue()["job-istio"], "build")
    listed = run("-", "-o", "json", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [job, job]}))
    bare = {k: v for k, v in job.items() if k not in ("apiVersion", "kind")}
    typed = run("-", "-o", "json", stdin=json.dumps({"apiVersion": "batch/v1", "kind": "JobList", "items": [bare]}))
    assert listed.returncode == typed.returncode == 0, listed.stderr + typed.stderr
    items = json.loads(listed.stdout)["items"]
    alone = json.loads(typed.stdout)  # one object: printed as itself
    assert alone["kind"] == "Job" and alone["apiVersion"] == "batch/v1"
    assert items == [alone, alone]
    assert alone["spec"]["template"]["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    empty = run("-", stdin="kind: List\nitems: []\n")
    assert empty.returncode == 2 and "an empty List" in empty.stderr


def test_a_pod_denied_or_unreadable_among_several():
    """Nothing printed when one pod would be denied (half a manifest must not reach
    `kubectl apply`); a bad object is named by its kind and name."""
    denied = pods.catalogue()["job-istio"]
    del denied["spec"]["initContainers"][1]["command"]
    stream = yaml.safe_dump_all([_as_job(pods.catalogue()["job-istio"], "fine"), _as_job(denied, "broken")])
    out = run("-", stdin=stream)
    assert out.returncode == 3 and out.stdout == "" and "denied: Job/broken: initshift: " in out.stderr
    assert "Job/fine" not in out.stderr
    for docs, message in (([SERVICE, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                                      "spec": {}}], "initshift mutate: <stdin>, Deployment/d: the Deployment has no pod template"),
                          ([SERVICE, ["a", "b"]], "initshift mutate: <stdin>: 2 objects (a Service, a list); a list is no "
                                                  "Kubernetes object")):
        bad = run("-", stdin=yaml.safe_dump_all(docs))
        assert bad.returncode == 2 and bad.stderr.strip() == message, bad.stderr


def _volcano_job(name: str) -> dict:
    """A Volcano Job: kind Job, another group, and a template that looks like a pod's."""
    template = pods.pod_template(pods.catalogue()["job-istio"])
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": template, "tasks": [{"name": "t", "replicas": 1, "template": template}]}}


def test_objects_of_another_group_pass_through_with_a_note():
    """Decided by apiVersion as kubectl decides: a Volcano Job, a batch/v1beta1 CronJob (not
    served since Kubernetes 1.25) and an apps/v1beta1 Deployment (1.16) are printed as they
    came, one note each; the batch/v1 Job beside them is rewritten; a Service gets no note."""
    old_cron = {"apiVersion": "batch/v1beta1", "kind": "CronJob", "metadata": {"name": "nightly"},
                "spec": {"jobTemplate": {"spec": {"template": pods.pod_template(pods.catalogue()["job-istio"])}}}}
    old_deploy = {**_as_job(pods.catalogue()["job-istio"], "web"), "apiVersion": "apps/v1beta1", "kind": "Deployment"}
    docs = [SERVICE, _volcano_job("train"), old_cron, old_deploy, _as_job(pods.catalogue()["job-istio"], "build")]
    out = run("-", stdin=yaml.safe_dump_all(docs))
    assert out.returncode == 0, out.stderr
    *same, built = yaml.safe_load_all(out.stdout)
    assert same == docs[:-1]
    assert built["spec"]["template"]["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    notes = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: Job/train (batch.volcano.sh/v1alpha1) is not a Pod or a workload initshift rewrites (its Job is "
        "batch/v1's): printed as it came",
        "note: CronJob/nightly (batch/v1beta1) is not a Pod or a workload initshift rewrites (its CronJob is "
        "batch/v1's): printed as it came",
        "note: Deployment/web (apps/v1beta1) is not a Pod or a workload initshift rewrites (its Deployment is "
        "apps/v1's): printed as it came"]
    alone = run("-", stdin=yaml.safe_dump(_volcano_job("train")))
    assert alone.returncode == 2 and alone.stdout == "" and alone.stderr.endswith(
        "got a Job of batch.volcano.sh/v1alpha1\n"), alone.stderr


def test_a_replication_controller_is_rewritten_as_a_replica_set():
    """A v1 ReplicationController's spec.template is a pod template, as a ReplicaSet's."""
    rc = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "legacy"},
          "spec": {"replicas": 1, "template": pods.pod_template(pods.catalogue()["job-istio"])}}
    out = run("-", "-o", "json", stdin=yaml.safe_dump(rc))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["kind"] == "ReplicationController" and got["spec"]["replicas"] == 1
    assert got["spec"]["template"]["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER


def test_an_object_without_kind_or_apiVersion_is_refused():
    """kubectl refuses such a document (Object 'Kind' is missing): so does mutate, printing
    nothing (exit 2), rather than passing it on to `kubectl apply`. A lone pod without
    apiVersion (hand-written) is still read as a v1 Pod."""
    job = _as_job(pods.catalogue()["job-istio"], "build")
    kindless = {"apiVersion": "v1", "metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}
    versionless = {"kind": "Service", "metadata": {"name": "web"}}
    for doc, field in ((kindless, "Kind"), (versionless, "apiVersion")):
        out = run("-", stdin=yaml.safe_dump_all([job, doc]))
        assert out.returncode == 2 and out.stdout == "", out.stderr
        assert out.stderr == (f"initshift mutate: <stdin>: object 2 of 2 ({label(doc)}) has no {field.lower()}; "
                              f"kubectl refuses it too (Object '{field}' is missing)\n")
    lone = run("-", stdin=yaml.safe_dump({k: v for k, v in pods.catalogue()["job-istio"].items() if k != "kind"}))
    assert lone.returncode == 2 and "the object has no kind" in lone.stderr and len(lone.stderr.splitlines()) == 1
    hand_written = {k: v for k, v in pods.catalogue()["job-istio"].items() if k != "apiVersion"}
    assert run("-", "--check", stdin=yaml.safe_dump(hand_written)).returncode == 0


def label(doc: dict) -> str:
    return f"{doc.get('kind') or 'object without a kind'}/{doc['metadata']['name']}"


def _limit_range(**item: object) -> dict:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "tenant"},
            "spec": {"limits": [{"type": "Container", **item}]}}


def _quota(**parts: object) -> dict:
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"}, **parts}


@pytest.mark.parametrize("flag,doc,problem", [
    ("--limit-ranges", _limit_range(max={"cpu": "lots"}), "LimitRange/tenant: spec.limits[0].max.cpu: 'lots' is not "
                                                          "a quantity"),
    ("--limit-ranges", _limit_range(min={"memory": "1Qi"}), "LimitRange/tenant: spec.limits[0].min.memory: '1Qi' is "
                                                            "not a quantity"),
    ("--limit-ranges", _limit_range(default=["500m"]), "LimitRange/tenant: spec.limits[0].default must be a mapping "
                                                       "of quantities, not list"),
    ("--limit-ranges", _limit_range(maxLimitRequestRatio={"cpu": True}), "LimitRange/tenant: "
                                                                         "spec.limits[0].maxLimitRequestRatio.cpu: "
                                                                         "True is not a quantity"),
    ("--limit-ranges", {**_limit_range(), "spec": {"limits": {"type": "Container"}}},
     "LimitRange/tenant: spec.limits must be a list"),
    ("--limit-ranges", {**_limit_range(), "spec": {"limits": [{"max": {"cpu": "1"}}]}},
     "LimitRange/tenant: spec.limits[0] must be a mapping with a type (Container, Pod)"),
    ("--limit-ranges", {**_limit_range(), "spec": "none"}, "LimitRange/tenant: spec must be a mapping"),
    ("--quotas", _quota(spec={"hard": {"limits.cpu": "a lot"}}), "ResourceQuota/compute: spec.hard.limits.cpu: "
                                                                 "'a lot' is not a quantity"),
    ("--quotas", _quota(status={"hard": {"pods": "10"}, "used": {"pods": [1]}}), "ResourceQuota/compute: "
                                                                                 "status.used.pods: [1] is not a "
                                                                                 "quantity"),
    ("--quotas", _quota(status="ready"), "ResourceQuota/compute: status must be a mapping"),
])
def test_malformed_limit_ranges_and_quotas_are_refused(tmp_path, flag: str, doc: dict, problem: str):
    """A LimitRange or quota the rewrite cannot read would be skipped, its bound silently not
    applied: refused instead, one line naming the file, the object and the field (exit 2)."""
    f = tmp_path / "namespace-objects.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [doc]}))
    out = run("-", flag, str(f), stdin=istio_job_yaml())
    assert out.returncode == 2 and out.stdout == "" and out.stderr == f"initshift mutate: {f}: {problem}\n"


def test_kubeconfig_and_context_are_refused_where_nothing_reads_the_cluster(tmp_path):
    """--kubeconfig/--context name the cluster --resolve reads pull secrets from; without
    --resolve, or with pull secrets off, they would be ignored: a usage error instead. A
    kubeconfig named that cannot be used is said before any lookup (exit 1)."""
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("KUBECONFIG", None)
    pull = {**env, "INITSHIFT_REGISTRY_PULL_SECRETS": "true"}
    cases = [
        ((), env, 2, "--kubeconfig is for --resolve's pull secrets; without --resolve mutate reads no cluster"),
        (("--resolve",), env, 2, "--kubeconfig is for --resolve's pull secrets, which INITSHIFT_REGISTRY_PULL_SECRETS "
                                 "turns on; without them mutate reads no cluster"),
        (("--resolve",), pull, 1, f"kubeconfig {tmp_path / 'missing'}: no such file"),
    ]
    for extra, environ, code, message in cases:
        out = run("-", "--kubeconfig", str(tmp_path / "missing"), *extra, stdin=istio_job_yaml(), env=environ)
        assert (out.returncode, out.stdout, out.stderr) == (code, "", f"initshift mutate: {message}\n")
    empty = run("-", "--resolve", "--kubeconfig", "", stdin=istio_job_yaml(), env=pull)
    assert empty.returncode == 2 and "argument --kubeconfig: an empty path" in empty.stderr


async def test_resolve_reads_pull_secrets_from_the_kubeconfig_named(kube: KubeDouble, tmp_path):
    """--resolve --kubeconfig: the pod's pull secret is read from that cluster (the API double)
    and opens a registry that asks for credentials; without the flag there is none to read
    (no ~/.kube/config) and the lookup is refused, so the flag is what made it work."""
    reg = registryd.shared_env()
    auth = base64.b64encode(f"{registryd.USER}:{registryd.PASSWORD}".encode()).decode()
    config = json.dumps({"auths": {reg.basic.host: {"auth": auth}}}).encode()
    kube.put("secrets", {"metadata": {"name": "regcred", "namespace": "builds"},
                         "type": "kubernetes.io/dockerconfigjson",
                         "data": {".dockerconfigjson": base64.b64encode(config).decode()}})
    pod = copy.deepcopy(pods.catalogue()["job-istio"])
    pod["metadata"]["namespace"] = "builds"
    # One more whose config is broken: skipped with a warning, as the kubelet skips it.
    kube.put("secrets", {"metadata": {"name": "notes", "namespace": "builds"}, "type": "kubernetes.io/dockerconfigjson",
                         "data": {".dockerconfigjson": base64.b64encode(b"not json").decode()}})
    pod["spec"]["imagePullSecrets"] = [{"name": "regcred"}, {"name": "notes"}]
    step = next(c for c in pod["spec"]["initContainers"] if c["name"] == "git-clone")
    step["image"] = f"{reg.basic.host}/steps/entry:v1"
    del step["command"], step["args"]
    env = {**os.environ, "HOME": str(tmp_path), "INITSHIFT_REGISTRY_PULL_SECRETS": "true",
           "INITSHIFT_REGISTRY_CA_FILE": str(reg.pki.ca_file), "INITSHIFT_REGISTRY_BUDGET_SECONDS": "10"}
    env.pop("KUBECONFIG", None)
    cfg = write_kubeconfig(tmp_path / "kubeconfig", kube.url)
    named = await asyncio.to_thread(run, "-", "-o", "json", "--resolve", "--kubeconfig", cfg, "--context", "double",
                                    stdin=json.dumps(pod), env=env)
    assert named.returncode == 0, named.stderr
    skipped = [line for line in named.stderr.splitlines() if "notes" in line]
    assert len(skipped) == 1 and skipped[0].startswith("warning: pull secret skipped: "), named.stderr
    got = json.loads(named.stdout)
    step = next(c for c in got["spec"]["containers"] if c["name"] == "git-clone")
    assert "/bin/entry" in json.dumps(step)
    anonymous = await asyncio.to_thread(run, "-", "-o", "json", "--resolve", stdin=json.dumps(pod), env=env)
    assert anonymous.returncode == 3 and anonymous.stdout == "", anonymous.stderr
