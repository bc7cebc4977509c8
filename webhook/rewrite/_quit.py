"""What the waiter's quit needs of the sidecars it quits.

The last main POSTs each regular sidecar's quit endpoint (`INITSHIFT_QUIT_ENDPOINTS`).
Istio's `/quitquitquit` is served by pilot-agent's status server, on the port the pod's
`status.sidecar.istio.io/port` names where it names one (Istio's injector puts it in the
proxy's configuration over the mesh's); "0" runs no status server, so no quit. Linkerd's
proxy serves `/shutdown` only where `LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED` is "true",
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

from typing import Collection, Mapping
from urllib.parse import urlsplit, urlunsplit

from waiter import protocol as p

_ON = {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true"}


def refuses_quit(annotations: Mapping) -> bool:
    """The pod keeps Linkerd's /shutdown off (its own annotation says so)."""
    return annotations.get(p.LINKERD_SHUTDOWN_ANNOTATION) == "disabled"


def _istio_status_port(annotations: Mapping) -> int | None:
    """The pod's own status port (0: none), None where it names none or no valid one
    (Istio's injector refuses such a pod)."""
    value = annotations.get(p.ISTIO_STATUS_PORT_ANNOTATION)
    if not isinstance(value, str) or not value.isdigit() or int(value) > 65535:
        return None
    return int(value)


def quit_url(name: str, url: str, annotations: Mapping) -> str:
    """`url`, the quit endpoint configured for sidecar `name`, on the pod's own port where
    the pod moves its server (Istio's status port; "0" leaves it: nothing would answer)."""
    port = _istio_status_port(annotations) if name == p.ISTIO_PROXY else None
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
    named = [isinstance(e, Mapping) and e.get("name") == p.LINKERD_SHUTDOWN_ENV for e in env]
    if any(named) and all(e == _ON for e, n in zip(env, named) if n):
        return container
    # Linkerd's own entry ("false") is replaced where it stands: the kubelet would give a
    # second entry of the same name the last word, but one is clearer to read.
    env = [dict(_ON) if n else e for e, n in zip(env, named)] if any(named) else [*env, dict(_ON)]
    return {**container, "env": env}


def refused_note(annotations: Mapping, quitted: Collection[str]) -> list[str]:
    """What to tell where the pod keeps a quit endpoint off: Linkerd's /shutdown, or Istio's
    status server."""
    off = []
    if p.LINKERD_PROXY in quitted and refuses_quit(annotations):
        off.append(f"{p.LINKERD_SHUTDOWN_ANNOTATION}: disabled keeps {p.LINKERD_PROXY}'s /shutdown off")
    if p.ISTIO_PROXY in quitted and _istio_status_port(annotations) == 0:
        off.append(f"{p.ISTIO_STATUS_PORT_ANNOTATION}: \"0\" runs {p.ISTIO_PROXY} without the status server "
                   f"that serves /quitquitquit")
    return [f"{why}: the last main cannot stop it, so the watcher ends the pod with activeDeadlineSeconds "
            f"(phase Failed; the outcome says how the steps went)" for why in off]
