"""What the waiter's quit needs of the sidecars it quits.

The last main POSTs each regular sidecar's quit endpoint (`INITSHIFT_QUIT_ENDPOINTS`).
Istio's `/quitquitquit` is served by pilot-agent's status server, on the port pilot-agent
reads as it starts (Istio's `ConstructProxyConfig`): the pod's `status.sidecar.istio.io/port`,
else the `statusPort` of the pod's `proxy.istio.io/config`, else that of the proxy's
`PROXY_CONFIG` (the mesh's `defaultConfig` and its ProxyConfig resources, as the injector
merged them); "0" runs no status server, so no quit. Linkerd's `/shutdown` is served by
the proxy's admin server, on the port of its `LINKERD2_PROXY_ADMIN_LISTEN_ADDR` (which the
injector writes, `config.linkerd.io/admin-port` moving it), and only where
`LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED` is "true",
and since Linkerd 2.16 its injector writes "false" unless the workload asks
(`config.linkerd.io/proxy-admin-shutdown: enabled`; the chart's
`proxy.enableShutdownEndpoint`): an endpoint an SSRF in the app could reach. Refused, the
quit leaves the proxy running and the watcher must end the pod with
`activeDeadlineSeconds`: phase `Failed`, which a Job counts as a failed attempt and runs
again. So for a proxy the waiter quits, the rewrite asks what the annotation would (the
injector has run by then, or the pod is re-invoked after it); a pod annotated `disabled`
keeps it off and ends by the watcher's deadline.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

import yaml

from waiter import protocol as p

_ON = {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true"}


def refuses_quit(annotations: Mapping) -> bool:
    """The pod keeps Linkerd's /shutdown off (its own annotation says so)."""
    return annotations.get(p.LINKERD_SHUTDOWN_ANNOTATION) == "disabled"


def _port(value: Any) -> int | None:
    """A port number, or a string of its digits (protobuf JSON writes an int32 as a number
    and reads one from a string too); None for anything else, which the meshes' injectors
    refuse."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if type(value) is int and 0 <= value <= 65535 else None


def _status_port_of(config: Any, load: Any) -> int | None:
    """`statusPort` of a ProxyConfig given as text (None: not there, or unreadable)."""
    try:
        doc = load(config) if isinstance(config, str) else None
    except (ValueError, yaml.YAMLError):
        return None
    return _port(doc.get("statusPort")) if isinstance(doc, dict) else None


def _env_value(container: Mapping, name: str) -> Any:
    """The value of the container's variable `name` (the kubelet gives the last entry of a
    name the word); None where it has none."""
    values = [e.get("value") for e in container.get("env") or [] if isinstance(e, dict) and e.get("name") == name]
    return values[-1] if values else None


def istio_status_port(proxy: Mapping, annotations: Mapping) -> tuple[int, str] | None:
    """The port of `proxy`'s status server as pilot-agent reads it (0: none) and where it is
    set; None where nothing names one (the mesh's default, as configured here, stands)."""
    port = _port(annotations.get(p.ISTIO_STATUS_PORT_ANNOTATION))
    if port is not None:
        return port, f'{p.ISTIO_STATUS_PORT_ANNOTATION}: "{port}"'
    port = _status_port_of(annotations.get(p.ISTIO_PROXY_CONFIG_ANNOTATION), yaml.safe_load)
    if port is not None:
        return port, f"statusPort: {port} in {p.ISTIO_PROXY_CONFIG_ANNOTATION}"
    port = _status_port_of(_env_value(proxy, p.ISTIO_PROXY_CONFIG_ENV), json.loads)
    return None if port is None else (port, f"statusPort: {port} in the mesh's proxy configuration "
                                            f"({p.ISTIO_PROXY_CONFIG_ENV})")


def linkerd_admin_port(proxy: Mapping) -> int | None:
    """The port of the Linkerd proxy's admin server, from the address its injector wrote
    ("0.0.0.0:4191", "[::]:4191"); None where it names none."""
    addr = _env_value(proxy, p.LINKERD_ADMIN_ADDR_ENV)
    port = _port(addr.rpartition(":")[2]) if isinstance(addr, str) and ":" in addr else None
    return port or None


def _served_port(sidecar: Mapping, annotations: Mapping) -> int:
    """Where the pod serves `sidecar`'s quit endpoint, if it moves it (0: it does not, or
    nothing serves it)."""
    if sidecar.get("name") == p.ISTIO_PROXY:
        moved = istio_status_port(sidecar, annotations)
        return moved[0] if moved else 0
    if sidecar.get("name") == p.LINKERD_PROXY:
        return linkerd_admin_port(sidecar) or 0
    return 0


def quit_url(sidecar: Mapping, url: str, annotations: Mapping) -> str:
    """`url`, the quit endpoint configured for `sidecar`, on the pod's own port where the
    pod moves its server (Istio's status port, "0" leaving it: nothing would answer;
    Linkerd's admin port)."""
    port = _served_port(sidecar, annotations)
    if not port:
        return url
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, parts.query, parts.fragment))


def open_quit(container: Mapping, annotations: Mapping) -> Mapping:
    """`container`, a regular sidecar the last main quits, with its quit endpoint served."""
    if container.get("name") != p.LINKERD_PROXY or refuses_quit(annotations):
        return container
    env = list(container.get("env") or [])
    named = [isinstance(e, dict) and e.get("name") == p.LINKERD_SHUTDOWN_ENV for e in env]
    if any(named) and all(e == _ON for e, n in zip(env, named) if n):
        return container
    # Linkerd's own entry ("false") is replaced where it stands: the kubelet would give a
    # second entry of the same name the last word, but one is clearer to read.
    env = [dict(_ON) if n else e for e, n in zip(env, named)] if any(named) else [*env, dict(_ON)]
    return {**container, "env": env}


def refused_note(annotations: Mapping, quitted: Sequence[Mapping]) -> list[str]:
    """What to tell where the pod keeps a quit endpoint off: Linkerd's /shutdown, or Istio's
    status server."""
    off = []
    for sidecar in quitted:
        if sidecar.get("name") == p.LINKERD_PROXY and refuses_quit(annotations):
            off.append(f"{p.LINKERD_SHUTDOWN_ANNOTATION}: disabled keeps {p.LINKERD_PROXY}'s /shutdown off")
        moved = istio_status_port(sidecar, annotations) if sidecar.get("name") == p.ISTIO_PROXY else None
        if moved and moved[0] == 0:
            off.append(f"{moved[1]} runs {p.ISTIO_PROXY} without the status server that serves /quitquitquit")
    return [f"{why}: the last main cannot stop it, so the watcher ends the pod with activeDeadlineSeconds "
            f"(phase Failed; the outcome says how the steps went)" for why in off]
