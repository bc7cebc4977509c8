"""The environment the kubelet gives initshift's server container, from the objects an
install renders: `initshift check`'s model (`server_environment`, after the kubelet's
`envvars.FromServices`), with the ClusterIP the apiserver would give each Service and the
`kubernetes` Service of `default`, whose variables every container gets."""

from __future__ import annotations

from typing import Iterable, Mapping

from webhook.cli._check_deployment import server_environment, service_variables

KUBERNETES = {"metadata": {"name": "kubernetes", "namespace": "default"},
              "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}}


def container_env(deployment: Mapping, services: Iterable[Mapping], cluster_ip: str = "10.96.0.208") -> dict[str, str]:
    """`services`: those of the Deployment's namespace as the install renders them; the
    namespace's fieldRef resolved as the downward API would."""
    namespace = deployment["metadata"]["namespace"]
    given = [{**s, "spec": {**s["spec"], "clusterIP": s["spec"].get("clusterIP") or cluster_ip}} for s in services
             if s["metadata"].get("namespace", namespace) == namespace]
    env = {**service_variables([KUBERNETES]), **server_environment(dict(deployment), given)}
    for item in deployment["spec"]["template"]["spec"]["containers"][0].get("env") or []:
        if (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = namespace
    return env
