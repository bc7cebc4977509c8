"""An operator's second day with initshift's own Pods serving (the install's Deployment as
shipped, two replicas, the image from this machine's Python in the run's registry, as
`server-pod` runs them), builds running all along: the image upgraded in place (the
Deployment's image and INITSHIFT_IMAGE moved to a new tag, as `helm upgrade --set
image.tag=NEW` and kustomize's `newTag` move them, and a setting changed: the chart's
`strategy`), the node drained behind the install's PodDisruptionBudget (and what `initshift
check` says meanwhile), the watcher's leading Pod deleted, and a namespace opted out and
back in. Every build created meanwhile ends, each with its outcome written exactly once (a
pod watch records every value the annotation took) and one outcome Event."""

from __future__ import annotations

import copy
import json
import threading
import time
from typing import Callable


from waiter import protocol as p

from ._env import Env, Record, check_report, scenario
from ._images import server_image
from ._install import NAMESPACE
from ._kube import PodWatch, kubectl, wait_for
from ._mesh import ISTIO_TRAFFIC
from ._pods import ENDED, managed, pod, step
from ._serverpod import POD_START_TIMEOUT, REPOSITORY, ready_pods, shapes

OUTCOME_EVENTS = ("StepsSucceeded", "StepsFailed")


def _applies(env: Env) -> bool:
    """a cluster this run starts, with its local registry (the server's image)"""
    return env.cluster is not None and env.registry is not None


class Builds:
    """Build pods created now and then, each with a step that calls through the proxy and
    sleeps, and a main."""

    def __init__(self, env: Env, ns: str, prefix: str) -> None:
        self.env, self.ns, self.prefix = env, ns, prefix
        self.names: list[str] = []

    def _body(self, name: str, sleep: float, exit_code: int = 0) -> dict:
        return pod(name, [step("fetch", self.env.images.busybox, port=ISTIO_TRAFFIC, sleep=sleep, exit_code=exit_code)],
                   [step("completion", self.env.images.busybox, port=None)])

    def create(self, sleep: float = 3, exit_code: int = 0) -> str:
        name = f"{self.prefix}-{len(self.names)}"
        self.env.kube.create(f"/api/v1/namespaces/{self.ns}/pods", self._body(name, sleep, exit_code))
        self.names.append(name)
        return name

    def admitted_as(self) -> str | None:
        """How a build created now would be admitted (a server-side dry run): its strategy,
        or None when unchanged. The apiserver reads a namespace's labels for the webhook's
        `namespaceSelector` from its informer: a label change reaches it a moment later."""
        return managed(self.env.kube.request("POST", f"/api/v1/namespaces/{self.ns}/pods",
                                             body=self._body(f"{self.prefix}-probe", 0), params={"dryRun": "All"}))

    def during(self, action: Callable[[], object], every: float = 1.0) -> object:
        """`action()` while a build is created every `every` seconds; its result."""
        stop = threading.Event()

        def stream() -> None:
            while not stop.wait(every):
                self.create()

        t = threading.Thread(target=stream, daemon=True)
        self.create()
        t.start()
        try:
            return action()
        finally:
            stop.set()
            t.join(30)

    def ended(self, outcomes: PodWatch, timeout: float = 120) -> dict[str, dict]:
        """Every build ended, each managed one with one outcome value and one outcome Event:
        name -> the pod."""
        kube = self.env.kube

        def done() -> dict[str, dict] | None:
            pods = {x["metadata"]["name"]: x for x in kube.pods(self.ns) if x["metadata"]["name"] in self.names}
            return pods if len(pods) == len(self.names) and all(
                (x.get("status") or {}).get("phase") in ENDED for x in pods.values()) else None

        pods = wait_for(done, timeout, f"every build in {self.ns} ended", interval=1.0)
        for name, obj in pods.items():
            if managed(obj) not in (p.MODE_WAITER, p.MODE_HYBRID):
                continue
            try:
                wait_for(lambda: outcomes.values(self.ns, name) or None, 60, f"the outcome of {self.ns}/{name}")
            except Exception:  # noqa: BLE001 - said with what the watch met
                raise AssertionError(f"no outcome seen for {self.ns}/{name}; the watch: {outcomes.errors[-5:]}") \
                    from None
            values = outcomes.values(self.ns, name)
            assert len(values) == 1, f"{self.ns}/{name}: the outcome written {len(values)} times: {sorted(values)}"
            events = [e for e in kube.events(self.ns, name) if e.get("reason") in OUTCOME_EVENTS]
            assert len(events) == 1 and events[0].get("count", 1) == 1, \
                f"{self.ns}/{name}: outcome Events {[(e['reason'], e.get('count')) for e in events]}"
        return pods


def summary(pods: dict[str, dict]) -> str:
    counts: dict[str, int] = {}
    for obj in pods.values():
        key = f"{managed(obj) or 'unchanged'} {obj['status']['phase']}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def _lease(env: Env) -> dict:
    lease = env.install.env.get("INITSHIFT_LEASE_NAME", "initshift-watcher")
    return env.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{lease}") or {}


def _server_log(env: Env, name: str) -> list[dict]:
    return [json.loads(line) for line in env.kube.logs(NAMESPACE, name, "initshift", timestamps=False).splitlines()
            if line.startswith("{")]


def _leading_pod(env: Env, selector: str) -> str | None:
    holder = str((_lease(env).get("spec") or {}).get("holderIdentity") or "")
    return next((x["metadata"]["name"] for x in env.kube.pods(NAMESPACE, selector) if holder and any(
        y.get("msg") == "leading" and y.get("identity") == holder for y in _server_log(env, x["metadata"]["name"]))),
        None)


def _upgraded(deployment: dict, ref: str, settings: dict[str, str]) -> dict:
    """The Deployment with its image and INITSHIFT_IMAGE at `ref`, as `helm upgrade --set
    image.tag=` and kustomize's `images:` move them, and these variables set, as a value of
    the chart's given again (`strategy`: INITSHIFT_MODE)."""
    moved = copy.deepcopy(deployment)
    (container,) = moved["spec"]["template"]["spec"]["containers"]
    container["image"] = ref
    values = {"INITSHIFT_IMAGE": ref, **settings}
    container["env"] = [e for e in container["env"] if e["name"] not in values] + [
        {"name": k, "value": v} for k, v in values.items()]
    return moved


@scenario("second-day", phase=2, applies=_applies)
def second_day(env: Env, rec: Record) -> None:
    """initshift's own Pods upgraded in place (a new image tag), their watcher's leader
    deleted, the node drained behind the PodDisruptionBudget and a namespace opted out and
    in, builds running throughout: each build ends with its outcome written once."""
    assert env.registry is not None and env.install.watcher is not None
    image = server_image()
    tag = image.ref.rsplit(":", 1)[1]
    for t in (tag, f"{tag}-next"):
        env.registry.push(image, REPOSITORY, t)
    ref = f"{env.registry.host}/{REPOSITORY}:{tag}"
    shape = shapes(env, ref)[0]
    rendered = shape.objects
    original = {o["kind"]: o for o in env.install.objects if o["kind"] in ("Deployment", "Service")}
    config = next(o for o in env.install.objects if o["kind"] == "MutatingWebhookConfiguration")["metadata"]["name"]
    config_path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{config}"
    saved = env.kube.get(config_path)
    selector = ",".join(f"{k}={v}" for k, v in rendered["Deployment"]["spec"]["selector"]["matchLabels"].items())
    deployment = f"deployment/{rendered['Deployment']['metadata']['name']}"
    manifest = env.install.dir / "second-day.yaml"
    node = "localhost"

    def apply(objects: list[dict]) -> None:
        manifest.write_text("\n---\n".join(json.dumps(o) for o in objects))
        kubectl(env.admin, "apply", "--server-side", "--force-conflicts", "--field-manager=initshift-e2e",
                "-f", str(manifest))

    def ready(exclude: set[str] = frozenset()) -> list[dict] | None:
        pods = [x for x in ready_pods(env, selector) if x["metadata"]["name"] not in exclude]
        return pods if len(pods) == shape.replicas else None

    ns = env.namespace("second-day")
    out_ns = env.namespace("second-day-out")
    rec.namespaces += [ns, out_ns]
    outcomes = PodWatch(env.admin, [ns, out_ns], p.ANNOTATION_OUTCOME)
    notes: list[str] = []
    begun = time.monotonic()

    def note(text: str) -> None:
        notes.append(f"[{time.monotonic() - begun:.0f} s] {text}")

    try:
        apply(list(rendered.values()))
        started = time.monotonic()
        wait_for(ready, POD_START_TIMEOUT, "initshift's own Pods Ready", interval=1.0)
        note(f"{shape.replicas} replicas Ready in {time.monotonic() - started:.0f} s")
        env.install.watcher.stop()
        wait_for(lambda: _leading_pod(env, selector), 60, "a Pod's watcher leading")
        by_service = copy.deepcopy(env.kube.get(config_path))
        for wh in by_service["webhooks"]:
            wh["clientConfig"] = {"service": {"namespace": NAMESPACE, "name": rendered["Service"]["metadata"]["name"],
                                              "port": 443, "path": "/mutate"},
                                  "caBundle": wh["clientConfig"]["caBundle"]}
        env.kube.request("PUT", config_path, body=by_service)

        # 1. The upgrade: a new tag and another strategy (a setting the chart turns into
        # INITSHIFT_MODE), applied while builds are created; one created after the rollout
        # has the new setting.
        builds = Builds(env, ns, "upgrade")
        before = _lease(env)
        old = {x["metadata"]["name"] for x in ready() or []}
        next_ref = f"{env.registry.host}/{REPOSITORY}:{tag}-next"
        started = time.monotonic()

        def upgrade() -> None:
            apply([_upgraded(rendered["Deployment"], next_ref, {"INITSHIFT_MODE": p.MODE_WAITER})])
            kubectl(env.admin, "-n", NAMESPACE, "rollout", "status", deployment, "--timeout=150s")

        builds.during(upgrade, every=1.5)
        rolled = time.monotonic() - started
        new = wait_for(lambda: ready(old), 60, "the upgraded Pods Ready", interval=1.0)
        assert {x["spec"]["containers"][0]["image"] for x in new} == {next_ref}
        # The old leader keeps the Lease through its preStop sleep, then gives it up.
        leader = wait_for(lambda: (x := _leading_pod(env, selector)) not in old and x or None, 60,
                          "a new Pod's watcher leading")
        wait_for(lambda: not [x for x in env.kube.pods(NAMESPACE, selector) if x["metadata"]["name"] in old], 60,
                 "the old Pods gone")
        last = builds.create(sleep=0)
        pods = builds.ended(outcomes)
        assert managed(pods[last]) == p.MODE_WAITER, f"{last} after the upgrade: {managed(pods[last])}"
        # Under failurePolicy Ignore a rollout can let a rare pod through unchanged
        # (docs/install.md, Upgrade): it ends as without initshift; every rewritten one succeeds.
        assert all(x["status"]["phase"] == "Succeeded" for x in pods.values() if managed(x)), summary(pods)
        after = _lease(env)
        transitions = (after["spec"].get("leaseTransitions") or 0) - (before["spec"].get("leaseTransitions") or 0)
        note(f"upgrade to {tag}-next and strategy waiter in {rolled:.1f} s under {len(pods) - 1} builds, "
                     f"one after: {summary(pods)}, each outcome once; Lease moved {transitions} time(s), now "
                     f"{leader}")

        # 2. The node cordoned and drained of initshift's Pods, behind the budget: one replica
        # evicted, its replacement Pending (the one node is cordoned), the other kept by the
        # budget until the drain times out.
        builds = Builds(env, ns, "drain")
        builds.create(sleep=4)
        kubectl(env.admin, "cordon", node)
        try:
            started = time.monotonic()
            drained = kubectl(env.admin, "drain", node, "--pod-selector", selector, "--timeout=10s",
                              "--delete-emptydir-data", "--ignore-daemonsets", check=False)
            took = time.monotonic() - started
            assert drained.returncode and "global timeout reached" in drained.stderr, drained
            code, lines = check_report(env, "-n", NAMESPACE)
            builds.create(sleep=0)
            said = {x["title"]: x for x in lines if x["section"] == "deployment"}
            replicas = next(x for t, x in said.items() if "replicas Ready" in t)
            assert not replicas["ok"] and replicas["title"].endswith("1 of 2 replicas Ready"), replicas
            assert "unschedulable" in replicas["hint"], replicas
            budget = next(x for t, x in said.items() if t.startswith("PodDisruptionBudget"))
            assert budget["disruptionsAllowed"] == 0 and "until the ones not Ready" in budget["hint"], budget
            assert next(x for x in lines if x["section"] == "watcher")["ok"]
            note(f"drain ({took:.0f} s, exit {drained.returncode}: "
                         f"{drained.stderr.strip().splitlines()[-1]}); check meanwhile: ✘ {replicas['title']} "
                         f"({replicas['hint']}); ✔ {budget['title']} ({budget['hint']})")
        finally:
            kubectl(env.admin, "uncordon", node)
        pods = builds.ended(outcomes)
        note(f"{len(pods)} builds across the drain: {summary(pods)}, each outcome once")

        # 3. The leading Pod deleted while builds run (the drain's replacement starting).
        leader = wait_for(lambda: _leading_pod(env, selector), 30, "a Pod's watcher leading")
        builds = Builds(env, ns, "leader")
        for _ in range(3):
            builds.create(sleep=3)
        time.sleep(2)
        deleted = time.monotonic()
        kubectl(env.admin, "-n", NAMESPACE, "delete", "pod", leader, "--wait=false")
        taker = wait_for(lambda: (x := _leading_pod(env, selector)) != leader and x or None, 60,
                         "another Pod's watcher leading")
        took = time.monotonic() - deleted
        builds.create(sleep=0)
        pods = builds.ended(outcomes)
        note(f"leader {leader} deleted: {taker} leading {took:.1f} s later; {len(pods)} builds: "
                     f"{summary(pods)}, each outcome once")

        # 4. A namespace opted out while a build runs there, then in again.
        builds = Builds(env, out_ns, "optout")
        running = builds.create(sleep=3)
        wait_for(lambda: managed(env.kube.pod(out_ns, running) or {}), 30, "the build rewritten")
        kubectl(env.admin, "label", "namespace", out_ns, f"{p.LABEL_NAMESPACE_ENABLED}-")
        wait_for(lambda: builds.admitted_as() is None, 30, "the opt-out in force")
        outside = builds.create(sleep=0)
        kubectl(env.admin, "label", "namespace", out_ns, f"{p.LABEL_NAMESPACE_ENABLED}=true")
        wait_for(lambda: builds.admitted_as() == p.MODE_WAITER, 30, "the opt-in in force")
        inside = builds.create(sleep=0)
        pods = builds.ended(outcomes)
        assert (managed(pods[running]), pods[running]["status"]["phase"]) == (p.MODE_WAITER, "Succeeded")
        assert managed(pods[outside]) is None and pods[outside]["status"]["phase"] == "Failed"
        assert (managed(pods[inside]), pods[inside]["status"]["phase"]) == (p.MODE_WAITER, "Succeeded")
        note(f"opt-out: {running} {managed(pods[running])} Succeeded, created outside unchanged "
                     f"Failed (its step's call refused: no proxy yet), back in {managed(pods[inside])} Succeeded")
    finally:
        outcomes.close()
        env.kube.request("PUT", config_path, body={**saved, "metadata": {
            **saved["metadata"], "resourceVersion": env.kube.get(config_path)["metadata"]["resourceVersion"]}})
        kubectl(env.admin, "uncordon", node, check=False)
        apply(list(original.values()))
        wait_for(lambda: not env.kube.pods(NAMESPACE, selector), 90, "initshift's own Pods gone", interval=1.0)
        if not env.install.watcher.alive():
            env.install.start_watcher()
        pod_prefix = f"{rendered['Deployment']['metadata']['name']}-"
        wait_for(lambda: (x := env.install.lease_holder(env.kube)) and not x.startswith(pod_prefix) or None, 60,
                 "this machine's watcher leading")
        note("initshift's own Pods gone, this machine's watcher leading")
        rec.details += notes
