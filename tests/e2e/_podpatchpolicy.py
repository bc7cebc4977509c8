"""The opt-in ValidatingAdmissionPolicy that narrows initshift's cluster-wide pod `patch`
(deploy/components/pod-patch-policy, the chart's `rbac.podPatchPolicy`) on the real
apiserver: the watcher's own writes pass it, and as initshift's ServiceAccount a label, an
image, another annotation, a second outcome and a write to a pod initshift does not manage
are denied with the policy's words; on a ~1.5 MB pod its CEL stays inside the apiserver's
runtime cost budget. admissionregistration.k8s.io/v1 is served from 1.30; on older clusters
the chart refuses the value against the apiserver instead."""

from __future__ import annotations

import datetime as dt
import json

import helm_python
import yaml

from waiter import protocol as p

from tests.support import deploy_render
from tests.support.deploy_render import CHART

from ._check import check_build
from ._env import Env, Record, check_report, scenario
from ._install import NAMESPACE, USER
from ._kube import kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC, NO_QUIT
from ._pods import annotations, managed, outcome, pod, step, wait_end

KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
VALUES = {"rbac": {"podPatchPolicy": True}}
SERVED_FROM = 30  # admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy: GA in 1.30
# The policy's words for each refusal (deploy/components/pod-patch-policy/policy.yaml).
NOT_MANAGED = "initshift may update only the pods it manages"
LABELS = "initshift may not change a pod's labels"
CONTAINERS = "initshift may not change a pod's containers or init containers (their images)"
OTHER_ANNOTATION = "initshift may change only its annotations initshift.io/ready, initshift.io/ready-<container> " \
                   "and initshift.io/outcome, not "
OUTCOME_ONCE = "initshift writes initshift.io/outcome once and may not change or remove it"
DEADLINE = "initshift may set spec.activeDeadlineSeconds only to 1 (ending the pod)"
# docs/install.md's large pod: 30 containers of 300 variables and 250 KB of annotations, 1.5 MB
# of JSON, near the most etcd stores (its default request limit, 1.5 MiB: values of 130 bytes
# make the pod too large for it); at this size the apiserver keeps no managedFields.
BIG_CONTAINERS, BIG_VARIABLES, BIG_VALUE = 30, 300, 104
BIG_SIZE = 1_500_000  # bytes of the pod's JSON as the apiserver returns it, at least
BIG_ANNOTATIONS, BIG_ANNOTATION_COUNT = 250_000, 50  # bytes of keys and values (the apiserver's limit: 256 KiB)


def policy_objects(env: Env) -> list[dict]:
    """The policy and its binding as the install's flavour renders them."""
    objects = deploy_render.helm(VALUES) if env.install.flavour == "helm" else \
        deploy_render.kustomize(".", ["components/pod-patch-policy"])
    return [o for o in objects if o["kind"] in KINDS]


def as_initshift(env: Env, *args: str) -> tuple[bool, str]:
    """kubectl ARGS as initshift's ServiceAccount (`--as`): whether it succeeded, what it said."""
    proc = kubectl(env.admin, *args, f"--as={USER}", check=False)
    return proc.returncode == 0, (proc.stderr or proc.stdout).strip()


def allowed(env: Env, *args: str) -> None:
    ok, said = as_initshift(env, *args)
    assert ok, f"kubectl {' '.join(args)} as {USER}: {said}"


def denied(env: Env, words: str, *args: str) -> str:
    ok, said = as_initshift(env, *args)
    assert not ok and "forbidden" in said.lower() and words in said, f"kubectl {' '.join(args)} as {USER}: {said}"
    return said


def _served(env: Env) -> bool:
    """ValidatingAdmissionPolicy (Kubernetes 1.30 or newer)"""
    return env.minor >= SERVED_FROM


def _unserved(env: Env) -> bool:
    """a cluster without ValidatingAdmissionPolicy (Kubernetes 1.29 or older)"""
    return not _served(env)


@scenario("pod-patch-policy", phase=2, applies=_served)
def pod_patch_policy(env: Env, rec: Record) -> None:
    """v1.30 and later (admissionregistration.k8s.io/v1): the pod-patch policy installed, the watcher's writes (the ready gate, outcomes, activeDeadlineSeconds) pass it; a label, an image, another annotation, a second outcome and an unmanaged pod are denied to initshift's ServiceAccount; on a 1.5 MB pod its writes pass and an image is denied, the CEL inside the apiserver's cost budget."""
    started = dt.datetime.now(dt.timezone.utc)  # the 403s this scenario answers for come after
    ns = env.namespace("podpatch")
    rec.namespaces.append(ns)
    objects = policy_objects(env)
    assert sorted(o["kind"] for o in objects) == sorted(KINDS), objects
    manifest = env.install.dir / "pod-patch-policy.yaml"
    manifest.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    # A long-running pod initshift leaves alone: what its ServiceAccount may not touch.
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", pod("other", [], [step("app", env.images.busybox, port=None,
                                                                             sleep=3600)], restart="Always"))
    probe = ("-n", ns, "annotate", "pod", "other", "--dry-run=server", f"{p.ANNOTATION_READY}=true")
    try:
        kubectl(env.admin, "apply", "--server-side", "--field-manager=initshift-e2e", "-f", str(manifest))
        # The apiserver loads policies through an informer: in force a moment later.
        wait_for(lambda: not as_initshift(env, *probe)[0], 30, "the policy in force", interval=0.5)
        denied(env, NOT_MANAGED, *probe)
        # `initshift check` finds it and that it names initshift's ServiceAccount.
        (line,) = [x for x in check_report(env, "-n", NAMESPACE)[1] if x["title"].startswith("pod-patch policy")]
        assert line["ok"] and line["installed"] and f"narrows {USER}'s" in line["title"], line
        _builds_under_the_policy(env, rec, ns, started)
        _big_pod_under_the_policy(env, rec)
    finally:
        kubectl(env.admin, "delete", "--ignore-not-found", "-f", str(manifest), check=False)
        wait_for(lambda: as_initshift(env, *probe)[0], 30, "the policy gone", interval=0.5)


def _builds_under_the_policy(env: Env, rec: Record, ns: str, started: dt.datetime) -> None:
    pods = f"/api/v1/namespaces/{ns}/pods"
    names = ["fetch", "build"]
    # `auto`'s build: the outcome is the watcher's one write.
    env.kube.create(pods, pod("build", [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in names],
                              [step("completion", env.images.busybox, port=None)]))
    # Under the waiter, a proxy without a quit endpoint and a sidecar of the pod's own whose
    # readiness the waiter cannot check on loopback (an exec probe): the watcher writes the
    # ready gate, then the outcome with activeDeadlineSeconds to end the sidecars.
    helper = step("helper", env.images.busybox, port=None, sleep=3600,
                  readinessProbe={"exec": {"command": ["true"]}, "periodSeconds": 1})
    env.kube.create(pods, pod("ended", [step(s, env.images.busybox, port=ISTIO_TRAFFIC) for s in names],
                              [step("completion", env.images.busybox, port=None), helper],
                              annotations={p.ANNOTATION_MODE: p.MODE_WAITER, NO_QUIT: "true",
                                           p.ANNOTATION_SIDECARS: "helper"}))
    build = check_build(env, rec, ns, "build", steps=names, proxy="istio-proxy", strategy=env.build_strategy)
    result = outcome(env.kube, ns, "build")
    assert result["result"] == "Succeeded", result
    ended = wait_end(env.kube, ns, "ended")
    assert managed(ended) == p.MODE_WAITER, managed(ended)
    assert ended["status"]["phase"] == "Failed" and ended["status"].get("reason") == "DeadlineExceeded", \
        ended["status"]
    assert ended["spec"].get("activeDeadlineSeconds") == 1, ended["spec"].get("activeDeadlineSeconds")
    assert annotations(ended).get(p.ANNOTATION_READY) == p.READY_TRUE, annotations(ended)
    stopped = outcome(env.kube, ns, "ended")
    assert stopped["result"] == "Succeeded" and stopped["sidecarsStoppedBy"] == "deadline", stopped
    forbidden = env.install.logs_forbidden(since=started)
    assert not forbidden, forbidden
    # As initshift's ServiceAccount, what the watcher never writes.
    label = denied(env, LABELS, "-n", ns, "label", "pod", "build", "e2e.initshift.io/x=1")
    image = denied(env, CONTAINERS, "-n", ns, "set", "image", "pod/build", f"completion={env.images.curl}")
    denied(env, OTHER_ANNOTATION + "e2e.initshift.io/x", "-n", ns, "annotate", "pod", "build", "e2e.initshift.io/x=1")
    denied(env, OTHER_ANNOTATION + p.ANNOTATION_STEPS, "-n", ns, "annotate", "--overwrite", "pod", "build",
           f"{p.ANNOTATION_STEPS}=[]")
    denied(env, OUTCOME_ONCE, "-n", ns, "annotate", "--overwrite", "pod", "build",
           f"{p.ANNOTATION_OUTCOME}={json.dumps({'result': 'Failed'})}")
    denied(env, DEADLINE, "-n", ns, "patch", "pod", "build", "--type=merge", "-p",
           json.dumps({"spec": {"activeDeadlineSeconds": 600}}))
    denied(env, NOT_MANAGED, "-n", ns, "patch", "pod", "other", "--type=merge", "-p",
           json.dumps({"spec": {"activeDeadlineSeconds": 1}}))
    # What it writes: an annotation of its own (a start-order pod's kind) is let through.
    allowed(env, "-n", ns, "annotate", "pod", "build", f"{p.ANNOTATION_READY_PREFIX}e2e=true")
    assert annotations(env.kube.pod(ns, "build") or {}).get(f"{p.ANNOTATION_READY_PREFIX}e2e") == "true"
    # Nobody else is bound by it: the admin's label goes through.
    kubectl(env.admin, "-n", ns, "label", "pod", "build", "e2e.initshift.io/x=1")
    rec.note(f"{managed(build.obj)} build: outcome {result['result']}; waiter build with a probe-less sidecar: "
             f"ready gate, outcome {stopped['result']} and activeDeadlineSeconds 1 (DeadlineExceeded) written "
             f"under the policy, no 403 in the watcher's log")
    rec.details.append(f"label as initshift: {label.split('denied request: ', 1)[-1]}")
    rec.details.append(f"image as initshift: {image.split('denied request: ', 1)[-1]}")


def big_pod(env: Env) -> dict:
    """docs/install.md's large pod, labelled as the watcher's (waiter); a scheduling gate keeps
    it from ever running: only its size matters here, to the policy's cost."""
    variables = [{"name": f"E2E_VAR_{i:03d}", "value": "v" * BIG_VALUE} for i in range(BIG_VARIABLES)]
    containers = [step(f"c{i:02d}", env.images.busybox, port=None, env=variables) for i in range(BIG_CONTAINERS)]
    keys = [f"e2e.initshift.io/bulk-{i:02d}" for i in range(BIG_ANNOTATION_COUNT)]
    each = BIG_ANNOTATIONS // BIG_ANNOTATION_COUNT
    return pod("big", [], containers, annotations={k: "a" * (each - len(k)) for k in keys},
               labels={p.LABEL_MANAGED: p.MODE_WAITER}, schedulingGates=[{"name": "e2e.initshift.io/never"}])


def _big_pod_under_the_policy(env: Env, rec: Record) -> None:
    """Each of the watcher's writes (webhook/watcher/_decide.py's merge patches) as initshift's
    ServiceAccount on the large pod: let through, none refused for the CEL's cost; a refused
    write is refused by its rule's message, not by the cost."""
    # A namespace without initshift or a mesh: no webhook rewrites the pod, only its label makes it managed.
    ns = env.namespace("podpatch-big", mesh=None, opted=False)
    rec.namespaces.append(ns)
    env.kube.create(f"/api/v1/namespaces/{ns}/pods", big_pod(env))
    stored = env.kube.pod(ns, "big") or {}
    size = len(json.dumps(stored, separators=(",", ":")))
    assert size >= BIG_SIZE, size
    result = {"result": "Succeeded", "failed": None, "message": "0 steps and 0 mains succeeded", "steps": [],
              "mains": [], "sidecarsStoppedBy": "deadline", "decidedAt": "2026-01-01T00:00:00Z"}  # no news: no Event
    patch = ("-n", ns, "patch", "pod", "big", "--type=merge", "-p")
    # The ready gate, then a start-order container's.
    allowed(env, *patch, json.dumps({"metadata": {"annotations": {p.ANNOTATION_READY: p.READY_TRUE}}}))
    allowed(env, *patch, json.dumps({"metadata": {"annotations": {f"{p.ANNOTATION_READY_PREFIX}c00": "true"}}}))
    # The outcome with the deadline, in one patch conditional on the pod's resourceVersion.
    rv = (env.kube.pod(ns, "big") or {})["metadata"]["resourceVersion"]
    written = {p.ANNOTATION_OUTCOME: json.dumps(result, separators=(",", ":"))}
    allowed(env, *patch, json.dumps({"metadata": {"annotations": written, "resourceVersion": rv},
                                     "spec": {"activeDeadlineSeconds": 1}}))
    # The containers' comparison, the one that reads the whole spec: the last container's image.
    image = denied(env, CONTAINERS, "-n", ns, "set", "image", "pod/big",
                   f"c{BIG_CONTAINERS - 1:02d}={env.images.curl}")
    after = env.kube.pod(ns, "big") or {}
    assert after["spec"].get("activeDeadlineSeconds") == 1, after["spec"].get("activeDeadlineSeconds")
    assert json.loads(annotations(after)[p.ANNOTATION_OUTCOME]) == result, annotations(after)
    assert annotations(after)[p.ANNOTATION_READY] == p.READY_TRUE, annotations(after)[p.ANNOTATION_READY]
    rec.note(f"a {size / 1e6:.2f} MB pod ({size} bytes of JSON; {BIG_CONTAINERS} containers "
             f"of {BIG_VARIABLES} variables, {BIG_ANNOTATIONS // 1000} KB of annotations): ready gate, "
             f"ready-<container>, outcome with activeDeadlineSeconds 1 let through as {USER}, an image refused "
             f"with the policy's words")
    rec.details.append(f"image on the large pod as initshift: {image.split('denied request: ', 1)[-1]}")


@scenario("pod-patch-unserved", applies=_unserved)
def pod_patch_policy_unserved(env: Env, rec: Record) -> None:
    """Before v1.30 (no admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy): the chart with rbac.podPatchPolicy=true fails against the apiserver naming the value; the component's objects are refused by the apiserver."""
    with helm_python.Config(kubeconfig_path=str(env.admin), namespace=NAMESPACE) as helm:
        try:
            helm.install(CHART, "e2e-pod-patch-policy", VALUES, namespace=NAMESPACE, dry_run="server")
        except helm_python.HelmError as exc:
            said = str(exc)
        else:
            raise AssertionError("helm install --dry-run=server with rbac.podPatchPolicy=true rendered on "
                                 f"v1.{env.minor}")
    assert "rbac.podPatchPolicy needs admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy" in said and \
        f"v1.{env.minor}." in said, said
    manifest = env.install.dir / "pod-patch-policy-unserved.yaml"
    manifest.write_text(yaml.safe_dump_all([o for o in deploy_render.kustomize(".", ["components/pod-patch-policy"])
                                            if o["kind"] in KINDS]))
    proc = kubectl(env.admin, "apply", "--dry-run=server", "-f", str(manifest), check=False)
    assert proc.returncode and "ValidatingAdmissionPolicy" in proc.stderr, (proc.returncode, proc.stderr)
    refused = proc.stderr[proc.stderr.find("no matches"):].strip().splitlines()[0]
    # `initshift check` reads no policy where the API is not served, and says so without failing.
    (line,) = [x for x in check_report(env, "-n", NAMESPACE)[1] if x["title"].startswith("pod-patch policy")]
    assert line["ok"] and not line["installed"], line
    rec.note(f"helm: {said[said.index('rbac.podPatchPolicy needs'):].splitlines()[0]}; kubectl apply of the "
             f"component: {refused}")

