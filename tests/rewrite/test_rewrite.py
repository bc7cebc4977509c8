"""The pure rewrite (waiter strategy) over real-shaped pods."""

from __future__ import annotations

import copy
import json
import posixpath

import pytest

from tests.support.expansion import expand_all
from tests.support.fixtures import pods
from tests.support.podvalidate import assert_valid_pod
from waiter import flags as waiter_flags
from waiter import protocol as p
from webhook.rewrite._entrypoint import ImageConfig, ImageEntrypoints
from tests.support.patching import apply_patch
from webhook.admission._patch import make_patch
from webhook.rewrite._quantity import format_quantity
from webhook.rewrite._resources import pod_requests
from webhook.rewrite._rewrite import plan, rewrite
from webhook.settings import RewriteSettings, Settings

ON = Settings(feature_gate=True)
CATALOGUE = pods.catalogue()

EXPECTED = {
    "kpack": "no-sidecar",
    "kpack-istio": "rewritten",
    "kpack-istio-cni": "rewritten",
    "kpack-istio-hold": "rewritten",
    "kpack-istio-native": "rewritten",  # as hybrid: the proxy is native already
    "kpack-linkerd": "rewritten",
    "tekton": "no-sidecar",
    "tekton-istio": "rewritten",
    "job": "no-sidecar",
    "job-istio": "rewritten",
    "job-linkerd": "rewritten",
    "deployment-istio": "restart-policy",
    "no-init-istio": "rewritten",  # a Job's pod without init containers: its main is gated and quits
    "cronjob": "no-sidecar",
    "cronjob-istio": "rewritten",
    "cronjob-istio-cni": "rewritten",
    "cronjob-istio-native": "already-native",
    "cronjob-linkerd": "rewritten",
    "cronjob-on-failure-istio": "rewritten",
    "cronjob-deployment-istio": "no-init-containers",  # long-running without init containers: never touched
}


def with_settings(**rewrite_fields) -> Settings:
    return Settings(feature_gate=True, rewrite=RewriteSettings(**rewrite_fields))


def names(containers) -> list[str]:
    return [c["name"] for c in containers]


def argv_after_separator(c: dict) -> list[str]:
    args = c["args"]
    return args[args.index(p.ARGV_SEPARATOR) + 1:]


def waiter_args(c: dict) -> list[str]:
    """The waiter's own flags: what comes before the user's argv (which may hold anything)."""
    return c["args"][: c["args"].index(p.ARGV_SEPARATOR)]


def flag_values(c: dict, flag: str) -> list[str]:
    args = waiter_args(c)
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_catalogue_is_complete():
    assert set(EXPECTED) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_decision_and_validity(name):
    pod = CATALOGUE[name]
    before = copy.deepcopy(pod)
    result = rewrite(pod, ON)
    assert pod == before, "the rewrite must not mutate its input"
    assert result.reason == EXPECTED[name]
    assert result.changed == (EXPECTED[name] == "rewritten")
    if not result.changed:
        assert result.pod == pods.not_rewritten(pod, result.reason)
        assert result.warnings and all(w.startswith("initshift: ") for w in result.warnings)
        return
    assert_valid_pod(result.pod)
    assert apply_patch(pod, make_patch(pod, result.pod)) == result.pod


@pytest.mark.parametrize("policy", ["preserve", "divide", "keep"])
@pytest.mark.parametrize("name", [n for n, r in EXPECTED.items() if r == "rewritten"])
def test_every_policy_emits_valid_pods(name, policy):
    result = rewrite(CATALOGUE[name], with_settings(resources_policy=policy))
    assert result.changed
    assert_valid_pod(result.pod)


def test_feature_gate_off_admits_everything_unchanged():
    for pod in CATALOGUE.values():
        result = rewrite(pod, Settings())
        assert not result.changed and result.reason == "feature-gate-off"


def test_kpack_layout():
    src = CATALOGUE["kpack-istio"]
    out = rewrite(src, ON).pod
    spec = out["spec"]
    steps = ["prepare", "analyze", "detect", "restore", "build", "export"]
    assert names(spec["initContainers"]) == ["istio-init", p.INIT_CONTAINER_NAME]
    assert names(spec["containers"]) == [*steps, "completion", "istio-proxy"]
    meta = out["metadata"]
    assert meta["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    assert json.loads(meta["annotations"][p.ANNOTATION_STEPS]) == steps
    assert json.loads(meta["annotations"][p.ANNOTATION_MAINS]) == ["completion"]

    originals = {c["name"]: c for c in [*src["spec"]["initContainers"], *src["spec"]["containers"]]}
    for i, c in enumerate(spec["containers"][:7]):
        o = originals[c["name"]]
        assert c["command"] == [p.WAITER_PATH]
        assert argv_after_separator(c) == [*o["command"], *o.get("args", [])]
        for field in ("image", "env", "securityContext", "workingDir"):
            assert c.get(field) == o.get(field), field
        assert c["volumeMounts"][: len(o["volumeMounts"])] == o["volumeMounts"]
        ours = {m["name"]: m for m in c["volumeMounts"][len(o["volumeMounts"]):]}
        assert ours[p.BIN_VOLUME]["readOnly"] is True
        assert ours[p.run_volume(i)].get("readOnly") is not True, "own run dir is writable"
        writable = [m["name"] for m in ours.values() if not m.get("readOnly")]
        # No container can write a step's completion but the step itself; the mains share
        # one directory for their own records (the last of them quits the sidecars).
        assert writable == [p.run_volume(i), *([p.MAINS_VOLUME] if i == 6 else [])]
        assert flag_values(c, p.FLAG_POST) == [p.completion_path(i)]
        if i == 0:
            assert flag_values(c, p.FLAG_WAIT) == []
            assert flag_values(c, p.FLAG_READY_FILE) == [], "the proxy's probe is the gate"
            assert flag_values(c, p.FLAG_PROBE) == ["http://127.0.0.1:15021/healthz/ready"]
            assert p.READY_VOLUME not in ours
        else:
            assert flag_values(c, p.FLAG_WAIT) == [p.completion_path(min(i - 1, 5))]
            assert flag_values(c, p.FLAG_READY_FILE) == []
    completion = spec["containers"][6]
    assert flag_values(completion, p.FLAG_WAIT) == [p.completion_path(5)]
    assert flag_values(completion, p.FLAG_QUIT) == [p.DEFAULT_QUIT_ENDPOINTS["istio-proxy"]]
    assert flag_values(completion, p.FLAG_MAINS_DIR) == [p.MAINS_MOUNT] and flag_values(completion, p.FLAG_MAINS) == ["1"]
    # Its terminationMessagePath is kpack's (/tmp/termination-log): the waiter writes none there.
    assert flag_values(completion, p.FLAG_TERMINATION_LOG) == []
    assert spec["containers"][7] == src["spec"]["containers"][1], "the sidecar is untouched"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert [v["name"] for v in spec["volumes"][: len(src["spec"]["volumes"])]] == names(src["spec"]["volumes"])
    assert p.READY_VOLUME not in vols
    assert all(p.run_volume(i) in vols for i in range(7))


def test_kpack_resources_preserve():
    src = CATALOGUE["kpack-istio"]
    out = rewrite(src, ON).pod
    before, after = pod_requests(src["spec"]), pod_requests(out["spec"])
    assert after == before, "the pod's effective request is unchanged"
    steps = out["spec"]["containers"][:6]
    # The pod reserved 1 CPU / 2Gi for the steps; mains and the proxy keep their 200m / 256Mi.
    assert steps[0]["resources"]["requests"] == {"cpu": "800m", "memory": "1792Mi"}
    assert all(s["resources"]["requests"] == {"cpu": "0", "memory": "0"} for s in steps[1:])
    assert all(s["resources"]["limits"] == {"memory": "4Gi"} for s in steps), "limits are kept"


def test_steps_left_no_request_say_so():
    """kpack gives every container the build's resources, its waiting `completion` too: the
    regular containers then hold all the pod reserved, and the steps get 0, said in a
    warning (nothing to say where the steps keep some, or under `keep`)."""
    src = copy.deepcopy(CATALOGUE["kpack-istio"])
    build = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    for c in [*src["spec"]["initContainers"][1:], src["spec"]["containers"][0]]:
        c["resources"] = copy.deepcopy(build)
    for policy in ("preserve", "divide"):
        result = rewrite(src, with_settings(resources_policy=policy))
        assert all(s["resources"]["requests"] == {"cpu": "0", "memory": "0"}
                   for s in result.pod["spec"]["containers"][:6])
        said = [w for w in result.warnings if "the steps get no cpu or memory request" in w]
        assert len(said) == 1 and f"INITSHIFT_RESOURCES_POLICY={policy}" in said[0], result.warnings
        assert "the kernel's first choice when the node runs out of memory" in said[0]
    assert not any("the steps get no" in w for w in rewrite(CATALOGUE["kpack-istio"], ON).warnings)
    assert not any("the steps get no" in w for w in rewrite(src, with_settings(resources_policy="keep")).warnings)


def test_kpack_resources_divide_and_keep():
    src = CATALOGUE["kpack-istio"]
    divided = rewrite(src, with_settings(resources_policy="divide")).pod
    before, after = pod_requests(src["spec"]), pod_requests(divided["spec"])
    assert all(after[r] <= before[r] for r in before), "never grows (shares are rounded down)"
    cpu = [s["resources"]["requests"]["cpu"] for s in divided["spec"]["containers"][:6]]
    assert cpu == ["133m"] * 6  # 800m in proportion to six equal requests, rounded down
    kept = rewrite(src, with_settings(resources_policy="keep"))
    steps = kept.pod["spec"]["containers"][:6]
    assert [s["resources"] for s in steps] == [c["resources"] for c in src["spec"]["initContainers"][1:]]
    assert any("effective request grows" in w for w in kept.warnings)


def test_qos_change_is_warned():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    guaranteed = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        c["resources"] = copy.deepcopy(guaranteed)
    result = rewrite(pod, ON)
    assert result.changed
    assert any("QoS class changes from Guaranteed to Burstable" in w for w in result.warnings)
    assert pod_requests(result.pod["spec"]) == pod_requests(pod["spec"])


def test_unshareable_resource_in_two_steps_is_left_alone():
    pod = copy.deepcopy(CATALOGUE["tekton-istio"])
    for c in pod["spec"]["initContainers"][-2:]:
        c["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    result = rewrite(pod, ON)
    assert not result.changed and result.reason == "resources"
    assert "nvidia.com/gpu" in result.warnings[0]


def test_idempotent_on_every_rewritten_fixture():
    for name, reason in EXPECTED.items():
        if reason != "rewritten":
            continue
        once = rewrite(CATALOGUE[name], ON)
        twice = rewrite(once.pod, ON)
        assert twice.pod == once.pod, name
        assert not twice.changed and make_patch(once.pod, twice.pod) == []


def test_sidecar_injected_after_us_updates_only_gate_and_quit():
    job = copy.deepcopy(CATALOGUE["job"])
    job["metadata"]["annotations"][p.ISTIO_INJECT_ANNOTATION] = "true"
    first = rewrite(job, ON)
    assert first.changed
    step0 = first.pod["spec"]["containers"][0]
    assert flag_values(step0, p.FLAG_READY_FILE) == [], "no sidecar yet: no wait"
    injected = pods.inject_istio(first.pod)
    second = rewrite(injected, ON)
    assert second.changed and second.reason == "refreshed"
    assert_valid_pod(second.pod)
    new0 = second.pod["spec"]["containers"][0]
    assert flag_values(new0, p.FLAG_PROBE) == ["http://127.0.0.1:15021/healthz/ready"]
    assert flag_values(new0, p.FLAG_READY_FILE) == [], "the probe is the gate"
    main = next(c for c in second.pod["spec"]["containers"] if c["name"] == "build")
    assert flag_values(main, p.FLAG_QUIT) == [p.DEFAULT_QUIT_ENDPOINTS["istio-proxy"]]
    # Everything but step 0 and the main's quit flags is as Istio left it.
    main_index = second.pod["spec"]["containers"].index(main)
    allowed = ("/spec/containers/0", f"/spec/containers/{main_index}/args")
    ops = make_patch(injected, second.pod)
    assert ops and all(op["path"] in allowed or op["path"].startswith(tuple(a + "/" for a in allowed))
                       for op in ops), ops
    assert rewrite(second.pod, ON).pod == second.pod


@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
@pytest.mark.parametrize("policy", ["preserve", "divide", "keep"])
def test_a_proxy_injected_after_us_is_taken_from_the_steps_budget(mode: str, policy: str) -> None:
    # Istio's and Linkerd's webhooks sort after initshift's: a pod that asks for a proxy is
    # rewritten before it has one. Its steps' budget then left the proxy out; on
    # re-invocation the proxy's request is taken back from it, so the pod's effective
    # request is the one the mesh alone gives it (keep: the steps' requests stay, it grows).
    settings = Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode, resources_policy=policy))
    kpack = copy.deepcopy(CATALOGUE["kpack"])
    kpack["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    mesh_only = pod_requests(pods.inject_istio(kpack)["spec"])
    first = rewrite(kpack, settings, native_supported=True)
    assert first.changed, first.warnings
    refreshed = rewrite(pods.inject_istio(first.pod), settings, native_supported=True)
    assert refreshed.reason == "refreshed"
    assert_valid_pod(refreshed.pod)
    total = pod_requests(refreshed.pod["spec"])
    if policy == "keep":
        def steps(pod: dict) -> list:
            names = set(json.loads(pod["metadata"]["annotations"][p.ANNOTATION_STEPS]))
            return [c.get("resources") for c in pod["spec"]["containers"] if c["name"] in names]
        assert steps(refreshed.pod) == steps(first.pod) and total["cpu"] > mesh_only["cpu"]
    else:
        assert total == mesh_only, (total, mesh_only)
    assert rewrite(refreshed.pod, settings, native_supported=True).pod == refreshed.pod  # taken back once


@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
@pytest.mark.parametrize("policy", ["preserve", "divide", "keep"])
@pytest.mark.parametrize("variant", ["classic", "native"])
def test_a_second_proxy_injected_after_us_is_taken_from_the_steps_budget(mode: str, policy: str, variant: str) -> None:
    # A pod with Linkerd's proxy, rewritten, then given Istio's by its namespace's label (the
    # mesh's webhook runs after initshift's): the budget the rewrite recorded has the new
    # proxy's request taken back from the steps, so the pod's effective request is the one
    # the meshes alone give it (first seen by e2e never-refused on v1.34.9: +10m, +16Mi).
    settings = Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode, resources_policy=policy))
    pod = copy.deepcopy(CATALOGUE["kpack-linkerd"])
    mesh_only = pod_requests(pods.inject_istio(pod)["spec"])  # the classic proxy Istio injects unasked
    first = rewrite(pod, settings, native_supported=True)
    assert first.changed, first.warnings
    assert json.loads(first.pod["metadata"]["annotations"][p.ANNOTATION_BUDGET]) == {"cpu": "1", "memory": "2Gi"}
    refreshed = rewrite(pods.inject_istio(first.pod, variant), settings, native_supported=True)
    assert refreshed.reason == "refreshed", refreshed.warnings
    assert_valid_pod(refreshed.pod)
    total = pod_requests(refreshed.pod["spec"])
    if policy == "keep":
        assert total["cpu"] > mesh_only["cpu"]
    else:
        assert total == mesh_only, (total, mesh_only)
    assert rewrite(refreshed.pod, settings, native_supported=True).pod == refreshed.pod  # taken back once


def test_a_native_proxy_asked_for_says_what_it_adds_when_it_arrives() -> None:
    # Native, a pod without a proxy: initshift asks the mesh for a native one and records the
    # budget; re-invoked once it came, it says what the proxy beside every init container
    # adds beyond the classic proxy the mesh alone would give (first seen by e2e never-refused
    # on v1.34.9: +16Mi, unsaid).
    settings = Settings(feature_gate=True, rewrite=RewriteSettings(mode="native"))
    kpack = copy.deepcopy(CATALOGUE["kpack"])
    kpack["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    first = rewrite(kpack, settings, native_supported=True)
    assert first.changed and p.ANNOTATION_BUDGET in first.pod["metadata"]["annotations"], first.warnings
    mesh_only = pod_requests(pods.inject_istio(kpack)["spec"])
    injected = pods.inject_istio(first.pod, "native")
    grown = pod_requests(injected["spec"])
    assert grown["cpu"] > mesh_only["cpu"], (grown, mesh_only)  # the proxy beside the largest step
    again = rewrite(injected, settings, native_supported=True)
    assert not again.changed and again.pod == injected
    said = [w for w in again.warnings if "effective request grows" in w]
    assert said and f"cpu={format_quantity(grown['cpu'], 'cpu')}" in said[0] \
        and f"cpu={format_quantity(mesh_only['cpu'], 'cpu')}" in said[0], again.warnings
    # A proxy that adds nothing beyond the classic one is not warned about.
    quiet = copy.deepcopy(injected)
    for c in quiet["spec"]["initContainers"]:
        if c["name"] == "istio-proxy":
            c["resources"] = {}
    assert not [w for w in rewrite(quiet, settings, native_supported=True).warnings if "grows" in w]


def test_a_pod_rewritten_without_a_budget_record_keeps_the_older_rule() -> None:
    # A pod an initshift that recorded no budget rewrote: a sidecar it had is not weighed
    # again (only a pod that had none gives the steps' requests back, by step 0's gate).
    once = rewrite(CATALOGUE["kpack-linkerd"], ON).pod
    del once["metadata"]["annotations"][p.ANNOTATION_BUDGET]
    injected = pods.inject_istio(once)
    refreshed = rewrite(injected, ON).pod
    steps = set(json.loads(once["metadata"]["annotations"][p.ANNOTATION_STEPS]))
    assert [c.get("resources") for c in refreshed["spec"]["containers"] if c["name"] in steps] == \
        [c.get("resources") for c in injected["spec"]["containers"] if c["name"] in steps]


def test_sidecars_present_at_the_rewrite_are_not_taken_back_again() -> None:
    # a sidecar the first rewrite budgeted (step 0 has a gate for it) gives nothing back later
    once = rewrite(CATALOGUE["kpack-istio"], ON).pod
    assert rewrite(once, ON).pod == once
    assert pod_requests(once["spec"]) == pod_requests(CATALOGUE["kpack-istio"]["spec"])


def test_hold_keeps_proxy_first_and_linkerd_proxy_first():
    hold = rewrite(CATALOGUE["kpack-istio-hold"], ON).pod
    assert names(hold["spec"]["containers"])[0] == "istio-proxy"
    linkerd = rewrite(CATALOGUE["kpack-linkerd"], ON).pod
    assert names(linkerd["spec"]["containers"])[:2] == ["linkerd-proxy", "prepare"]
    step0 = linkerd["spec"]["containers"][1]
    assert flag_values(step0, p.FLAG_PROBE) == ["http://127.0.0.1:4191/ready"], "named port resolved"
    completion = linkerd["spec"]["containers"][-1]
    assert flag_values(completion, p.FLAG_QUIT) == [p.DEFAULT_QUIT_ENDPOINTS["linkerd-proxy"]]
    assert names(linkerd["spec"]["initContainers"]) == ["linkerd-init", p.INIT_CONTAINER_NAME]


def test_sidecar_without_loopback_probe_uses_ready_file_only():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["containers"][-1]["readinessProbe"] = {"exec": {"command": ["pilot-agent", "ready"]}}
    step0 = rewrite(pod, ON).pod["spec"]["containers"][0]
    assert flag_values(step0, p.FLAG_READY_FILE) == [p.READY_FILE]
    assert flag_values(step0, p.FLAG_PROBE) == []


def test_tcp_and_https_probes():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["metadata"]["annotations"][p.ANNOTATION_SIDECARS] = "cache"
    pod["spec"]["containers"].append({
        "name": "cache", "image": "redis:7", "ports": [{"name": "redis", "containerPort": 6379}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}}})
    pod["spec"]["containers"][1]["readinessProbe"] = {"httpGet": {"path": "ready", "port": 8443, "scheme": "HTTPS"}}
    step0 = rewrite(pod, ON).pod["spec"]["containers"][0]
    assert flag_values(step0, p.FLAG_PROBE) == ["https://127.0.0.1:8443/ready", "tcp://127.0.0.1:6379"]


def test_mode_annotation():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["metadata"]["annotations"][p.ANNOTATION_MODE] = "disabled"
    assert rewrite(pod, ON).reason == "disabled"
    pod["metadata"]["annotations"][p.ANNOTATION_MODE] = "wiater"
    result = rewrite(pod, ON)
    assert result.reason == "invalid-mode" and "wiater" in result.warnings[0]
    pod["metadata"]["annotations"][p.ANNOTATION_MODE] = "waiter"
    assert rewrite(pod, with_settings(mode="disabled")).changed, "the pod's annotation wins"


def test_keep_init_and_custom_sidecars():
    pod = copy.deepcopy(CATALOGUE["tekton-istio"])
    pod["metadata"]["annotations"][p.ANNOTATION_KEEP_INIT] = "prepare,place-scripts,nope"
    result = rewrite(pod, ON)
    spec = result.pod["spec"]
    assert names(spec["initContainers"]) == ["istio-init", "prepare", "place-scripts", p.INIT_CONTAINER_NAME]
    assert names(spec["containers"])[:2] == ["step-git-clone", "step-unit-test"]
    assert any("'nope'" in w for w in result.warnings)


def test_istio_status_lists_extra_init_container():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    status = json.loads(pod["metadata"]["annotations"][p.ISTIO_STATUS_ANNOTATION])
    status["initContainers"].append("git-clone")
    pod["metadata"]["annotations"][p.ISTIO_STATUS_ANNOTATION] = json.dumps(status)
    result = rewrite(pod, ON)
    # git-clone is kept as an init container: no step left, the Job's main is gated as in any Job.
    assert result.changed and names(result.pod["spec"]["initContainers"]) == ["istio-init", "git-clone",
                                                                            p.INIT_CONTAINER_NAME]
    assert json.loads(result.pod["metadata"]["annotations"][p.ANNOTATION_STEPS]) == []


def test_on_failure_gets_retry():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["restartPolicy"] = "OnFailure"
    result = rewrite(pod, ON)
    wrapped = [c for c in result.pod["spec"]["containers"] if c["name"] != "istio-proxy"]
    assert all(p.FLAG_RETRY in waiter_args(c) for c in wrapped)
    assert any("OnFailure" in w for w in result.warnings)


def test_step_without_command_is_denied_or_admitted():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    del pod["spec"]["initContainers"][1]["command"]  # git-clone: ENTRYPOINT of alpine/git
    assert plan(pod, ON).lookups()[0].container == "git-clone"
    denied = rewrite(pod, ON)
    assert denied.denied and "'git-clone'" in denied.denied and "alpine/git:2.45.2" in denied.denied
    assert "command" in denied.denied
    admitted = rewrite(pod, with_settings(on_unresolved="admit"))
    assert admitted.denied is None and not admitted.changed and admitted.reason == "unresolved-entrypoint"


def test_step_without_command_uses_resolved_image():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    del pod["spec"]["initContainers"][1]["command"]
    images = {"alpine/git:2.45.2": ImageEntrypoints({"linux/amd64": ImageConfig(("git",), ("--help",))})}
    out = rewrite(pod, ON, images=images).pod
    step = out["spec"]["containers"][0]
    assert argv_after_separator(step) == ["git", "clone", "--branch", "main", "--single-branch",
                                          "https://git.example.com/team/site.git", "/src"]
    multi = {"alpine/git:2.45.2": ImageEntrypoints({"linux/amd64": ImageConfig(("git",)),
                                                    "linux/arm64/v8": ImageConfig(("/usr/bin/git",))})}
    step = rewrite(pod, ON, images=multi).pod["spec"]["containers"][0]
    # The map holds the image's words; the container's own args stay words after `--`.
    assert argv_after_separator(step) == pod["spec"]["initContainers"][1]["args"]
    argv_map = json.loads(flag_values(step, p.FLAG_ARGV_MAP)[0])
    assert argv_map == {"linux/amd64": ["git"], "linux/arm64/v8": ["/usr/bin/git"]}
    assert rewrite(rewrite(pod, ON, images=multi).pod, ON).changed is False


def test_per_platform_words_over_one_exec_argument_are_not_given_to_the_waiter():
    """An image whose CMD differs by platform goes to the waiter as one `--argv-map` argument;
    over Linux's 131,071 bytes the exec starting the waiter fails and the container never
    starts, where without initshift each word is its own argument and it runs. Decided as an
    unknown ENTRYPOINT: denied, or admitted unchanged saying why; right at the limit (the
    kubelet's $$ counted as the $ the waiter gets) it is rewritten."""
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    step = pod["spec"]["initContainers"][1]
    del step["command"], step["args"]

    def images(script: str) -> dict:
        return {"alpine/git:2.45.2": ImageEntrypoints({
            "linux/amd64": ImageConfig(("sh", "-c"), (script,)), "linux/arm64/v8": ImageConfig(("/bin/sh", "-c"), (script,))})}

    # The map without the scripts: {"linux/amd64":["sh","-c",""],"linux/arm64/v8":["/bin/sh","-c",""]}
    frame = len('{"linux/amd64":["sh","-c",""],"linux/arm64/v8":["/bin/sh","-c",""]}')
    fits = "$" * ((131071 - frame) // 2)  # written $$ in `args`, each a $ for the waiter
    out = rewrite(pod, with_settings(on_unresolved="admit"), images=images(fits))
    assert out.changed and out.reason == "rewritten", out.warnings
    arg = flag_values(out.pod["spec"]["containers"][0], p.FLAG_ARGV_MAP)[0]
    assert len(arg.replace("$$", "$").encode()) == 131071 - (131071 - frame) % 2
    assert rewrite(pod, ON, images=images(fits + "$$")).denied  # a byte or two over
    over = images("é" * 11000)  # 22,000 characters, each \u00e9 (six bytes) in the JSON
    denied = rewrite(pod, ON, images=over)
    assert denied.denied and "'git-clone' (image 'alpine/git:2.45.2': " in denied.denied
    assert "over the 131,071 bytes Linux allows one" in denied.denied and "set `command` (and `args`)" in denied.denied
    admitted = rewrite(pod, with_settings(on_unresolved="admit"), images=over)
    assert not admitted.changed and admitted.reason == "unresolved-entrypoint", admitted.warnings


def test_reserved_names_are_refused():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["volumes"].append({"name": p.BIN_VOLUME, "emptyDir": {}})
    result = rewrite(pod, ON)
    assert not result.changed and "reserved" in result.warnings[0]
    assert result.reason == "reserved" and result.pod["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "reserved"
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "src", "mountPath": "/initshift/x"})
    result = rewrite(pod, ON)
    assert "reserved" in result.warnings[0] and result.reason == "reserved"
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["containers"].append({"name": p.INIT_CONTAINER_NAME, "image": "busybox"})
    assert rewrite(pod, ON).reason == "reserved"


def test_pod_without_mains_quits_from_last_step():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["containers"] = [c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy"]
    pod["spec"]["initContainers"].append({"name": "publish", "image": "alpine", "command": ["true"]})
    out = rewrite(pod, ON).pod
    assert_valid_pod(out)
    steps = [c for c in out["spec"]["containers"] if c["name"] != "istio-proxy"]
    assert flag_values(steps[-1], p.FLAG_QUIT) == [p.DEFAULT_QUIT_ENDPOINTS["istio-proxy"]]
    assert flag_values(steps[0], p.FLAG_QUIT) == []


def test_a_pod_on_the_nodes_network_is_never_given_the_waiters_loopback():
    """hostNetwork: 127.0.0.1 is the node's, where the waiter's probes and quits would reach
    another pod's servers (a hostNetwork Istio gateway's :15020/quitquitquit). The waiter
    and hybrid leave such a pod; the native strategy, which uses no loopback, still runs."""
    def on_host(name: str) -> dict:
        pod = copy.deepcopy(CATALOGUE[name])
        pod["spec"]["hostNetwork"] = True
        return pod

    def under(mode: str, native: bool | None = None, name: str = "kpack-istio"):
        settings = Settings(feature_gate=True, rewrite=RewriteSettings(mode=mode))
        return rewrite(on_host(name), settings, native_supported=native)

    for mode, name in ((p.MODE_WAITER, "kpack-istio"), (p.MODE_WAITER, "cronjob-istio"), (p.MODE_AUTO, "job-linkerd"),
                       (p.MODE_HYBRID, "kpack-istio")):
        result = under(mode, None if mode != p.MODE_HYBRID else True, name)
        assert not result.changed and result.reason == "host-network", (mode, name, result.reason)
        assert result.pod["metadata"]["annotations"][p.ANNOTATION_NOT_REWRITTEN] == "host-network"
        assert "hostNetwork" in result.warnings[0] and "initshift.io/mode=native" in result.warnings[0]
    for mode in (p.MODE_AUTO, p.MODE_NATIVE):  # auto picks native where the cluster has it
        result = under(mode, True)
        assert result.changed and result.strategy == p.MODE_NATIVE, (mode, result.reason)
        assert_valid_pod(result.pod)
    agent = on_host("deployment-istio")  # a node agent, long-running: decided as before, never annotated
    agent["spec"]["initContainers"] = []
    for pod in (agent, on_host("deployment-istio")):
        result, before = rewrite(pod, ON), rewrite({**pod, "spec": {**pod["spec"], "hostNetwork": False}}, ON)
        assert not result.changed and result.reason == before.reason != "host-network", result.reason


def test_a_static_pods_mirror_is_never_touched():
    """The kubelet runs a static pod from its manifest; its mirror pod, which the apiserver
    admits through the webhooks, only shows it. A rewritten mirror would show containers
    that never run (seen on v1.34.9: `initshift.io/managed: hybrid`, an `initshift-copy`
    and steps as regular containers, while the kubelet ran the clone as an init container)."""
    for name in ("kpack-istio", "cronjob-istio", "kpack-istio-native"):
        mirror = copy.deepcopy(CATALOGUE[name])
        mirror["metadata"].setdefault("annotations", {})[p.MIRROR_POD_ANNOTATION] = "0f1e2d3c"
        # The watcher's own annotations on a manifest are kept too: they describe the static pod.
        for annotations in ({}, {p.ANNOTATION_START_ORDER: "app"}, {p.ANNOTATION_MODE: p.MODE_NATIVE},
                            {p.ANNOTATION_READY: p.READY_TRUE, p.ANNOTATION_OUTCOME: "{}"}):
            mirror["metadata"]["annotations"].update(annotations)
            result = rewrite(mirror, ON, native_supported=True)
            assert not result.changed and result.reason == "mirror-pod", (name, annotations, result.reason)
            assert result.pod is mirror and not make_patch(mirror, result.pod), "not even the not-rewritten annotation"
            assert "static pod" in result.warnings[0]


def test_windows_and_malformed_pods():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["os"] = {"name": "windows"}
    assert rewrite(pod, ON).reason == "windows"
    for broken in ({}, {"spec": None}, {"spec": {"containers": "x"}}, {"spec": {"containers": []}}):
        result = rewrite(broken, ON)
        assert not result.changed and result.reason == "invalid"
    bad_quantity = copy.deepcopy(CATALOGUE["job-istio"])
    bad_quantity["spec"]["initContainers"][1]["resources"] = {"requests": {"cpu": "lots"}}
    result = rewrite(bad_quantity, ON)
    assert not result.changed and "lots" in result.warnings[0]


def test_broken_managed_pod_is_left_alone():
    out = copy.deepcopy(rewrite(CATALOGUE["job-istio"], ON).pod)
    out["metadata"]["annotations"][p.ANNOTATION_STEPS] = "not json"
    result = rewrite(out, ON)
    assert not result.changed and result.reason == "invalid"


def test_image_argv_is_escaped_for_the_kubelets_expansion():
    # The kubelet expands $(VAR) and reduces $$ to $ in command/args, never in the image's
    # ENTRYPOINT/CMD: words taken from the image must reach the waiter unchanged.
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    step = pod["spec"]["initContainers"][1]
    del step["command"], step["args"]
    step["env"] = [{"name": "HOME", "value": "/src"}]
    images = {"alpine/git:2.45.2": ImageEntrypoints({"linux/amd64": ImageConfig(("sh", "-c"), ("kill $$ $(HOME)",))})}
    out = rewrite(pod, ON, images=images).pod
    assert argv_after_separator(out["spec"]["containers"][0]) == ["sh", "-c", "kill $$$$ $$(HOME)"]
    step["args"] = ["echo $(HOME)"]  # the user's own args were expanded before initshift too
    out = rewrite(pod, ON, images=images).pod
    assert argv_after_separator(out["spec"]["containers"][0]) == ["sh", "-c", "echo $(HOME)"]
    assert rewrite(out, ON).pod == out
    multi = {"alpine/git:2.45.2": ImageEntrypoints({"linux/amd64": ImageConfig(("/a$b",)),
                                                    "linux/arm64": ImageConfig(("/c",))})}
    step0 = rewrite(pod, ON, images=multi).pod["spec"]["containers"][0]
    # The user's $(HOME) stays a word of its own, expanded by the kubelet as before, never
    # inside the JSON text (a value with a quote would break it).
    assert json.loads(flag_values(step0, p.FLAG_ARGV_MAP)[0])["linux/amd64"] == ["/a$$b"]
    assert argv_after_separator(step0) == ["echo $(HOME)"]


def test_text_of_the_pods_fields_is_escaped_for_the_kubelets_expansion():
    # A readiness probe's path and a quit URL are never expanded where the pod has them;
    # written into `args`, the kubelet would expand them. A terminationMessagePath is the
    # program's: not handed to the waiter at all.
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == "istio-proxy")
    proxy["readinessProbe"]["httpGet"]["path"] = "/healthz/ready$(HOME)"
    main = pod["spec"]["containers"][0]
    main["env"] = [{"name": "HOME", "value": "/src"}]
    main["terminationMessagePath"] = "/dev/$$log"
    settings = with_settings(quit_endpoints={"istio-proxy": "http://127.0.0.1:15020/quit$(HOME)"})
    out = rewrite(pod, settings).pod
    step0, wrapped = out["spec"]["containers"][0], next(c for c in out["spec"]["containers"] if c["name"] == main["name"])
    kubelet = lambda c: expand_all(c["args"], {e["name"]: e["value"] for e in c.get("env") or []})  # noqa: E731
    assert flag_values({"args": kubelet(step0)}, p.FLAG_PROBE) == ["http://127.0.0.1:15021/healthz/ready$(HOME)"]
    assert flag_values({"args": kubelet(wrapped)}, p.FLAG_QUIT) == ["http://127.0.0.1:15020/quit$(HOME)"]
    assert flag_values({"args": kubelet(wrapped)}, p.FLAG_TERMINATION_LOG) == []
    assert rewrite(out, settings).pod == out
    assert_valid_pod(out)


def test_unshareable_resource_of_a_step_and_a_main_is_left_alone():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    gpu = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    pod["spec"]["initContainers"][1]["resources"] = copy.deepcopy(gpu)
    pod["spec"]["containers"][0]["resources"] = copy.deepcopy(gpu)
    result = rewrite(pod, ON)
    assert not result.changed and result.reason == "resources"
    assert "nvidia.com/gpu" in result.warnings[0]
    assert rewrite(pod, with_settings(resources_policy="keep")).changed, "keep lets the pod grow, with a warning"
    del pod["spec"]["containers"][0]["resources"]  # the step alone holds the GPU: it keeps it
    assert rewrite(pod, ON).changed


def test_null_maps_in_the_pod_are_not_a_crash():
    pod = copy.deepcopy(CATALOGUE["kpack-istio"])
    pod["spec"]["initContainers"][1]["resources"]["requests"] = None  # `requests:` left empty in YAML
    pod["metadata"]["labels"] = None
    result = rewrite(pod, ON)
    assert result.changed
    assert_valid_pod(result.pod)
    bare = copy.deepcopy(CATALOGUE["job-istio"])
    bare["metadata"] = None
    assert rewrite(bare, ON).reason in ("rewritten", "no-sidecar")


def test_lookups_of_a_malformed_pod_are_none():
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["metadata"]["annotations"] = [{}]
    assert plan(pod, ON).lookups() == []
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    pod["spec"]["initContainers"][1] = [{}]
    assert plan(pod, ON).lookups() == []
    assert rewrite(pod, ON).reason == "invalid"


def test_native_sidecars_already_run_before_the_steps():
    # A sidecar named by initshift.io/sidecars that already is native: the steps get the
    # hybrid treatment, as for istio-proxy; a native sidecar of another kind is no reason to
    # rewrite a mesh-less pod.
    job = copy.deepcopy(CATALOGUE["job"])
    agent = {"name": "mesh-agent", "image": "mesh/agent:1", "restartPolicy": "Always"}
    job["spec"]["initContainers"].insert(0, agent)
    job["metadata"]["annotations"][p.ANNOTATION_SIDECARS] = "mesh-agent"
    assert rewrite(job, ON).strategy == p.MODE_HYBRID
    del job["metadata"]["annotations"][p.ANNOTATION_SIDECARS]
    assert rewrite(job, ON).reason == "no-sidecar"
    job["metadata"]["annotations"][p.ISTIO_INJECT_ANNOTATION] = "true"
    assert rewrite(job, ON).changed, "a proxy injected later still needs the rewrite"


def test_main_with_liveness_probe_is_warned():
    # The kubelet probes a regular container from its start: a main waiting for the steps
    # under the waiter fails its liveness or startup probe, and restartPolicy Never ends it.
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    assert not any("livenessProbe" in w for w in rewrite(pod, ON).warnings)
    pod["spec"]["containers"][0]["livenessProbe"] = {"tcpSocket": {"port": 8080}}
    warnings = rewrite(pod, ON).warnings
    assert any("'build'" in w and "livenessProbe" in w for w in warnings), warnings


# --- the kubelet's hold: a classic proxy's readiness wait -----------------------------------------

def test_linkerds_await_goes_where_step_0_waits_for_the_proxy_and_comes_back_when_not():
    """Linkerd puts its proxy first among the containers with `linkerd-await` as postStart:
    the kubelet creates nothing after it until the proxy is ready, which step 0's gate waits
    for anyway. A re-invocation that brings a regular container the waiter does not run (it
    would start before the proxy is ready) puts the hook back."""
    from webhook.rewrite._hold import removed_post_start

    src = CATALOGUE["kpack-linkerd"]
    result = rewrite(src, ON)
    out = result.pod
    assert result.strategy == p.MODE_WAITER
    proxy = next(c for c in out["spec"]["containers"] if c["name"] == "linkerd-proxy")
    was = next(c for c in src["spec"]["containers"] if c["name"] == "linkerd-proxy")
    served = [*was["env"], {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true"}]  # the quit needs it (test_quit.py)
    assert proxy == {**{k: v for k, v in was.items() if k != "lifecycle"}, "env": served}, \
        "untouched but for its readiness wait"
    assert removed_post_start(out) == {"linkerd-proxy": was["lifecycle"]["postStart"]}
    assert any("removed the postStart hook of 'linkerd-proxy'" in w for w in result.warnings)
    assert rewrite(out, ON).pod == out, "re-invocation keeps it"
    late = copy.deepcopy(out)
    late["spec"]["containers"].append({"name": "log-shipper", "image": "fluent-bit:3", "command": ["fluent-bit"]})
    back = rewrite(late, ON).pod
    proxy = next(c for c in back["spec"]["containers"] if c["name"] == "linkerd-proxy")
    assert proxy["lifecycle"]["postStart"] == was["lifecycle"]["postStart"] and removed_post_start(back) == {}
    assert_valid_pod(back)


def test_a_sidecar_after_a_main_with_a_poststart_hook_starts_before_the_steps():
    """The kubelet starts regular containers one by one, each once the hook of the one
    before has returned: a main's postStart hook that waits for its own program (held by
    the waiter until the proxy is ready) kept Istio's proxy, appended after it, from ever
    starting (a pod Pending for good on v1.34.9). Such a sidecar goes ahead of the steps;
    a pod without such a hook keeps its order, and a re-invocation changes nothing."""
    hook = {"postStart": {"exec": {"command": ["sh", "-c", "until [ -f /tmp/up ]; do sleep 1; done"]}}}
    pod = copy.deepcopy(CATALOGUE["kpack-istio"])
    pod["spec"]["containers"][0]["lifecycle"] = hook
    result = rewrite(pod, ON)
    assert result.changed and result.strategy == p.MODE_WAITER
    names = [c["name"] for c in result.pod["spec"]["containers"]]
    assert names == ["istio-proxy", "prepare", "analyze", "detect", "restore", "build", "export", "completion"], names
    assert_valid_pod(result.pod)
    again = rewrite(result.pod, ON)
    assert again.pod == result.pod and not make_patch(result.pod, again.pod)
    plain = rewrite(copy.deepcopy(CATALOGUE["kpack-istio"]), ON).pod
    assert [c["name"] for c in plain["spec"]["containers"]][-1] == "istio-proxy", "no hook: the proxy stays last"
    # A proxy a mesh adds after initshift's rewrite (a re-invocation) moves the same way.
    bare = copy.deepcopy(CATALOGUE["kpack"])
    bare["metadata"].setdefault("annotations", {})[p.ANNOTATION_MODE] = p.MODE_WAITER
    bare["spec"]["containers"][0]["lifecycle"] = hook
    first = rewrite(bare, ON)
    assert first.changed, first.warnings
    injected = copy.deepcopy(first.pod)
    injected["spec"]["containers"].append({"name": "istio-proxy", "image": "proxyv2", "readinessProbe": {
        "httpGet": {"path": "/healthz/ready", "port": 15021}}})
    refreshed = rewrite(injected, ON)
    assert refreshed.changed, refreshed.warnings
    assert [c["name"] for c in refreshed.pod["spec"]["containers"]][0] == "istio-proxy"
    assert_valid_pod(refreshed.pod)
    assert rewrite(refreshed.pod, ON).pod == refreshed.pod


@pytest.mark.parametrize("mode", ["waiter", "hybrid", "native"])
def test_pull_secrets_go_with_initshifts_image(mode: str) -> None:
    # INITSHIFT_IMAGE_PULL_SECRETS: the pod that gets a container of initshift's image can
    # pull it; its own secrets stay first, a name it has already is not repeated.
    settings = with_settings(image_pull_secrets=("platform-registry", "mirror"))
    pod = copy.deepcopy(CATALOGUE["kpack-istio"])
    pod["spec"]["imagePullSecrets"] = [{"name": "builds"}, {"name": "mirror"}]
    pod["metadata"]["annotations"][p.ANNOTATION_MODE] = mode
    result = rewrite(pod, settings, native_supported=True)
    assert result.changed and result.strategy == mode, result.warnings
    spec = result.pod["spec"]
    images = {c["image"] for c in [*spec["initContainers"], *spec["containers"]]}
    if mode == "native":  # the proxy made native: nothing of initshift's image in the pod
        assert settings.rewrite.image not in images and spec["imagePullSecrets"] == pod["spec"]["imagePullSecrets"]
        return
    assert settings.rewrite.image in images
    assert spec["imagePullSecrets"] == [{"name": "builds"}, {"name": "mirror"}, {"name": "platform-registry"}]
    assert_valid_pod(result.pod)
    assert rewrite(result.pod, settings, native_supported=True).pod == result.pod, "re-invocation adds nothing"


def test_no_pull_secrets_by_default() -> None:
    for name in ("kpack-istio", "job-istio"):  # with secrets of its own, and without
        pod = CATALOGUE[name]
        out = rewrite(pod, ON).pod
        assert out["spec"].get("imagePullSecrets") == pod["spec"].get("imagePullSecrets"), name


@pytest.mark.parametrize("secrets", [[{"name": []}], [{"name": {}}], ["registry"], {"name": "registry"}])
@pytest.mark.parametrize("names", [(), ("platform-registry",)])
def test_malformed_pull_secrets_leave_the_pod_unchanged(secrets, names) -> None:
    # The apiserver refuses such a pod after the webhooks; the rewrite never trips on it.
    pod = copy.deepcopy(CATALOGUE["kpack-istio"])
    pod["spec"]["imagePullSecrets"] = secrets
    result = rewrite(pod, with_settings(image_pull_secrets=names))
    assert not result.changed and result.reason == "invalid" and "imagePullSecrets" in result.warnings[0]


def kubectl_default(pod: dict) -> str:
    """The container kubectl's `logs`, `exec`, `attach` and `cp` take without `-c`, as
    kubectl's podcmd.FindOrDefaultContainerByName picks it."""
    spec = pod["spec"]
    named = (pod["metadata"].get("annotations") or {}).get(p.DEFAULT_CONTAINER_ANNOTATION)
    if named:
        everywhere = [*spec["containers"], *(spec.get("initContainers") or []),
                      *(spec.get("ephemeralContainers") or [])]
        assert named in names(everywhere), f"{named!r} names no container: kubectl would fail"
        return named
    return spec["containers"][0]["name"]


@pytest.mark.parametrize("mode", [p.MODE_WAITER, p.MODE_NATIVE, p.MODE_HYBRID])
@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_kubectl_takes_the_pods_own_container_after_the_rewrite(name: str, mode: str) -> None:
    """Never a step or initshift's copier: the container kubectl took before, where it is
    still a regular container, else the first of the pod's regular containers still one."""
    pod = CATALOGUE[name]
    after = rewrite(pod, with_settings(mode=mode), native_supported=True).pod
    was, now = names(pod["spec"]["containers"]), names(after["spec"]["containers"])
    own = kubectl_default(pod) if kubectl_default(pod) in now else next(c for c in was if c in now)
    assert kubectl_default(after) == own


def test_the_default_container_is_named_only_where_the_rewrite_puts_another_first() -> None:
    linkerd = CATALOGUE["job-linkerd"]
    assert names(linkerd["spec"]["containers"]) == ["linkerd-proxy", "build"]
    hybrid = rewrite(linkerd, with_settings(mode=p.MODE_HYBRID), native_supported=True).pod
    assert names(hybrid["spec"]["containers"])[:2] == [p.COPY_CONTAINER_NAME, "git-clone"]
    assert hybrid["metadata"]["annotations"][p.DEFAULT_CONTAINER_ANNOTATION] == "build"  # the proxy is native now
    for mode in (p.MODE_WAITER, p.MODE_NATIVE):  # the proxy, or the main, stays first: nothing to name
        after = rewrite(linkerd, with_settings(mode=mode), native_supported=True).pod
        assert p.DEFAULT_CONTAINER_ANNOTATION not in after["metadata"]["annotations"], mode
    istio = CATALOGUE["kpack-istio"]  # Istio's injector named it: kept, whatever comes first
    assert istio["metadata"]["annotations"][p.DEFAULT_CONTAINER_ANNOTATION] == "completion"
    assert rewrite(istio, with_settings(mode=p.MODE_HYBRID), native_supported=True).pod["metadata"][
        "annotations"][p.DEFAULT_CONTAINER_ANNOTATION] == "completion"
    unmeshed = copy.deepcopy(CATALOGUE["kpack"])  # rewritten ahead of the mesh: its injector then keeps ours
    unmeshed["metadata"].setdefault("annotations", {})[p.ISTIO_INJECT_ANNOTATION] = "true"
    first = rewrite(unmeshed, with_settings(mode=p.MODE_WAITER), native_supported=False)
    assert first.changed and names(first.pod["spec"]["containers"])[0] == "prepare"
    assert first.pod["metadata"]["annotations"][p.DEFAULT_CONTAINER_ANNOTATION] == "completion"
    again = rewrite(first.pod, with_settings(mode=p.MODE_WAITER), native_supported=False)
    assert again.pod["metadata"]["annotations"] == first.pod["metadata"]["annotations"]


# --- copies of a rewritten pod (`kubectl debug --copy-to`) ------------------------------------
def _copy(pod: dict, *, keep_labels: bool, keep_annotations: bool) -> dict:
    """What `kubectl debug POD --copy-to=COPY` (kubectl 1.30 and later) creates: the spec,
    the labels and annotations only where asked to keep them."""
    meta = {"name": "copy", "namespace": pod["metadata"].get("namespace", "default")}
    for key, keep in (("labels", keep_labels), ("annotations", keep_annotations)):
        if keep and pod["metadata"].get(key):
            meta[key] = copy.deepcopy(pod["metadata"][key])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(pod["spec"])}


def _without_skip_fails(container: dict) -> dict:
    """The container with the waiter's --skip-fails left out of its flags (before `--`)."""
    args = container.get("args")
    if container.get("command") != [p.WAITER_PATH] or not args:
        return container
    cut = args.index(p.ARGV_SEPARATOR)
    return {**container, "args": [a for a in args[:cut] if a != p.FLAG_SKIP_FAILS] + args[cut:]}


@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
@pytest.mark.parametrize("where", ["step", "main"])
def test_a_copy_whose_step_has_a_new_command_runs_it_in_the_steps_place(mode, where):
    # `kubectl debug build --copy-to=debug --keep-labels --keep-annotations --container=STEP -- CMD`:
    # the container's command is CMD, its args none; the rewrite wraps CMD where the step was.
    settings = with_settings(mode=mode)
    first = rewrite(CATALOGUE["kpack-istio"], settings, native_supported=True)
    assert first.changed, first.warnings
    steps = json.loads(first.pod["metadata"]["annotations"][p.ANNOTATION_STEPS])
    mains = json.loads(first.pod["metadata"]["annotations"][p.ANNOTATION_MAINS])
    name = steps[2] if where == "step" else mains[0]
    copied = _copy(first.pod, keep_labels=True, keep_annotations=True)
    replaced = next(c for c in copied["spec"]["containers"] if c["name"] == name)
    replaced["command"], replaced["args"] = ["sh", "-c", "echo debugging $(HOME) in 'here'"], None
    result = rewrite(copied, settings, native_supported=True)
    assert result.changed and result.reason == "refreshed", result.warnings
    assert_valid_pod(result.pod)
    by_name = {c["name"]: c for c in result.pod["spec"]["containers"]}
    # The copy has no owner (kubectl debug drops it): nothing reads its codes, its skips exit 0.
    assert any(p.FLAG_SKIP_FAILS in (c.get("args") or ()) for c in first.pod["spec"]["containers"])
    before = {c["name"]: _without_skip_fails(c) for c in first.pod["spec"]["containers"]}
    assert by_name[name]["command"] == [p.WAITER_PATH]
    assert argv_after_separator(by_name[name]) == ["sh", "-c", "echo debugging $(HOME) in 'here'"]
    assert by_name[name]["args"][:-3] == before[name]["args"][:before[name]["args"].index(p.ARGV_SEPARATOR) + 1]
    assert {n: c for n, c in by_name.items() if n != name} == {n: c for n, c in before.items() if n != name}
    assert rewrite(result.pod, settings, native_supported=True).pod == result.pod


def test_a_copy_whose_step_keeps_the_waiter_but_has_new_args_is_left_unchanged_saying_why():
    # `--arguments-only` replaces args and leaves the waiter as the command: nothing to run
    first = rewrite(CATALOGUE["kpack-istio"], ON).pod
    copied = _copy(first, keep_labels=True, keep_annotations=True)
    copied["spec"]["containers"][1]["args"] = ["--verbose"]
    result = rewrite(copied, ON)
    assert not result.changed and result.reason == "invalid", result.warnings
    assert "is not run by the waiter" in result.warnings[0]


@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
@pytest.mark.parametrize("keep_annotations", [False, True])
def test_a_copy_without_initshifts_label_is_left_unchanged_saying_how_to_keep_it(mode, keep_annotations):
    # kubectl's defaults drop the labels and annotations: initshift's containers stay, the
    # label that says so goes; rewriting the copy again would wrap the waiter in the waiter.
    settings = with_settings(mode=mode)
    first = rewrite(CATALOGUE["kpack-istio"], settings, native_supported=True).pod
    copied = _copy(first, keep_labels=False, keep_annotations=keep_annotations)
    result = rewrite(copied, settings, native_supported=True)
    assert not result.changed and result.reason == "reserved", result.warnings
    own = p.INIT_CONTAINER_NAME if mode == "waiter" else p.COPY_CONTAINER_NAME
    assert result.warnings == [f"initshift: the pod holds {own!r}, initshift's own container, but not its "
                               f"{p.LABEL_MANAGED} label: a copy of a pod initshift rewrote, made without its labels "
                               f"(`kubectl debug --copy-to` drops them unless given --keep-labels --keep-annotations, "
                               f"which kubectl before v1.36 reads only with --profile=general; with those and the "
                               f"probes, --keep-readiness --keep-startup, a step whose command the copy replaces runs "
                               f"in the step's place); admitted unchanged"]


def test_a_pod_naming_a_container_like_initshifts_own_is_told_the_name_is_reserved():
    # without initshift's volume it is no copy: the reserved-name rule speaks
    pod = copy.deepcopy(CATALOGUE["kpack-istio"])
    pod["spec"]["initContainers"][0]["name"] = p.INIT_CONTAINER_NAME
    result = rewrite(pod, ON)
    assert result.reason == "reserved" and "is reserved by initshift" in result.warnings[0], result.warnings


def _skip_flags(pod: dict) -> set[bool]:
    """Whether each container the waiter runs was given --skip-fails."""
    return {p.FLAG_SKIP_FAILS in c["args"][:c["args"].index(p.ARGV_SEPARATOR)]
            for c in pod["spec"]["containers"] if c.get("command") == [p.WAITER_PATH]}


def _owned(pod: dict, *refs: dict) -> dict:
    pod = copy.deepcopy(pod)
    pod["metadata"]["ownerReferences"] = list(refs)
    return pod


BUILD = {"apiVersion": "kpack.io/v1alpha2", "kind": "Build", "name": "b", "uid": "u1", "controller": True}
JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u2", "controller": True}


@pytest.mark.parametrize("mode", ["waiter", "hybrid"])
@pytest.mark.parametrize("owners, restart, fails", [
    ([BUILD], "Never", True),  # kpack reads completion's code: a skip must not read as success
    ([{**BUILD, "kind": "TaskRun", "apiVersion": "tekton.dev/v1"}], "Never", True),
    ([JOB], "Never", False),  # podFailurePolicy: a rule for the main must not match a skip
    ([{**JOB, "apiVersion": "batch.volcano.sh/v1alpha1"}], "Never", True),  # not batch's Job
    ([], "Never", False),  # no controller: people read it, and mutate reads a Job's template so
    ([{**BUILD, "controller": False}], "Never", False),  # an owner, not the controller
    ([BUILD], "OnFailure", False),  # a skipped container exiting non-zero would restart
])
def test_skips_fail_where_a_controller_other_than_a_job_reads_the_codes(mode, owners, restart, fails):
    pod = _owned(CATALOGUE["kpack-istio"], *owners)
    pod["spec"]["restartPolicy"] = restart
    result = rewrite(pod, with_settings(mode=mode), native_supported=True)
    assert result.changed, result.warnings
    assert _skip_flags(result.pod) == {fails}
    assert rewrite(result.pod, with_settings(mode=mode), native_supported=True).pod == result.pod


@pytest.mark.parametrize("native_supported", [False, True], ids=["waiter", "hybrid"])
def test_fallback_to_logs_on_error_keeps_the_kubelets_file_empty(native_supported: bool):
    # The kubelet makes a failed container's log tail its termination message only where
    # the file is empty: the waiter's record there hid a failing step's own words (seen on
    # v1.34.9: `{"exitCode": 2, ... "message": "exited with code 2"}` where the pod without
    # initshift showed the step's last log line). Such a container's record goes to its
    # own run dir; the others' stays the kubelet's file, and a path the pod sets is left
    # to its program, as before.
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    clone = pod["spec"]["initContainers"][1]
    clone["terminationMessagePolicy"] = "FallbackToLogsOnError"
    pod["spec"]["initContainers"].append({"name": "test", "image": "busybox:1.36", "command": ["make", "test"],
                                          "terminationMessagePolicy": "File"})
    main = pod["spec"]["containers"][0]
    main |= {"terminationMessagePolicy": "FallbackToLogsOnError", "terminationMessagePath": "/tmp/result"}
    settings = with_settings(mode=p.MODE_HYBRID if native_supported else p.MODE_WAITER)
    out = rewrite(pod, settings, native_supported=native_supported).pod
    wrapped = {c["name"]: c for c in out["spec"]["containers"] if c["name"] in ("git-clone", "test", "build")}
    logs = {name: flag_values(c, p.FLAG_TERMINATION_LOG) for name, c in wrapped.items()}
    assert logs["test"] == [] and logs["build"] == []
    [own] = logs["git-clone"]
    writable = {m["mountPath"] for m in wrapped["git-clone"]["volumeMounts"] if not m.get("readOnly")}
    assert posixpath.dirname(own) in writable and posixpath.dirname(own) == posixpath.dirname(
        flag_values(wrapped["git-clone"], p.FLAG_POST)[0]), "its own run dir, writable by it alone"
    pairs, _ = waiter_flags.split(wrapped["git-clone"]["args"][1:], waiter_flags.RUN)  # as the waiter reads it
    assert (p.FLAG_TERMINATION_LOG, own) in pairs
    assert rewrite(out, settings, native_supported=native_supported).pod == out
    assert_valid_pod(out)


@pytest.mark.parametrize("native_supported", [False, True], ids=["waiter", "hybrid"])
def test_a_steps_env_that_reads_its_own_request_gets_the_request_as_admitted(native_supported: bool):
    # The kubelet gives `resourceFieldRef: requests.*` the container's request as it runs:
    # once the steps run side by side that is their share of the budget (seen on v1.34.9:
    # a step's 300m read as 0 under `preserve`). The value it would give the step as
    # admitted is written instead; limits, which the rewrite keeps, are left to the kubelet.
    pod = copy.deepcopy(CATALOGUE["job-istio"])
    ref = lambda resource, **kw: {"valueFrom": {"resourceFieldRef": {"resource": resource, **kw}}}  # noqa: E731
    clone = pod["spec"]["initContainers"][1]
    clone["resources"] = {"requests": {"cpu": "300m", "memory": "100Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    clone["env"] = [{"name": "CPU_MILLIS", **ref("requests.cpu", divisor="1m")},
                    {"name": "CPUS", **ref("requests.cpu", divisor="1")},
                    {"name": "MEM_MI", **ref("requests.memory", divisor="1Mi", containerName="git-clone")},
                    {"name": "DISK", **ref("requests.ephemeral-storage")},
                    {"name": "CPU_LIMIT", **ref("limits.cpu")},
                    {"name": "BUILD_CPU", **ref("requests.cpu", containerName="build")},
                    {"name": "WORKERS", "value": "$(CPU_MILLIS)"}]
    pod["spec"]["initContainers"].append({"name": "test", "image": "busybox:1.36", "command": ["make", "test"],
                                          "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}})
    settings = with_settings(mode=p.MODE_HYBRID if native_supported else p.MODE_WAITER)
    out = rewrite(pod, settings, native_supported=native_supported).pod
    step = next(c for c in out["spec"]["containers"] if c["name"] == "git-clone")
    assert step["resources"]["requests"] != clone["resources"]["requests"], "the step's request is the budget's now"
    assert step["env"] == [{"name": "CPU_MILLIS", "value": "300"}, {"name": "CPUS", "value": "1"},
                           {"name": "MEM_MI", "value": "100"}, {"name": "DISK", "value": "0"},
                           clone["env"][4], clone["env"][5], clone["env"][6]]
    assert rewrite(out, settings, native_supported=native_supported).pod == out
    assert_valid_pod(out)
