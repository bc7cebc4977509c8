"""`initshift check`'s lines about initshift's Deployment: its settings as the server will
read them (with the variables the kubelet adds for the namespace's Services, modelled on
the kubelet's own code), its replicas in the kubelet's words, and the Secrets INITSHIFT_IMAGE_PULL_SECRETS
names in each opted-in namespace."""

from __future__ import annotations

import json
from typing import Iterable, Mapping

from ..kube import KubeApi, KubeError
from ..registry import credentials_for
from ..settings import Settings, SettingsError
from ._check_report import Line, Target, selects

_SERVER_CONTAINER = "initshift"  # the Deployment's container (deploy/ and the chart)


def failure_policy_of(webhook: Mapping) -> str:
    """A webhook's failurePolicy; unset is admissionregistration.k8s.io/v1's default, Fail."""
    return str(webhook.get("failurePolicy") or "Fail")


def unanswered(failure_policy: str | None) -> str:
    """What the apiserver does with a pod of an opted-in namespace while no replica answers."""
    return {"Ignore": "pods of opted-in namespaces are created without the rewrite",
            "Fail": "pods of opted-in namespaces are refused"}.get(
        str(failure_policy), "pods of opted-in namespaces are created unchanged (failurePolicy Ignore) or refused (Fail)")


def service_variables(services: Iterable[Mapping]) -> dict[str, str]:
    """The variables the kubelet gives a container for these Services (Kubernetes'
    pkg/kubelet/envvars `FromServices`): for each with a ClusterIP, NAME_SERVICE_HOST,
    NAME_SERVICE_PORT[_PORTNAME] and Docker's links, NAME_PORT=tcp://IP:PORT and
    NAME_PORT_PORT_PROTO[_PROTO|_PORT|_ADDR]. A Service `initshift` names the server's settings."""
    out: dict[str, str] = {}
    for service in services:
        spec, prefix = service.get("spec") or {}, _variable(str(service["metadata"]["name"]))
        ip, ports = spec.get("clusterIP") or "", spec.get("ports") or []
        if ip in ("", "None") or not ports:
            continue
        out[f"{prefix}_SERVICE_HOST"], out[f"{prefix}_SERVICE_PORT"] = ip, str(ports[0]["port"])
        for i, port in enumerate(ports):
            if port.get("name"):
                out[f"{prefix}_SERVICE_PORT_{_variable(port['name'])}"] = str(port["port"])
            proto = str(port.get("protocol") or "TCP")
            address, each = f"{proto.lower()}://{ip}:{port['port']}", f"{prefix}_PORT_{port['port']}_{proto.upper()}"
            if i == 0:
                out[f"{prefix}_PORT"] = address
            out.update({each: address, f"{each}_PROTO": proto.lower(), f"{each}_PORT": str(port["port"]),
                        f"{each}_ADDR": ip})
    return out


def _variable(name: str) -> str:
    return name.replace("-", "_").upper()


def _service_links(deployment: Mapping) -> bool:
    """Whether the kubelet gives the pod its namespace's Service variables (the default)."""
    return deployment.get("spec", {}).get("template", {}).get("spec", {}).get("enableServiceLinks", True)


def server_environment(deployment: dict, services: Iterable[Mapping]) -> dict[str, str]:
    """The server container's variables as the kubelet gives them: those of the namespace's
    `services` unless the pod turns them off (`enableServiceLinks: false`), then the
    container's own values over them. One given by `valueFrom` (the downward API's
    namespace, a ConfigMap) is the server's to read: its default stands in."""
    pod = deployment.get("spec", {}).get("template", {}).get("spec", {})
    containers = pod.get("containers") or []
    server = next((c for c in containers if c.get("name") == _SERVER_CONTAINER), containers[0] if containers else {})
    env = service_variables(services) if _service_links(deployment) else {}
    env.update({str(e.get("name")): str(e["value"]) for e in server.get("env") or [] if e.get("value") is not None})
    return env


async def deployment_lines(api: KubeApi, target: Target, opted: list[str], by_service: bool,
                           failure_policy: str | None = None) -> list[Line]:
    """The Deployment's settings as the server will read them, its replicas, the disruption
    budget over them, and the Secrets the rewrite names for initshift's image in each
    opted-in namespace. `failure_policy`: the webhook's (None: no configuration)."""
    s, where = "deployment", f"{target.namespace}/{target.deployment}"
    try:
        deployment = await api.get_deployment(target.namespace, target.deployment)
    except KubeError as e:
        return [Line(s, False, f"read Deployment {where}", f"{e.message} (your credentials need read access)")]
    if deployment is None:
        return [Line(s, False, f"Deployment {where} exists", "no server runs: re-apply deploy/ (or the chart)")]
    try:
        services = await api.list_services(target.namespace) if _service_links(deployment) else []
    except KubeError as e:
        return [Line(s, False, f"list the Services of {target.namespace} (the kubelet gives the server variables "
                               f"for them)", f"{e.message} (your credentials need list on services there)")]
    try:  # INITSHIFT_IMAGE among them: a reference the kubelet would refuse (InvalidImageName)
        settings = Settings.from_env(server_environment(deployment, services))
    except SettingsError as e:
        return [Line(s, False, f"Deployment {where}: its settings are valid",
                     f"{e}: the server exits at start with this error; fix the variable in the Deployment "
                     f"(the chart: its value)")]
    image = settings.rewrite.image
    replicas = await _replicas_line(api, target, deployment, by_service, failure_policy)
    out = [Line(s, True, f"Deployment {where}: its settings are valid (initshift's image {image})",
                data={"image": image}), replicas]
    if replicas.data.get("ready"):  # during a drain too: a replica not Ready is why the drain waits
        out += await _budget_lines(api, target, deployment, all_ready=replicas.ok)
    names = settings.rewrite.image_pull_secrets
    if names and opted:
        out.append(await _pull_secrets_line(api, image, names, opted))
    return out


async def _replicas_line(api: KubeApi, target: Target, deployment: dict, by_service: bool,
                         failure_policy: str | None) -> Line:
    """Every replica Ready, or what each other pod of the Deployment is doing in the kubelet's
    words: why it waits, how it last ended (the server's last line: the Deployment asks for
    FallbackToLogsOnError)."""
    s, spec, namespace = "deployment", deployment.get("spec") or {}, target.namespace
    where = f"{namespace}/{target.deployment}"
    wanted = int(spec.get("replicas", 1))
    selector = ",".join(f"{k}={v}" for k, v in ((spec.get("selector") or {}).get("matchLabels") or {}).items())
    try:
        pods = [x for x in (await api.list_pods(namespace, label_selector=selector))[0]
                if not x["metadata"].get("deletionTimestamp")]
    except KubeError as e:
        return Line(s, False, f"list the pods of Deployment {where}", f"{e.message} (your credentials need list on "
                                                                       f"pods in {namespace})")
    trouble = {x["metadata"]["name"]: _not_ready(x) for x in pods}
    trouble = {name: why for name, why in trouble.items() if why}
    ready = len(pods) - len(trouble)
    title = f"Deployment {where}: {ready} of {wanted} replicas Ready"
    if not wanted and by_service:
        return Line(s, False, f"Deployment {where}: scaled to 0 replicas",
                    f"the webhook configuration calls the Service, which then has no endpoint: "
                    f"{unanswered(failure_policy)}; kubectl -n {namespace} scale deployment {target.deployment} "
                    f"--replicas=2")
    if ready >= wanted and not trouble:
        return Line(s, True, title, data={"replicas": wanted, "ready": ready})
    hint = "; ".join(f"pod {name}: {why}" for name, why in sorted(trouble.items())) or \
        f"no pod: kubectl -n {namespace} describe deployment {target.deployment} (a quota, admission, scheduling)"
    if not ready and by_service:
        hint += f"; no replica answers: {unanswered(failure_policy)}"
    return Line(s, False, title, hint, {"replicas": wanted, "ready": ready, "pods": trouble})


async def _budget_lines(api: KubeApi, target: Target, deployment: dict, all_ready: bool = True) -> list[Line]:
    """Each PodDisruptionBudget over the Deployment's pods, by the disruption controller's own
    count (its status): how many replicas a node drain may evict. One that allows none while
    every replica is Ready (one replica, `minAvailable: 1`) blocks `kubectl drain` of a node
    running initshift until the drain times out: a warning, the cluster's admin's call. One
    that allows none while a replica is not Ready (`all_ready` False: a drain under way, its
    evicted replica's replacement not Ready yet, or Pending where no other node takes it) is
    why a drain waits: said so, with no advice to add replicas."""
    s, namespace = "deployment", target.namespace
    labels = ((deployment.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
    try:
        budgets = await api.list_pod_disruption_budgets(namespace)
    except KubeError as e:
        return [Line(s, True, "PodDisruptionBudgets: cannot be read (warning)",
                     f"warning: {e.message} (your credentials need list on poddisruptionbudgets in {namespace})",
                     {"warning": True})]
    out = []
    for budget in budgets:
        spec, status = budget.get("spec") or {}, budget.get("status") or {}
        # A null selector selects no pod; a status older than the spec is not the budget's yet.
        if spec.get("selector") is None or not selects(spec["selector"], labels) or \
                "disruptionsAllowed" not in status or \
                status.get("observedGeneration", 0) < budget["metadata"].get("generation", 0):
            continue
        where, allowed = f"{namespace}/{budget['metadata']['name']}", int(status["disruptionsAllowed"])
        rule = "".join(f", {k} {spec[k]}" for k in ("minAvailable", "maxUnavailable") if k in spec)
        data = {"budget": budget["metadata"]["name"], "disruptionsAllowed": allowed}
        if allowed:
            out.append(Line(s, True, f"PodDisruptionBudget {where}: a node drain may evict {allowed} of "
                                     f"{status.get('currentHealthy', '?')} Ready replicas at a time", data=data))
            continue
        title = f"PodDisruptionBudget {where} allows no eviction: {status.get('currentHealthy', '?')} " \
                f"Ready, {status.get('desiredHealthy', '?')} wanted{rule} (warning)"
        if not all_ready:
            out.append(Line(s, True, title, "warning: a node drain evicts no more of initshift's replicas until the "
                                            "ones not Ready (above) are Ready; a replacement Pending on a cordoned "
                                            "node, or where no other node can take it, never is, and the drain "
                                            "waits until it times out", {**data, "warning": True}))
            continue
        out.append(Line(s, True, title,
                        f"warning: `kubectl drain` of a node running initshift waits until it times out: run more "
                        f"replicas (kubectl -n {namespace} scale deployment {target.deployment} --replicas=2), or "
                        f"delete the budget (the chart makes none for one replica)", {**data, "warning": True}))
    return out


def ready_condition(pod: dict) -> dict | None:
    """The pod's Ready condition when it holds (the kubelet's: its lastTransitionTime says since when)."""
    ready = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    return ready if ready is not None and ready.get("status") == "True" else None


def _not_ready(pod: dict) -> str:
    """Why the pod is not Ready, in the kubelet's words; "" when it is."""
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    if ready_condition(pod) is not None:
        return ""
    for container in status.get("containerStatuses") or []:
        state, last = container.get("state") or {}, (container.get("lastState") or {}).get("terminated")
        why = [state["waiting"].get("reason") or "waiting"] if "waiting" in state else \
            ["running, not Ready"] if "running" in state else []
        if last:
            said = _last_line(str(last.get("message") or ""))
            why.append(f"last ended with exit code {last.get('exitCode')}" + (f": {said}" if said else ""))
        if container.get("restartCount"):
            why.append(f"restarts: {container['restartCount']}")
        if why:
            return ", ".join(why)
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False":
        return f"not scheduled: {scheduled.get('message') or scheduled.get('reason') or 'unknown'}"
    return f"phase {status.get('phase') or 'Pending'}"


def _last_line(message: str) -> str:
    """The last line of a termination message; of one of the server's JSON log lines, its `msg`."""
    lines = [x.strip() for x in message.splitlines() if x.strip()]
    if not lines:
        return ""
    try:
        record = json.loads(lines[-1])
    except ValueError:
        return lines[-1]
    return str(record.get("msg") or lines[-1]) if isinstance(record, dict) else lines[-1]


async def _pull_secrets_line(api: KubeApi, image: str, names: tuple[str, ...], opted: list[str]) -> Line:
    """Whether the kubelet finds credentials for `image` in the Secrets INITSHIFT_IMAGE_PULL_SECRETS
    adds to every rewritten pod, in each opted-in namespace (it skips a missing Secret, and
    one of another type, with an event only)."""
    s, setting = "deployment", f"INITSHIFT_IMAGE_PULL_SECRETS ({', '.join(names)})"
    problems: list[str] = []
    for ns in opted:
        secrets, missing = [], []
        for name in names:
            try:
                secret = await api.get_secret(ns, name)
            except KubeError as e:
                return Line(s, False, f"{setting}: read the Secrets in {ns}", f"{e.message} (your credentials "
                                                                              f"need get on those secrets)")
            if secret is None:
                missing.append(name)
            else:
                secrets.append(secret)
        found, unreadable = credentials_for(image, secrets)
        if not found:
            why = [f"no Secret {', '.join(missing)}"] if missing else []
            why += unreadable or (["none holds an entry for the image's registry"] if secrets else [])
            problems.append(f"{ns} ({'; '.join(why)})")
    if not problems:
        return Line(s, True, f"{setting}: credentials for initshift's image in every opted-in namespace")
    return Line(s, False, f"{setting}: no credentials for initshift's image in {', '.join(problems)}",
                f"builds rewritten there stop at ErrImagePull: create the Secret (type "
                f"kubernetes.io/dockerconfigjson, for {image}) in each namespace named")
