"""`initshift mutate` as a user runs it: a real subprocess of the installed console script."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.fixtures import pods
from waiter import protocol as p
from tests.support.patching import apply_patch

ROOT = Path(__file__).resolve().parents[2]
INITSHIFT = [sys.executable, "-m", "webhook.cli"]


def run(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*INITSHIFT, "mutate", *args], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)


def istio_job_yaml() -> str:
    return yaml.safe_dump(pods.catalogue()["job-istio"])


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
    assert diff.stdout.startswith("--- pod\n+++ pod (initshift)\n") and "+  - name: initshift-init" in diff.stdout


def test_admission_review_input(tmp_path):
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "1", "namespace": "builds", "object": pods.catalogue()["kpack-istio"]}}
    f = tmp_path / "review.json"
    f.write_text(json.dumps(review))
    out = run(str(f), "-o", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER


def test_unchanged_pod_warns_and_check_exit_code():
    job = yaml.safe_dump(pods.catalogue()["job"])
    out = run("-", stdin=job)
    assert out.returncode == 0 and yaml.safe_load(out.stdout) == pods.not_rewritten(pods.catalogue()["job"], "no-sidecar")
    assert "warning: initshift: no sidecar" in out.stderr
    assert run("-", "--check", stdin=job).returncode == 1
    patch = run("-", "-o", "patch", stdin=job)
    assert patch.returncode == 0, patch.stderr  # the reason recorded, nothing else
    assert apply_patch(pods.catalogue()["job"], json.loads(patch.stdout)) == yaml.safe_load(out.stdout)


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
