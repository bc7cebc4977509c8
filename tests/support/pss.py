"""Pod Security Standards checker, "baseline" and "restricted", field by field.

Follows the policy table of https://kubernetes.io/docs/concepts/security/pod-security-standards/
(version "latest"), one function per control, each naming the exact field that fails.
Stricter than the admission plugin in one way only: the Windows exemptions
(`spec.os.name: windows`) are not applied, because initshift does not run on Windows.

Use `pod_violations(pod)` for a Pod, `template_violations(obj)` for a workload's pod
template (Deployment, Job, ...), `container_violations(c)` for one container that must
pass on its own, whatever pod it is injected into (no pod-level securityContext to lean on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

BASELINE = "baseline"
RESTRICTED = "restricted"

BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
RESTRICTED_ADD_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
RESTRICTED_VOLUME_TYPES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
WORKLOAD_TEMPLATES = {
    "Deployment": ("spec", "template"), "StatefulSet": ("spec", "template"), "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"), "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@dataclass(frozen=True)
class Violation:
    control: str  # the control's name in the policy table
    field: str  # path of the offending field, e.g. spec.containers[0].securityContext.privileged
    value: Any  # what it holds (None: missing where a value is required)

    def __str__(self) -> str:
        return f"{self.control}: {self.field} = {self.value!r}"


class _Pod:
    """Uniform access to a pod spec, its annotations and every container with its path."""

    def __init__(self, spec: Mapping, annotations: Mapping | None, prefix: str) -> None:
        self.spec, self.annotations, self.prefix = spec, annotations or {}, prefix

    @property
    def sc(self) -> Mapping:
        return self.spec.get("securityContext") or {}

    def containers(self) -> Iterator[tuple[str, Mapping]]:
        for kind in CONTAINER_LISTS:
            for i, c in enumerate(self.spec.get(kind) or []):
                yield f"{self.prefix}spec.{kind}[{i}]", c


def _csc(c: Mapping) -> Mapping:
    return c.get("securityContext") or {}


# --- baseline ---------------------------------------------------------------------------

def _host_process(pod: _Pod) -> Iterator[Violation]:
    if (pod.sc.get("windowsOptions") or {}).get("hostProcess"):
        yield Violation("HostProcess", f"{pod.prefix}spec.securityContext.windowsOptions.hostProcess", True)
    for path, c in pod.containers():
        if (_csc(c).get("windowsOptions") or {}).get("hostProcess"):
            yield Violation("HostProcess", f"{path}.securityContext.windowsOptions.hostProcess", True)


def _host_namespaces(pod: _Pod) -> Iterator[Violation]:
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.spec.get(name):
            yield Violation("Host Namespaces", f"{pod.prefix}spec.{name}", pod.spec[name])


def _privileged(pod: _Pod) -> Iterator[Violation]:
    for path, c in pod.containers():
        if _csc(c).get("privileged"):
            yield Violation("Privileged Containers", f"{path}.securityContext.privileged", True)


def _baseline_capabilities(pod: _Pod) -> Iterator[Violation]:
    for path, c in pod.containers():
        for i, cap in enumerate((_csc(c).get("capabilities") or {}).get("add") or []):
            if cap not in BASELINE_CAPABILITIES:
                yield Violation("Capabilities", f"{path}.securityContext.capabilities.add[{i}]", cap)


def _host_path(pod: _Pod) -> Iterator[Violation]:
    for i, v in enumerate(pod.spec.get("volumes") or []):
        if "hostPath" in v:
            yield Violation("HostPath Volumes", f"{pod.prefix}spec.volumes[{i}].hostPath", v["hostPath"])


def _host_ports(pod: _Pod) -> Iterator[Violation]:
    for path, c in pod.containers():
        for i, port in enumerate(c.get("ports") or []):
            if port.get("hostPort"):
                yield Violation("Host Ports", f"{path}.ports[{i}].hostPort", port["hostPort"])


def _apparmor(pod: _Pod) -> Iterator[Violation]:
    def bad(profile: Mapping) -> bool:
        return profile.get("type") not in (None, "RuntimeDefault", "Localhost")

    if bad(pod.sc.get("appArmorProfile") or {}):
        yield Violation("AppArmor", f"{pod.prefix}spec.securityContext.appArmorProfile.type",
                        pod.sc["appArmorProfile"]["type"])
    for path, c in pod.containers():
        profile = _csc(c).get("appArmorProfile") or {}
        if bad(profile):
            yield Violation("AppArmor", f"{path}.securityContext.appArmorProfile.type", profile["type"])
    for key, value in pod.annotations.items():
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not (
                value == "runtime/default" or str(value).startswith("localhost/")):
            yield Violation("AppArmor", f"{pod.prefix}metadata.annotations[{key}]", value)


def _selinux(pod: _Pod) -> Iterator[Violation]:
    places = [(f"{pod.prefix}spec.securityContext", pod.sc)]
    places += [(f"{path}.securityContext", _csc(c)) for path, c in pod.containers()]
    for path, sc in places:
        opts = sc.get("seLinuxOptions") or {}
        if opts.get("type", "") not in SELINUX_TYPES:
            yield Violation("SELinux", f"{path}.seLinuxOptions.type", opts["type"])
        for key in ("user", "role"):
            if opts.get(key):
                yield Violation("SELinux", f"{path}.seLinuxOptions.{key}", opts[key])


def _proc_mount(pod: _Pod) -> Iterator[Violation]:
    for path, c in pod.containers():
        if _csc(c).get("procMount", "Default") != "Default":
            yield Violation("/proc Mount Type", f"{path}.securityContext.procMount", _csc(c)["procMount"])


def _baseline_seccomp(pod: _Pod) -> Iterator[Violation]:
    places = [(f"{pod.prefix}spec.securityContext", pod.sc)]
    places += [(f"{path}.securityContext", _csc(c)) for path, c in pod.containers()]
    for path, sc in places:
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield Violation("Seccomp", f"{path}.seccompProfile.type", "Unconfined")


def _sysctls(pod: _Pod) -> Iterator[Violation]:
    for i, s in enumerate(pod.sc.get("sysctls") or []):
        if s.get("name") not in SAFE_SYSCTLS:
            yield Violation("Sysctls", f"{pod.prefix}spec.securityContext.sysctls[{i}].name", s.get("name"))


# --- restricted -------------------------------------------------------------------------

def _volume_types(pod: _Pod) -> Iterator[Violation]:
    for i, v in enumerate(pod.spec.get("volumes") or []):
        for key in v:
            if key != "name" and key not in RESTRICTED_VOLUME_TYPES:
                yield Violation("Volume Types", f"{pod.prefix}spec.volumes[{i}].{key}", v[key])


def _privilege_escalation(pod: _Pod) -> Iterator[Violation]:
    for path, c in pod.containers():
        value = _csc(c).get("allowPrivilegeEscalation")
        if value is not False:
            yield Violation("Privilege Escalation", f"{path}.securityContext.allowPrivilegeEscalation", value)


def _run_as_non_root(pod: _Pod) -> Iterator[Violation]:
    pod_level = pod.sc.get("runAsNonRoot")
    if pod_level is False:
        yield Violation("Running as Non-root", f"{pod.prefix}spec.securityContext.runAsNonRoot", False)
    for path, c in pod.containers():
        value = _csc(c).get("runAsNonRoot")
        if value is False or (value is None and pod_level is not True):
            yield Violation("Running as Non-root", f"{path}.securityContext.runAsNonRoot", value)


def _run_as_user(pod: _Pod) -> Iterator[Violation]:
    if pod.sc.get("runAsUser") == 0:
        yield Violation("Running as Non-root user", f"{pod.prefix}spec.securityContext.runAsUser", 0)
    for path, c in pod.containers():
        if _csc(c).get("runAsUser") == 0:
            yield Violation("Running as Non-root user", f"{path}.securityContext.runAsUser", 0)


def _restricted_seccomp(pod: _Pod) -> Iterator[Violation]:
    pod_type = (pod.sc.get("seccompProfile") or {}).get("type")
    if pod_type is not None and pod_type not in SECCOMP_ALLOWED:
        yield Violation("Seccomp", f"{pod.prefix}spec.securityContext.seccompProfile.type", pod_type)
    for path, c in pod.containers():
        value = (_csc(c).get("seccompProfile") or {}).get("type")
        if value is None and pod_type in SECCOMP_ALLOWED:
            continue
        if value not in SECCOMP_ALLOWED:
            yield Violation("Seccomp", f"{path}.securityContext.seccompProfile.type", value)


def _restricted_capabilities(pod: _Pod) -> Iterator[Violation]:
    for path, c in pod.containers():
        caps = _csc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            yield Violation("Capabilities", f"{path}.securityContext.capabilities.drop", caps.get("drop"))
        for i, cap in enumerate(caps.get("add") or []):
            if cap not in RESTRICTED_ADD_CAPABILITIES:
                yield Violation("Capabilities", f"{path}.securityContext.capabilities.add[{i}]", cap)


Control = Callable[[_Pod], Iterator[Violation]]
BASELINE_CONTROLS: tuple[Control, ...] = (
    _host_process, _host_namespaces, _privileged, _baseline_capabilities, _host_path, _host_ports,
    _apparmor, _selinux, _proc_mount, _baseline_seccomp, _sysctls,
)
RESTRICTED_CONTROLS: tuple[Control, ...] = BASELINE_CONTROLS + (
    _volume_types, _privilege_escalation, _run_as_non_root, _run_as_user, _restricted_seccomp,
    _restricted_capabilities,
)


def _check(pod: _Pod, level: str) -> list[Violation]:
    if level not in (BASELINE, RESTRICTED):
        raise ValueError(f"unknown Pod Security level {level!r}")
    controls = RESTRICTED_CONTROLS if level == RESTRICTED else BASELINE_CONTROLS
    out: dict[tuple[str, str], Violation] = {}
    for control in controls:
        for v in control(pod):  # the two Seccomp controls can name the same field: keep one
            out.setdefault((v.control, v.field), v)
    return list(out.values())


def pod_violations(pod: Mapping, level: str = RESTRICTED) -> list[Violation]:
    """Violations of a Pod object."""
    meta = pod.get("metadata") or {}
    return _check(_Pod(pod.get("spec") or {}, meta.get("annotations"), ""), level)


def template_violations(obj: Mapping, level: str = RESTRICTED) -> list[Violation]:
    """Violations of a workload's pod template (paths start at the template)."""
    path = WORKLOAD_TEMPLATES.get(str(obj.get("kind")))
    if path is None:
        raise ValueError(f"{obj.get('kind')!r} has no pod template")
    template: Any = obj
    for key in path:
        template = (template or {}).get(key)
    template = template or {}
    meta = template.get("metadata") or {}
    return _check(_Pod(template.get("spec") or {}, meta.get("annotations"), "template."), level)


def container_violations(container: Mapping, level: str = RESTRICTED) -> list[Violation]:
    """Violations of one container placed in a pod that sets nothing at pod level."""
    return _check(_Pod({"containers": [container]}, None, ""), level)
