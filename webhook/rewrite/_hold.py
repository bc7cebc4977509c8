"""The kubelet's hold on what comes after a proxy: the parts of it initshift may take away
and the records that put them back.

The kubelet starts the container after a sidecar once the sidecar has started: its
startupProbe passed (native sidecars) and its postStart hook returned (every container).
Where step 0's gate already waits for the proxy's readiness on loopback and nothing else
can reach the network first, a hook whose only work is that same wait (Linkerd's
`linkerd-await`, which its `proxy.await` adds to a classic proxy; Istio's `pilot-agent
wait`, which `holdApplicationUntilProxyStarts` adds) only delays the steps. What is taken
away is recorded on the pod (`ANNOTATION_STARTUP_PROBES_REMOVED`,
`ANNOTATION_POST_START_REMOVED`: JSON {container: what was removed}) and put back by a
re-invocation that finds the conditions gone.
"""

from __future__ import annotations

import json
from typing import Mapping

from waiter import protocol as p

from ._shape import mapping_at, submap


def recorded(pod: Mapping, annotation: str) -> dict[str, dict]:
    """The record in `annotation`: container name -> what was removed (malformed: none)."""
    raw = mapping_at(pod, "metadata", "annotations").get(annotation)
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, dict)}


def removed_startup_probes(pod: Mapping) -> dict[str, dict]:
    """The record of `initshift.io/startup-probes-removed`: container name -> its startupProbe."""
    return recorded(pod, p.ANNOTATION_STARTUP_PROBES_REMOVED)


def removed_post_start(pod: Mapping) -> dict[str, dict]:
    """The record of `initshift.io/post-start-removed`: container name -> its postStart hook."""
    return recorded(pod, p.ANNOTATION_POST_START_REMOVED)


def record(pod: dict, annotation: str, kept: Mapping[str, dict]) -> dict:
    """`pod` (the rewrite's own) with `annotation` holding `kept` as JSON, gone when empty."""
    text = json.dumps(kept, sort_keys=True, separators=(",", ":")) if kept else None
    if mapping_at(pod, "metadata", "annotations").get(annotation) != text:
        annotations = submap(pod, "metadata", "annotations")
        if text is None:
            del annotations[annotation]
        else:
            annotations[annotation] = text
    return pod


def liveness_needs_startup(container: Mapping) -> bool:
    """The container's livenessProbe could fail while it starts, so the startupProbe it has
    (the kubelet runs liveness only once that has passed) must stay. Linkerd's proxy's is
    its admin server's `/live`, which answers as soon as that server runs, long before
    `/ready`: there is no start for it to be held back from."""
    live = container.get("livenessProbe")
    if live is None:
        return False
    return not (container.get("name") == p.LINKERD_PROXY and mapping_at(live, "httpGet").get("path") == "/live")


def readiness_wait(container: Mapping) -> dict | None:
    """The container's postStart hook when all it does is wait for the proxy's readiness:
    `linkerd-await` or `pilot-agent wait`, with flags only (linkerd-await given a command
    runs it once the proxy is ready: that is more than a wait)."""
    hook = mapping_at(container, "lifecycle").get("postStart")
    command = mapping_at(hook, "exec").get("command")
    if not isinstance(command, list) or not command or not all(isinstance(x, str) for x in command):
        return None
    program = command[0].rsplit("/", 1)[-1]
    flags = command[1:] if program == "linkerd-await" else command[2:] if command[1:2] == ["wait"] else None
    if program not in ("linkerd-await", "pilot-agent") or flags is None:
        return None
    return dict(hook) if all(f.startswith("-") and f != "--" for f in flags) else None  # type: ignore[arg-type]


def without_post_start(container: Mapping) -> dict:
    lifecycle = {k: v for k, v in mapping_at(container, "lifecycle").items() if k != "postStart"}
    out = {k: v for k, v in container.items() if k != "lifecycle"}
    if lifecycle:
        out["lifecycle"] = lifecycle
    return out


def settle_hook(container: dict, release: bool, hooks: Mapping[str, dict],
                kept: dict[str, dict], notes: list[str]) -> dict:
    """`container` (a recognised proxy) with its readiness wait taken away where `release`,
    else put back from `hooks` (the record it came with); what stays removed goes in `kept`."""
    name = str(container.get("name"))
    has_hook = "postStart" in mapping_at(container, "lifecycle")
    if release:
        hook = readiness_wait(container)
        if hook is not None:
            container = without_post_start(container)
            notes.append(f"removed the postStart hook of {name!r} that waits for its readiness: the waiter's gate "
                         f"waits for it on loopback itself ({p.ANNOTATION_POST_START_REMOVED} keeps it)")
        elif not has_hook:
            hook = hooks.get(name)  # removed at an earlier admission: still recorded
        if hook is not None:
            kept[name] = hook
    elif name in hooks and not has_hook:
        container = {**container, "lifecycle": {**mapping_at(container, "lifecycle"), "postStart": hooks[name]}}
        notes.append(f"put back the postStart hook of {name!r}: a container now starts after it without "
                     f"waiting for the waiter's gate")
    return container
