"""The Pod Security checker (tests/pss.py) itself: a compliant pod passes, and each
control of the policy table catches its field, so the deploy checks that rely on it can fail."""

from __future__ import annotations

import copy
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import pss

RESTRICTED_SC = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def compliant() -> dict:
    return {
        "metadata": {"annotations": {}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [{"name": "init", "image": "x", "securityContext": copy.deepcopy(RESTRICTED_SC)}],
            "containers": [{"name": "main", "image": "x", "securityContext": copy.deepcopy(RESTRICTED_SC),
                            "ports": [{"containerPort": 80}]}],
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "s"}}],
        },
    }


def _c(pod: dict, i: int = 0, kind: str = "containers") -> dict:
    return pod["spec"][kind][i]["securityContext"]


# (name, mutation, control, field, level at which it is a violation)
CASES: list[tuple[str, Callable[[dict], None], str, str, str]] = [
    ("hostProcess", lambda p: _c(p).update(windowsOptions={"hostProcess": True}), "HostProcess",
     "spec.containers[0].securityContext.windowsOptions.hostProcess", pss.BASELINE),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "Host Namespaces", "spec.hostNetwork", pss.BASELINE),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "Host Namespaces", "spec.hostPID", pss.BASELINE),
    ("privileged", lambda p: _c(p, 0, "initContainers").update(privileged=True), "Privileged Containers",
     "spec.initContainers[0].securityContext.privileged", pss.BASELINE),
    ("cap-sys-admin", lambda p: _c(p)["capabilities"].update(add=["SYS_ADMIN"]), "Capabilities",
     "spec.containers[0].securityContext.capabilities.add[0]", pss.BASELINE),
    ("hostPath", lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
     "HostPath Volumes", "spec.volumes[2].hostPath", pss.BASELINE),
    ("hostPort", lambda p: p["spec"]["containers"][0]["ports"][0].update(hostPort=80), "Host Ports",
     "spec.containers[0].ports[0].hostPort", pss.BASELINE),
    ("apparmor-field", lambda p: _c(p).update(appArmorProfile={"type": "Unconfined"}), "AppArmor",
     "spec.containers[0].securityContext.appArmorProfile.type", pss.BASELINE),
    ("apparmor-annotation", lambda p: p["metadata"]["annotations"].update(
        {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}), "AppArmor",
     "metadata.annotations[container.apparmor.security.beta.kubernetes.io/main]", pss.BASELINE),
    ("selinux-type", lambda p: p["spec"]["securityContext"].update(seLinuxOptions={"type": "spc_t"}), "SELinux",
     "spec.securityContext.seLinuxOptions.type", pss.BASELINE),
    ("selinux-user", lambda p: _c(p).update(seLinuxOptions={"user": "root"}), "SELinux",
     "spec.containers[0].securityContext.seLinuxOptions.user", pss.BASELINE),
    ("procMount", lambda p: _c(p).update(procMount="Unmasked"), "/proc Mount Type",
     "spec.containers[0].securityContext.procMount", pss.BASELINE),
    ("seccomp-unconfined", lambda p: _c(p).update(seccompProfile={"type": "Unconfined"}), "Seccomp",
     "spec.containers[0].securityContext.seccompProfile.type", pss.BASELINE),
    ("sysctl", lambda p: p["spec"]["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
     "Sysctls", "spec.securityContext.sysctls[0].name", pss.BASELINE),
    ("nfs-volume", lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
     "Volume Types", "spec.volumes[2].nfs", pss.RESTRICTED),
    ("escalation-unset", lambda p: _c(p).pop("allowPrivilegeEscalation"), "Privilege Escalation",
     "spec.containers[0].securityContext.allowPrivilegeEscalation", pss.RESTRICTED),
    ("escalation-true", lambda p: _c(p, 0, "initContainers").update(allowPrivilegeEscalation=True),
     "Privilege Escalation", "spec.initContainers[0].securityContext.allowPrivilegeEscalation", pss.RESTRICTED),
    ("non-root-unset", lambda p: p["spec"]["securityContext"].pop("runAsNonRoot"), "Running as Non-root",
     "spec.containers[0].securityContext.runAsNonRoot", pss.RESTRICTED),
    ("non-root-false", lambda p: _c(p).update(runAsNonRoot=False), "Running as Non-root",
     "spec.containers[0].securityContext.runAsNonRoot", pss.RESTRICTED),
    ("uid-0", lambda p: _c(p).update(runAsUser=0), "Running as Non-root user",
     "spec.containers[0].securityContext.runAsUser", pss.RESTRICTED),
    ("seccomp-unset", lambda p: p["spec"]["securityContext"].pop("seccompProfile"), "Seccomp",
     "spec.containers[0].securityContext.seccompProfile.type", pss.RESTRICTED),
    ("drop-missing", lambda p: _c(p)["capabilities"].pop("drop"), "Capabilities",
     "spec.containers[0].securityContext.capabilities.drop", pss.RESTRICTED),
    ("add-chown", lambda p: _c(p)["capabilities"].update(add=["CHOWN"]), "Capabilities",
     "spec.containers[0].securityContext.capabilities.add[0]", pss.RESTRICTED),
    ("ephemeral", lambda p: p["spec"].update(ephemeralContainers=[{"name": "debug", "image": "x"}]),
     "Privilege Escalation", "spec.ephemeralContainers[0].securityContext.allowPrivilegeEscalation", pss.RESTRICTED),
]


def test_compliant_pod_passes():
    assert pss.pod_violations(compliant()) == []
    assert pss.pod_violations(compliant(), pss.BASELINE) == []


@pytest.mark.parametrize("name,mutate,control,field,level", CASES, ids=[c[0] for c in CASES])
def test_each_control_catches_its_field(name, mutate, control, field, level):
    pod = compliant()
    mutate(pod)
    found = {(v.control, v.field) for v in pss.pod_violations(pod)}
    assert (control, field) in found, found
    at_baseline = {(v.control, v.field) for v in pss.pod_violations(pod, pss.BASELINE)}
    assert ((control, field) in at_baseline) == (level == pss.BASELINE)


def test_allowed_values_pass():
    pod = compliant()
    _c(pod)["capabilities"]["add"] = ["NET_BIND_SERVICE"]
    _c(pod).update(seccompProfile={"type": "Localhost", "localhostProfile": "p.json"}, runAsUser=1000,
                   seLinuxOptions={"type": "container_t", "level": "s0:c1"}, procMount="Default",
                   appArmorProfile={"type": "RuntimeDefault"})
    pod["spec"]["securityContext"]["sysctls"] = [{"name": "net.ipv4.ip_local_port_range", "value": "1 2"}]
    pod["metadata"]["annotations"]["container.apparmor.security.beta.kubernetes.io/main"] = "localhost/p"
    pod["spec"]["volumes"].append({"name": "c", "configMap": {"name": "c"}})
    assert pss.pod_violations(pod) == []


def test_container_level_settings_override_pod_level():
    pod = compliant()
    pod["spec"]["securityContext"] = {}
    for kind in ("initContainers", "containers"):
        _c(pod, 0, kind).update(runAsNonRoot=True, seccompProfile={"type": "RuntimeDefault"})
    assert pss.pod_violations(pod) == []
    pod["spec"]["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    _c(pod).update(seccompProfile={"type": "Unconfined"})
    assert [v.control for v in pss.pod_violations(pod)] == ["Seccomp"]


def test_standalone_container_needs_its_own_settings():
    c = {"name": "c", "image": "x", "securityContext": copy.deepcopy(RESTRICTED_SC)}
    assert {v.control for v in pss.container_violations(c)} == {"Running as Non-root", "Seccomp"}
    c["securityContext"].update(runAsNonRoot=True, seccompProfile={"type": "RuntimeDefault"})
    assert pss.container_violations(c) == []


def test_template_of_workloads():
    pod = compliant()
    deployment = {"kind": "Deployment", "spec": {"template": pod}}
    cronjob = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": pod}}}}
    assert pss.template_violations(deployment) == pss.template_violations(cronjob) == []
    pod["spec"]["hostIPC"] = True
    assert [v.field for v in pss.template_violations(deployment)] == ["template.spec.hostIPC"]
    with pytest.raises(ValueError):
        pss.template_violations({"kind": "Service"})
    with pytest.raises(ValueError):
        pss.pod_violations(pod, "privileged-ish")


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from(range(len(CASES))), min_size=1, max_size=5))
def test_combined_violations_are_all_reported(indexes):
    pod = compliant()
    for i in sorted(indexes):
        CASES[i][1](pod)
    found = {(v.control, v.field) for v in pss.pod_violations(pod)}
    for i in indexes:
        _, _, control, field, _ = CASES[i]
        # Two mutations of the same list can shift an index (volumes[2]); compare by control then.
        assert (control, field) in found or control in {c for c, _ in found}
