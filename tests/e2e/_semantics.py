"""What a user sees of a pod, with and without initshift: the same pod run in a namespace
initshift does not serve (the kubelet's own semantics) and under each strategy the waiter
runs, compared field by field where initshift promised to keep them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from waiter import protocol as p

from ._env import Env, Record, initshift, scenario, waiter_modes
from ._kube import wait_for
from ._pods import annotations, log_lines, managed, outcome, pod, statuses, step, terminated, wait_end

_FAILURE = "compile: error: undefined symbol main"


def _each(env: Env, rec: Record, short: str, build) -> dict[str, dict]:
    """The pod `build(name)` made once in a namespace without initshift ("kubelet") and
    once per waiter strategy in an opted-in one under the Istio-like mesh; each ended."""
    plain = env.namespace(f"{short}-plain", mesh=None, opted=False)
    opted = env.namespace(short)
    rec.namespaces += [plain, opted]
    runs = {"kubelet": (plain, build(f"{short}-kubelet"))}
    for mode in waiter_modes(env):
        obj = build(f"{short}-{mode}")
        obj["metadata"]["annotations"][p.ANNOTATION_MODE] = mode
        runs[mode] = (opted, obj)
    for ns, obj in runs.values():
        env.kube.create(f"/api/v1/namespaces/{ns}/pods", obj)
    with ThreadPoolExecutor(len(runs)) as pool:
        ended = dict(zip(runs, pool.map(lambda r: wait_end(env.kube, r[0], r[1]["metadata"]["name"]), runs.values())))
    for mode, obj in ended.items():
        if mode != "kubelet":
            assert managed(obj) == mode, f"{mode}: the pod was not rewritten ({managed(obj)})"
    return {mode: {"ns": runs[mode][0], "pod": obj} for mode, obj in ended.items()}


@scenario("termination-fallback")
def termination_fallback(env: Env, rec: Record) -> None:
    """A step with `terminationMessagePolicy: FallbackToLogsOnError` that fails: its
    termination message is its log's last line under the waiter and hybrid as without
    initshift (it was the waiter's JSON record), a step of that policy that succeeds has
    none, as without initshift, and the outcome names the failure in the step's words."""
    def build(name: str) -> dict:
        fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
        return pod(name, [step("prepare", env.images.busybox, port=None, **fallback),
                          {"name": "compile", "image": env.images.busybox, "imagePullPolicy": "IfNotPresent",
                           "command": ["sh", "-c", f'echo "{_FAILURE}"; exit 2'], **fallback}],
                   [step("package", env.images.busybox, port=None)])

    seen = _each(env, rec, "tmsg", build)
    kubelet = terminated(seen["kubelet"]["pod"], "compile")
    assert kubelet and kubelet["exitCode"] == 2, kubelet
    assert kubelet.get("message") == f"{_FAILURE}\n", f"the kubelet's own fallback: {kubelet}"
    assert not (terminated(seen["kubelet"]["pod"], "prepare") or {}).get("message")
    for mode in waiter_modes(env):
        obj = seen[mode]["pod"]
        ran = terminated(obj, "compile")
        assert ran and ran["exitCode"] == 2, f"{mode}: {ran}"
        assert ran.get("message") == kubelet["message"], f"{mode}: {ran.get('message')!r}, the kubelet's " \
                                                         f"{kubelet['message']!r}"
        assert not (terminated(obj, "prepare") or {}).get("message"), f"{mode}: {terminated(obj, 'prepare')}"
        said = outcome(env.kube, seen[mode]["ns"], obj["metadata"]["name"])
        assert said["result"] == "Failed" and said["failed"] == "compile", said
        # A failure as the program's, not a waiter that never completed: what follows skips
        # and the pod ends as its containers do, not by the watcher's deadline.
        assert said["message"].startswith(f"compile failed: Error (exit 2): {_FAILURE}"), said["message"]
        assert [m["reason"] for m in said["mains"]] == [p.REASON_SKIPPED], said["mains"]
        assert obj["status"].get("reason") != "DeadlineExceeded", f"{mode}: {obj['status']}"
    rec.note(f"compile's message {kubelet['message'].strip()!r} under {', '.join(waiter_modes(env))} as without "
             f"initshift; the outcome quotes it")


@scenario("request-env")
def request_env(env: Env, rec: Record) -> None:
    """Steps whose variables read their own requests and limits (`resourceFieldRef`): under
    the waiter and hybrid each prints what it prints without initshift, though the steps
    now run with their share of the pod's budget (`preserve`: 0 for all but one)."""
    refs = {"REQ_CPU": ("requests.cpu", "1m"), "REQ_MEM": ("requests.memory", "1Mi"),
            "LIM_CPU": ("limits.cpu", "1m"), "LIM_MEM": ("limits.memory", "1Mi")}
    env_vars = [{"name": n, "valueFrom": {"resourceFieldRef": {"resource": r, "divisor": d}}}
                for n, (r, d) in refs.items()]
    line = " ".join(f"{n}=${n}" for n in refs)

    def st(name: str, cpu: str, memory: str) -> dict:
        return step(name, env.images.busybox, port=None, extra=f'echo "{name} {line}"; ', env=env_vars,
                    resources={"requests": {"cpu": cpu, "memory": memory},
                               "limits": {"cpu": "500m", "memory": "256Mi"}})

    def build(name: str) -> dict:
        return pod(name, [st("fetch", "100m", "32Mi"), st("compile", "300m", "128Mi")], [st("package", "50m", "16Mi")])

    seen = _each(env, rec, "reqenv", build)

    def printed(mode: str) -> dict[str, str]:
        obj = seen[mode]["pod"]
        assert obj["status"]["phase"] == "Succeeded", f"{mode}: {obj['status'].get('phase')}"
        out = {}
        for c in ("fetch", "compile", "package"):
            lines = [x.text for x in log_lines(env.kube, seen[mode]["ns"], obj["metadata"]["name"], c)
                     if x.text.startswith(f"{c} REQ_")]
            assert len(lines) == 1, f"{mode}/{c}: {lines}"
            out[c] = lines[0]
        return out

    kubelet = printed("kubelet")
    assert kubelet["fetch"] == "fetch REQ_CPU=100 REQ_MEM=32 LIM_CPU=500 LIM_MEM=256", kubelet
    for mode in waiter_modes(env):
        assert printed(mode) == kubelet, f"{mode}: {printed(mode)}, without initshift {kubelet}"
        fetch = next(c for c in seen[mode]["pod"]["spec"]["containers"] if c["name"] == "fetch")
        assert fetch["resources"]["requests"]["cpu"] != "100m", "the step's request is the budget's share"
    rec.note(f"each step printed what it prints without initshift under {', '.join(waiter_modes(env))} "
             f"({kubelet['fetch']})")


@scenario("failed-then-uncreatable")
def failed_then_uncreatable(env: Env, rec: Record) -> None:
    """A step fails before a step whose container the kubelet cannot create (an image the
    node does not have, `imagePullPolicy: Never`: ErrImageNeverPull). Without initshift the
    pod ends Failed at once, the later init containers never created; under the waiter and
    hybrid that container never runs to skip, and the watcher ends the pod, its outcome
    naming both."""
    def build(name: str) -> dict:
        return pod(name, [step("fetch", env.images.busybox, port=None, exit_code=3),
                          {"name": "compile", "image": "initshift.invalid/absent:1", "imagePullPolicy": "Never",
                           "command": ["sh", "-c", "echo compile"]},
                          step("package", env.images.busybox, port=None)],
                   [step("report", env.images.busybox, port=None)])

    seen = _each(env, rec, "uncreatable", build)
    assert seen["kubelet"]["pod"]["status"]["phase"] == "Failed", seen["kubelet"]["pod"]["status"]
    for mode in waiter_modes(env):
        obj = seen[mode]["pod"]
        assert obj["status"]["phase"] == "Failed", f"{mode}: {obj['status']}"
        said = outcome(env.kube, seen[mode]["ns"], obj["metadata"]["name"])
        assert said["result"] == "Failed" and said["failed"] == "fetch", f"{mode}: {said}"
        assert said["message"].endswith("compile cannot start (ErrImageNeverPull)"), f"{mode}: {said['message']}"
    rec.note(f"ended Failed under {', '.join(waiter_modes(env))} as without initshift; the outcome: "
             f"{said['message']!r}")


_ABSENT = "initshift.invalid/absent:1"  # a registry that does not resolve: ErrImagePull, then ImagePullBackOff


@scenario("unpullable-copy")
def unpullable_copy(env: Env, rec: Record) -> None:
    """initshift's own container (`initshift-copy` under hybrid, `initshift-init` under the
    waiter) cannot be pulled, as on a node without the registry's credentials: the pod as the
    webhook and the mesh admitted it (a server-side dry run), that image made unpullable,
    created where no webhook touches it. Under hybrid the kubelet starts the steps and the
    main anyway, each a StartError (exit 128, the waiter absent, its start the Unix epoch),
    and the watcher ends the pod Failed, its outcome naming the step and initshift-copy; under
    the waiter the pod waits at its init container, as without initshift."""
    opted, plain = env.namespace("unpull"), env.namespace("unpull-plain", mesh=None, opted=False)
    rec.namespaces += [opted, plain]

    def build(name: str, mode: str | None) -> dict:
        obj = pod(name, [step("fetch", env.images.busybox, port=None), step("compile", env.images.busybox, port=None)],
                  [step("report", env.images.busybox, port=None)])
        if mode is None:  # without initshift: an init container that cannot be pulled
            obj["spec"]["initContainers"][1] |= {"image": _ABSENT}
            return obj
        obj["metadata"]["annotations"][p.ANNOTATION_MODE] = mode
        admitted = env.kube.request("POST", f"/api/v1/namespaces/{opted}/pods", body=obj, params={"dryRun": "All"})
        assert managed(admitted) == mode, f"{mode}: {managed(admitted)}"
        own = p.COPY_CONTAINER_NAME if mode == p.MODE_HYBRID else "initshift-init"
        found = [c for c in admitted["spec"].get("initContainers", []) + admitted["spec"]["containers"]
                 if c["name"] == own]
        assert found, f"{mode}: no {own}"
        found[0] |= {"image": _ABSENT, "imagePullPolicy": "IfNotPresent"}
        meta = {k: admitted["metadata"][k] for k in ("name", "labels", "annotations")}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": admitted["spec"]}

    names = {"kubelet": "unpull-kubelet", **{m: f"unpull-{m}" for m in waiter_modes(env)}}
    for mode, name in names.items():
        env.kube.create(f"/api/v1/namespaces/{plain}/pods", build(name, None if mode == "kubelet" else mode))

    def stuck(name: str, container: str) -> dict | None:
        obj = env.kube.pod(plain, name)
        waiting = (statuses(obj).get(container) or {}).get("state", {}).get("waiting") or {}
        return obj if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") else None

    kubelet = wait_for(lambda: stuck(names["kubelet"], "compile"), 90, "the kubelet's pull failure")
    notes = [f"without initshift: {kubelet['status']['phase']}, compile {_waiting(kubelet, 'compile')}"]
    if p.MODE_HYBRID in names:
        name = names[p.MODE_HYBRID]
        # What the kubelet does: the steps and the main attempted while the copier waits.
        seen = wait_for(lambda: (lambda o: o if all(terminated(o, c) for c in ("fetch", "compile", "report"))
                                 else None)(env.kube.pod(plain, name)), 90, "the steps' ends")
        copier = f"{_waiting(seen, p.COPY_CONTAINER_NAME)} while the pod was {seen['status']['phase']}"
        obj = wait_end(env.kube, plain, name, timeout=120)
        said = outcome(env.kube, plain, name)
        fetch = terminated(obj, "fetch") or {}
        notes.append(f"hybrid: {obj['status']['phase']}/{obj['status'].get('reason')}, initshift-copy {copier}, "
                     f"fetch {fetch.get('reason')} {fetch.get('exitCode')} startedAt {fetch.get('startedAt')}; "
                     f"outcome {said['message']!r}, stopped by {said['sidecarsStoppedBy']}")
        assert obj["status"]["phase"] == "Failed", obj["status"]
        assert fetch.get("reason") == "StartError" and fetch.get("exitCode") == 128, fetch
        assert said["result"] == "Failed" and said["failed"] == "fetch", said
        assert f"; {p.COPY_CONTAINER_NAME} cannot start (" in said["message"], said["message"]
        assert "no such file or directory" in said["message"], "the runtime's why, at its message's end"
        assert said["sidecarsStoppedBy"] == "deadline", said
        assert all(s["startedAt"] is None for s in said["steps"] + said["mains"]), said
        shown = initshift(env, "status", name, "-n", plain)
        assert "00:00:00Z" not in shown.stdout and "498913h" not in shown.stdout, shown.stdout
    if p.MODE_WAITER in names:
        name = names[p.MODE_WAITER]
        obj = wait_for(lambda: stuck(name, "initshift-init"), 90, "initshift-init's pull failure")
        time.sleep(10)  # time for anything to run ahead of it (nothing should)
        obj = env.kube.pod(plain, name)
        assert obj["status"]["phase"] == kubelet["status"]["phase"] == "Pending", (obj["status"], kubelet["status"])
        assert not any("terminated" in s["state"] or "running" in s["state"]
                       for s in obj["status"].get("containerStatuses", [])), obj["status"]
        assert p.ANNOTATION_OUTCOME not in annotations(obj), "the watcher waits out the sidecar timeout"
        notes.append(f"waiter: {obj['status']['phase']}, initshift-init {_waiting(obj, 'initshift-init')}, "
                     f"nothing else started (as without initshift)")
    rec.note("; ".join(notes))


def _waiting(obj: dict, container: str) -> str:
    """The container's state as `kubectl describe` names it: "ImagePullBackOff", "terminated"."""
    state = (statuses(obj).get(container) or {}).get("state") or {}
    return str((state.get("waiting") or {}).get("reason") or next(iter(state), "no status"))
