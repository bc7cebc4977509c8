"""`initshift check --smoke`: a tiny build pod through the double (which calls the real
initshift server and injects Istio like the apiserver would), a kubelet player writing
the pod's status, and the real watcher."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import re

import pytest

from tests.cli.test_check import failed
from tests.support import docs
from tests.support import install as inst
from tests.support.kubedouble import KubeDouble, running, terminated
from waiter import protocol as p
from webhook.cli import _check as check_cmd
from webhook.cli._check_smoke import SmokeOptions, smoke_pod

BOUND = 60.0  # the whole run; a bug fails instead of hanging


async def smoke(i: inst.Install, namespace: str, *more: str, hold: str | None = None,
                waiter_first: bool = False, forwarded: bool = False,
                kubelet_type: type[inst.Kubelet] = inst.Kubelet) -> tuple[int, list[str], str]:
    """Run the check with --smoke while a kubelet plays the pod; (exit code, smoke lines, output).
    `forwarded`: as from a workstation, the server reached through a port-forward (no --service-url)."""
    kubelet = kubelet_type(i.kube, namespace, hold=hold, waiter_first=waiter_first)
    player = asyncio.ensure_future(kubelet.run())
    out, err = io.StringIO(), io.StringIO()
    try:
        argv = ["--kubeconfig", i.kubeconfig, "--smoke", namespace, *more] if forwarded else \
            i.argv("--smoke", namespace, *more)
        code = await asyncio.wait_for(check_cmd.run(argv, out, err), BOUND)
    finally:
        player.cancel()
        await asyncio.gather(player, return_exceptions=True)
    text = out.getvalue()
    section = text.split("smoke\n-----\n", 1)[1] if "smoke\n-----\n" in text else ""
    return code, [line for line in section.splitlines() if line[:1] in ("✔", "✘")], text


def titles(lines: list[str]) -> list[str]:
    return [line[2:] for line in lines]


def starts(lines: list[str], *prefixes: str) -> None:
    assert len(lines) == len(prefixes), "\n".join(lines)
    for line, prefix in zip(lines, prefixes):
        assert line.startswith(prefix), (line, prefix)
    latency = [line for line in lines if "started after the sidecar was Ready" in line]
    assert all(re.search(r"\(\d+\.\d\ds after the sidecar started\)$", line) for line in latency), latency


async def test_waiter_strategy_under_istio(kube: KubeDouble, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # from a workstation
    async with inst.healthy(kube, tmp_path) as i:
        code, lines, out = await smoke(i, inst.BUILDS, forwarded=True)
    assert code == 0 and failed(out) == [], out
    starts(lines, "✔ created pod builds/initshift-smoke-", "✔ rewritten by initshift (strategy waiter)",
           "✔ sidecar istio-proxy Ready", "✔ step 0 started after the sidecar was Ready (",
           "✔ steps ran in order: step-0 ", "✔ pod ended Succeeded (phase Succeeded); sidecar stopped by quit",
           f"✔ {p.ANNOTATION_OUTCOME}: Succeeded (2 steps and 1 main succeeded)", "✔ deleted pod builds/initshift-smoke-",
           *JOB_LINES)
    assert kube.items("pods", inst.BUILDS) == []
    assert _normal(out) == _normal(docs_sample()), "docs/install.md's sample is this run's output"


# The Job-shaped pod after the build pod, under the waiter strategy: its main gated and quitting.
JOB_LINES = ("✔ created Job-shaped pod builds/initshift-smoke-job-", "✔ rewritten by initshift (strategy waiter)",
             "✔ sidecar istio-proxy Ready", "✔ main started after the sidecar was Ready (",
             "✔ pod ended Succeeded (phase Succeeded); sidecar stopped by quit",
             f"✔ {p.ANNOTATION_OUTCOME}: Succeeded (1 main succeeded)", "✔ deleted pod builds/initshift-smoke-job-")


def native_job_lines(last: str) -> tuple[str, ...]:
    """The Job-shaped pod where native sidecars run: the proxy made native, no waiter, no outcome."""
    return ("✔ created Job-shaped pod builds/initshift-smoke-job-", "✔ rewritten by initshift (strategy native)",
            "✔ sidecar istio-proxy Ready", "✔ main started after the sidecar was Ready (",
            "✔ pod ended Succeeded (phase Succeeded); sidecar stopped by istio-proxy Completed (exit 0)",
            f"✔ no {p.ANNOTATION_OUTCOME} needed", last)


def docs_sample() -> str:
    return docs.fenced_after(docs.page("install.md"),
                             "$ initshift check --smoke builds")


def _normal(text: str) -> str:
    """The output without what differs between runs: the pod's suffix, numbers."""
    text = re.sub(r"initshift-smoke-(job-)?[a-z0-9]{5}", r"initshift-smoke-\1X", text.strip())
    return re.sub(r"\d+(\.\d+)?", "N", text)


async def test_waiter_pods_that_end_before_the_kubelet_reports_the_proxy(kube: KubeDouble, tmp_path) -> None:
    """On a real kubelet a short waiter pod often ends before the kubelet's probe (every second
    or more) reports the proxy up: step 0 and the Job's main waited on their loopback probe."""
    async with inst.healthy(kube, tmp_path) as i:
        code, lines, out = await smoke(i, inst.BUILDS, waiter_first=True)
    assert code == 0 and failed(out) == [], out
    up = "✔ sidecar istio-proxy Ready by {}'s loopback probe (the pod ended before the kubelet's probe reported it)"
    assert up.format("step 0") in lines and up.format("main") in lines, out


async def test_native_strategy_and_keep(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path, mode=p.MODE_NATIVE, native_supported=lambda: True,
                            strategy=lambda: "native") as i:
        code, lines, out = await smoke(i, inst.BUILDS, "--keep")
    assert code == 0 and failed(out) == [], out
    starts(lines, "✔ created pod builds/initshift-smoke-", "✔ rewritten by initshift (strategy native)",
           "✔ sidecar istio-proxy Ready", "✔ step 0 started after the sidecar was Ready (",
           "✔ steps ran in order: step-0 ", "✔ pod ended Succeeded (phase Succeeded); sidecar stopped by "
           "istio-proxy Completed (exit 0)", f"✔ no {p.ANNOTATION_OUTCOME} needed", "✔ kept pod builds/initshift-smoke-",
           *native_job_lines("✔ kept pod builds/initshift-smoke-job-"))
    kept = kube.items("pods", inst.BUILDS)
    assert len(kept) == 2 and {k["metadata"]["labels"][p.LABEL_MANAGED] for k in kept} == {p.MODE_NATIVE}


async def test_hybrid_strategy_where_native_sidecars_run(kube: KubeDouble, tmp_path) -> None:
    """auto on a cluster with native sidecars: the proxy native, the steps under the waiter."""
    async with inst.healthy(kube, tmp_path, native_supported=lambda: True, strategy=lambda: "hybrid") as i:
        code, lines, out = await smoke(i, inst.BUILDS)
    assert code == 0 and failed(out) == [], out
    starts(lines, "✔ created pod builds/initshift-smoke-", "✔ rewritten by initshift (strategy hybrid)",
           "✔ sidecar istio-proxy Ready", "✔ step 0 started after the sidecar was Ready (",
           "✔ steps ran in order: step-0 ", "✔ pod ended Succeeded (phase Succeeded); sidecar stopped by native",
           f"✔ {p.ANNOTATION_OUTCOME}: Succeeded (", "✔ deleted pod builds/initshift-smoke-",
           *native_job_lines("✔ deleted pod builds/initshift-smoke-job-"))


async def test_namespace_without_a_mesh(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, lines, out = await smoke(i, inst.PLAIN)
    assert code == 0, out
    starts(lines, "✔ created pod plain/initshift-smoke-", "✔ not rewritten: no mesh injects in this namespace",
           "✔ no sidecar in the pod", "✔ steps ran in order", "✔ pod ended Succeeded (phase Succeeded)",
           f"✔ no {p.ANNOTATION_OUTCOME} needed", "✔ deleted pod plain/",
           "✔ created Job-shaped pod plain/initshift-smoke-job-", "✔ not rewritten: no mesh injects in this namespace",
           "✔ pod ended Succeeded (phase Succeeded)", "✔ deleted pod plain/initshift-smoke-job-")


@pytest.mark.parametrize("hold, said", [
    ("sidecar-ready", ["pod phase Running", "istio-proxy: running (NotReady)", "step-0: waiting-sidecars"]),
    # initshift's own image not pulled: what to do about it
    ("image-pull", [f"{p.INIT_CONTAINER_NAME} cannot pull initshift's image (ErrImagePull)",
                    "INITSHIFT_IMAGE_PULL_SECRETS"]),
])
async def test_stuck_stage_is_named_and_the_pod_deleted(kube: KubeDouble, tmp_path, hold: str,
                                                        said: list[str]) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, lines, out = await smoke(i, inst.BUILDS, "--timeout", "3", hold=hold)
    assert code == 1
    starts(lines, "✔ created pod", "✔ rewritten by initshift (strategy waiter)",
           "✘ timed out after 3s at stage: sidecar Ready", "✔ deleted pod builds/initshift-smoke-")
    hint = out.split("at stage: sidecar Ready\n", 1)[1].splitlines()[0]
    assert all(text in hint for text in said), hint
    assert kube.items("pods", inst.BUILDS) == []


class Unpulled(inst.Kubelet):
    """The proxy runs Ready; the containers of one image are never pulled (an air-gapped
    cluster without busybox)."""

    image = "registry.invalid/busybox:1"

    async def _waiter(self, pod: dict) -> None:
        await self._inits_in_order(pod)
        await self.regular(*[
            {"name": c["name"], "ready": False, "restartCount": 0, "image": c["image"],
             "state": {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{c["image"]}"'}}}
            for c in pod["spec"]["containers"] if c["image"] == self.image], phase="Pending")
        await self.regular(running(p.ISTIO_PROXY))


async def test_a_smoke_image_the_nodes_cannot_pull_names_its_flag(kube: KubeDouble, tmp_path) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, lines, out = await smoke(i, inst.BUILDS, "--timeout", "3", "--image", Unpulled.image,
                                       kubelet_type=Unpulled)
    assert code == 1
    starts(lines, "✔ created pod", "✔ rewritten by initshift (strategy waiter)", "✔ sidecar istio-proxy Ready",
           "✘ timed out after 3s at stage: step 0 started", "✔ deleted pod builds/initshift-smoke-")
    assert out.split("at stage: step 0 started\n", 1)[1].splitlines()[0].endswith(
        f"; the nodes cannot pull {Unpulled.image} (ImagePullBackOff): give --image an image they can pull "
        f"(from your registry or mirror)"), out


async def test_not_rewritten_where_a_mesh_injects_fails(kube: KubeDouble, tmp_path) -> None:
    """The feature gate off: the pod gets its proxy but initshift leaves it alone."""
    async with inst.healthy(kube, tmp_path, gate=False) as i:
        code, lines, out = await smoke(i, inst.BUILDS, "--timeout", "5")
    assert code == 1
    starts(lines, "✔ created pod", "✘ rewritten by initshift: not rewritten (no decision recorded)",
           "✔ deleted pod", "✔ created Job-shaped pod", "✘ rewritten by initshift: not rewritten (no decision "
           "recorded)", "✔ deleted pod")


class NoDns(inst.Kubelet):
    """The fetch fails as in a cluster without DNS: curl exits 6 and its log says why; the
    waiter skips what follows; the pod ends Failed."""

    failed = False

    async def _steps(self, pod: dict) -> None:
        ann = pod["metadata"]["annotations"]
        steps, mains = json.loads(ann[p.ANNOTATION_STEPS]), json.loads(ann[p.ANNOTATION_MAINS])
        net = steps[1] if steps else mains[0]
        self.failed = False
        for n in [*steps, *mains]:
            at = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            record = {"name": n, "exitCode": 0, "reason": p.REASON_COMPLETED, "startedAt": at, "finishedAt": at,
                      "message": ""}
            if self.failed:
                record |= {"reason": p.REASON_SKIPPED, "message": f"skipped: step '{net}' failed with exit code 6"}
            elif n == net:
                self.kube.append_log(self.namespace, self.name, n,
                                     "curl: (6) Could not resolve host: kubernetes.default.svc")
                self.kube.append_log(self.namespace, self.name, n, "waiter[step-1]: exited with code 6")
                record |= {"exitCode": 6, "reason": "Error", "message": "exited with code 6"}
                self.failed = True
            await self.regular(terminated(n, record["exitCode"], message=json.dumps(record)))

    async def regular(self, *entries: dict, phase: str | None = None) -> None:
        await super().regular(*entries, phase="Failed" if phase == "Succeeded" and self.failed else phase)


async def test_a_failed_fetch_says_why_before_the_pod_is_deleted(kube: KubeDouble, tmp_path) -> None:
    """The pods are deleted after the run: the ✘ line holds the end of the failed container's
    log (an exit code alone does not say why) and names --keep, not a command on a pod that
    will be gone. The watcher's record of the failure is right, and not counted again."""
    async with inst.healthy(kube, tmp_path) as i:
        code, lines, out = await smoke(i, inst.BUILDS, kubelet_type=NoDns)
    assert code == 1
    why = ("its log ends: curl: (6) Could not resolve host: kubernetes.default.svc; it fetches "
           "https://kubernetes.default.svc/version (--net-url); --keep keeps the pods to look into")
    assert f"✘ steps in order: step-1 failed (exit 6)\n    exited with code 6; {why}\n" in out, out
    assert f"\n✔ {p.ANNOTATION_OUTCOME}: Failed (step-1 failed: " in out, out
    job = out.split("Job-shaped pod", 1)[1]
    assert "\n✘ pod ended Failed (phase Failed); sidecar stopped by" in job, out
    assert f"\n    exited with code 6; {why}\n" in job, out
    assert "initshift status" not in out and "kubectl -n builds logs" not in out, out
    assert kube.items("pods", inst.BUILDS) == []


@pytest.mark.parametrize("namespace, why", [
    ("default", "namespace default is not opted in: kubectl label namespace default initshift.io/enabled=true"),
    # Labelling a namespace that does not exist fails: the hint creates it first.
    ("nope", "namespace nope does not exist: name an opted-in one, or kubectl create namespace nope && "
             "kubectl label namespace nope initshift.io/enabled=true (and your mesh's label)")])
async def test_namespace_that_is_not_opted_in(kube: KubeDouble, tmp_path, namespace, why) -> None:
    async with inst.healthy(kube, tmp_path) as i:
        code, lines, out = await smoke(i, namespace)
    assert code == 1 and titles(lines) == [f"{namespace} is an opted-in namespace"]
    assert f"\n    {why}\n" in out
    assert [x for x in kube.items("pods") if x["metadata"]["namespace"] != inst.NS] == []  # but initshift's own


def test_smoke_pod_is_valid_and_rewritten_by_both_strategies() -> None:
    from tests.support.fixtures import pods
    from tests.support.podvalidate import assert_valid_pod
    from webhook.rewrite import rewrite
    from webhook.settings import Settings

    pod = smoke_pod(SmokeOptions())
    assert_valid_pod({**pod, "metadata": {**pod["metadata"], "name": "x"}})
    injected = pods.inject_istio(pod)
    for native in (None, True):
        result = rewrite(injected, Settings(feature_gate=True), native_supported=native)
        assert result.changed and result.strategy == (p.MODE_HYBRID if native else p.MODE_WAITER)


def test_smoke_job_pod_is_valid_and_rewritten_by_both_strategies() -> None:
    from tests.support.fixtures import pods
    from tests.support.podvalidate import assert_valid_pod
    from webhook.cli._check_smoke import smoke_job_pod
    from webhook.rewrite import rewrite
    from webhook.settings import Settings

    pod = smoke_job_pod(SmokeOptions())
    assert "initContainers" not in pod["spec"] and pod["spec"]["restartPolicy"] == "Never"
    assert_valid_pod({**pod, "metadata": {**pod["metadata"], "name": "x"}})
    injected = pods.inject_istio(pods.without_init(pod))
    for native in (None, True):
        result = rewrite(injected, Settings(feature_gate=True), native_supported=native)
        assert result.changed and result.strategy == (p.MODE_NATIVE if native else p.MODE_WAITER)
