"""The environment the kubelet gives a container: the Service variables of Kubernetes'
pkg/kubelet/envvars `FromServices` (for every Service of the pod's namespace that has a
ClusterIP, unless the pod says `enableServiceLinks: false`; for the `kubernetes` Service of
`default` always), then the container's own `env` over them. A Service named `initshift`
gives INITSHIFT_SERVICE_HOST, INITSHIFT_PORT=tcp://IP:PORT and more: names of initshift's
own settings."""

from __future__ import annotations

from typing import Iterable, Mapping

KUBERNETES = {"metadata": {"name": "kubernetes", "namespace": "default"},
              "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}}


def _name(text: str) -> str:
    return text.replace("-", "_").upper()


def from_services(services: Iterable[Mapping]) -> dict[str, str]:
    out: dict[str, str] = {}
    for service in services:
        spec, prefix = service["spec"], _name(service["metadata"]["name"])
        ip = spec.get("clusterIP") or ""
        if ip in ("", "None"):
            continue
        ports = spec.get("ports") or []
        out[f"{prefix}_SERVICE_HOST"] = ip
        out[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                out[f"{prefix}_SERVICE_PORT_{_name(port['name'])}"] = str(port["port"])
        for i, port in enumerate(ports):  # Docker's link variables
            proto = (port.get("protocol") or "TCP").upper()
            address = f"{proto.lower()}://{ip}:{port['port']}"
            if i == 0:
                out[f"{prefix}_PORT"] = address
            each = f"{prefix}_PORT_{port['port']}_{proto}"
            out.update({each: address, f"{each}_PROTO": proto.lower(), f"{each}_PORT": str(port["port"]),
                        f"{each}_ADDR": ip})
    return out


def container_env(pod_spec: Mapping, container: Mapping, namespace: str, services: Iterable[Mapping],
                  cluster_ip: str = "10.96.0.208") -> dict[str, str]:
    """`services`: those of the pod's namespace as the install creates them (a ClusterIP is
    given to each that asks for one); `env` values and the namespace's fieldRef resolved."""
    given = [{**s, "spec": {**s["spec"], "clusterIP": s["spec"].get("clusterIP") or cluster_ip}} for s in services
             if s["metadata"].get("namespace", namespace) == namespace]
    env = from_services([*(given if pod_spec.get("enableServiceLinks", True) else ()), KUBERNETES])
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = namespace
    return env
