"""What the waiter's quit needs of the sidecars it quits.

The last main POSTs each regular sidecar's quit endpoint (`INITSHIFT_QUIT_ENDPOINTS`).
Istio's `/quitquitquit` always answers. Linkerd's proxy serves `/shutdown` only where
`LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED` is "true", and since Linkerd 2.16 its injector
writes "false" unless the workload asks (`config.linkerd.io/proxy-admin-shutdown:
enabled`; the chart's `proxy.enableShutdownEndpoint`): an endpoint an SSRF in the app could
reach. Refused, the quit leaves the proxy running and the watcher must end the pod with
`activeDeadlineSeconds`: phase `Failed`, which a Job counts as a failed attempt and runs
again. So for a proxy the waiter quits, the rewrite asks what the annotation would (the
injector has run by then, or the pod is re-invoked after it); a pod annotated `disabled`
keeps it off and ends by the watcher's deadline.
"""

from __future__ import annotations

from typing import Collection, Mapping

from waiter import protocol as p

_ON = {"name": p.LINKERD_SHUTDOWN_ENV, "value": "true"}


def refuses_quit(annotations: Mapping) -> bool:
    """The pod keeps Linkerd's /shutdown off (its own annotation says so)."""
    return annotations.get(p.LINKERD_SHUTDOWN_ANNOTATION) == "disabled"


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
    """What to tell where the pod keeps the quit of Linkerd's proxy off."""
    if p.LINKERD_PROXY not in quitted or not refuses_quit(annotations):
        return []
    return [f"{p.LINKERD_SHUTDOWN_ANNOTATION}: disabled keeps {p.LINKERD_PROXY}'s /shutdown off: the last main "
            f"cannot stop it, so the watcher ends the pod with activeDeadlineSeconds (phase Failed; the outcome "
            f"says how the steps went)"]
