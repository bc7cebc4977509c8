"""The apiserver's kept-alive connections to the server, as the real apiserver keeps them.

The apiserver's webhook client keeps an idle connection for 90 s and does not resend a POST
written to a connection its server closed meanwhile: a server that closes idle connections
first loses, now and then, the review sent in that instant (under `failurePolicy: Ignore`,
a pod admitted unchanged). The server waits INITSHIFT_KEEPALIVE_TIMEOUT_SECONDS (120 s).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ._env import Env, Record, scenario
from ._mesh import ISTIO_TRAFFIC
from ._pods import managed, pod, step

IDLE_SECONDS = 12.0  # over twice the server's head deadline (INITSHIFT_HEADER_TIMEOUT_SECONDS, 5 s)
ESTABLISHED = "01"  # the state column of /proc/net/tcp


def server_connections(port: int) -> set[tuple[str, str]]:
    """The established TCP connections whose local port is `port` (the server's side), by
    their local and remote addresses as the kernel lists them."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == ESTABLISHED and int(fields[1].rsplit(":", 1)[1], 16) == port:
                out.add((fields[1], fields[2]))
    return out


@scenario("kept-alive")
def kept_alive(env: Env, rec: Record) -> None:
    """The apiserver's connection outlives the server's head deadline idle, and the next review on it is rewritten."""
    ns = env.namespace("keep")
    rec.namespaces.append(ns)
    body = json.dumps(pod("dry-run", [step("fetch", env.images.busybox, port=ISTIO_TRAFFIC)],
                          [step("completion", env.images.busybox, port=None)]))

    def review() -> str | None:
        """A server-side dry run of the build pod: the strategy it was rewritten under."""
        return managed(env.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body=body, params={"dryRun": "All"}))

    failed_open = env.kube.fail_open_count()
    assert review() is not None
    kept = server_connections(env.install.port)
    assert kept, f"no connection to the server's port {env.install.port} after a review"
    time.sleep(IDLE_SECONDS)
    still = kept & server_connections(env.install.port)
    assert still, f"the server closed the apiserver's {len(kept)} connection(s) idle {IDLE_SECONDS:g} s"
    strategy = review()
    after = server_connections(env.install.port)
    assert strategy is not None, "the review after the idle wait was admitted unchanged"
    assert env.kube.fail_open_count() == failed_open, "the apiserver counted a review that failed open"
    rec.note(f"{len(still)} of {len(kept)} apiserver connection(s) still open after {IDLE_SECONDS:g} s idle; "
             f"the next review rewritten ({strategy}) "
             + ("on one of them" if after <= kept else f"on a new connection ({len(after - kept)} opened)")
             + "; none failed open")
