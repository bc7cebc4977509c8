"""A Job's pod (no init container) rewritten by the waiter strategy and run for real: every
main started as a process from the exact args the webhook emitted, a proxy-like server on
loopback that turns ready late and records the quit calls (Istio's /quitquitquit, Linkerd's
/shutdown). Each main starts only once the proxy is ready; the last one to end quits it,
once; exit codes are the mains' own; under OnFailure a main the kubelet restarts is gated
again and the proxy is quit only once every main has succeeded."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.fixtures import pods
from tests.support.waiter_support import wait_for
from tests.waiter.test_end_to_end import record, remap, run_pod
from tests.waiter.test_waiter_gate import Server, server  # noqa: F401 (the fixture)
from waiter import protocol as p
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

MESHES = {"istio": ("istio-proxy", "/quitquitquit"), "linkerd": ("linkerd-proxy", "/shutdown")}
READY_AFTER = 0.6  # seconds before the proxy's readiness probe answers 200


def job_pod(mesh: str, server: Server, scripts: dict[str, str], policy: str = "Never") -> dict:
    """The CronJob fixture injected by `mesh`, its mains replaced by `scripts`, the proxy's
    readiness probe pointed at `server`; rewritten with the mesh's quit path on `server`."""
    name, quit_path = MESHES[mesh]
    src = pods.load("cronjob-report")
    src["spec"]["restartPolicy"] = policy
    src["spec"]["containers"] = [{"name": n, "image": "busybox", "command": ["sh", "-c", s]}
                                 for n, s in scripts.items()]
    pod = pods.inject_istio(src) if mesh == "istio" else pods.inject_linkerd(src)
    proxy = next(c for c in pod["spec"]["containers"] if c["name"] == name)
    proxy["readinessProbe"]["httpGet"]["port"] = server.port
    for env in proxy.get("env") or []:  # Linkerd's admin server, where the quit goes, is the server too
        if env["name"] == p.LINKERD_ADMIN_ADDR_ENV:
            env["value"] = f"0.0.0.0:{server.port}"
    settings = Settings(feature_gate=True, rewrite=RewriteSettings(quit_endpoints={name: server.url(quit_path)}))
    result = rewrite(pod, settings)
    assert result.changed and result.strategy == p.MODE_WAITER, result.warnings
    return result.pod


def ready_later(server: Server, after: float = READY_AFTER) -> list[float]:
    """Turn the proxy ready after `after` seconds; the list gets the wall-clock time it did."""
    at: list[float] = []

    def go() -> None:
        at.append(time.time())
        server.status = 200

    threading.Timer(after, go).start()
    return at


def ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_mains_start_after_the_proxy_is_ready_and_the_last_quits_it(tmp_path, server, mesh):
    log = tmp_path / "log"
    scripts = {"report": f'echo report >> "{log}"', "upload": f'sleep 0.3; echo upload >> "{log}"'}
    pod = job_pod(mesh, server, scripts)
    ready_at = ready_later(server)
    runs = run_pod(pod, tmp_path)
    assert {n: r.returncode for n, r in runs.items()} == {"report": 0, "upload": 0}, \
        {n: r.stderr for n, r in runs.items()}
    assert sorted(log.read_text().split()) == ["report", "upload"]
    records = [record(tmp_path, i) for i in range(2)]
    for r in records:
        assert r[p.RECORD_REASON] == p.REASON_COMPLETED
        assert ts(r[p.RECORD_STARTED_AT]) >= ready_at[0], "no main ran before its proxy was ready"
    assert server.posts == [MESHES[mesh][1]], "quit once, on the mesh's endpoint, by the last main"
    assert "leaving the sidecars to the last one" in runs["report"].stderr


def test_never_a_failed_main_still_ends_the_pod_with_its_code(tmp_path, server):
    pod = job_pod("istio", server, {"report": "exit 3", "upload": "sleep 0.2"})
    server.status = 200
    runs = run_pod(pod, tmp_path)
    assert runs["report"].returncode == 3 and runs["upload"].returncode == 0, "real exit codes"
    assert record(tmp_path, 0)[p.RECORD_EXIT_CODE] == 3 and record(tmp_path, 0)[p.RECORD_REASON] == p.REASON_ERROR
    assert server.posts == ["/quitquitquit"], "restartPolicy Never: every main has ended, whatever its code"


def start_container(pod: dict, name: str, root: Path) -> subprocess.Popen:
    """One main's waiter as the kubelet (re)starts it: its args, the pod paths under `root`."""
    c = next(c for c in pod["spec"]["containers"] if c["name"] == name)
    args = [remap(a, root) for a in c["args"]]
    args[1:1] = [p.FLAG_TERMINATION_LOG, str(root / f"termination-{name}")]
    return subprocess.Popen([sys.executable, "-m", "waiter", *args], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_on_failure_a_restarted_main_is_gated_again_and_the_quit_waits_for_its_success(tmp_path, server):
    marker = tmp_path / "ran-once"
    flaky = f'if [ -e "{marker}" ]; then echo second run; else touch "{marker}"; exit 1; fi'
    pod = job_pod("istio", server, {"report": flaky, "upload": "true"}, policy="OnFailure")
    server.status = 200
    runs = run_pod(pod, tmp_path)
    assert runs["report"].returncode == 1 and runs["upload"].returncode == 0
    assert server.posts == [], "a failed main is restarted by the kubelet: the proxy stays up for it"
    # The proxy drops out of readiness before the kubelet restarts the main: the main waits for it.
    server.status = 503
    again = start_container(pod, "report", tmp_path)
    ready_at = ready_later(server)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert "running again" in err and "second run" in out
    assert ts(record(tmp_path, 0)[p.RECORD_STARTED_AT]) >= ready_at[0], "gated again after the restart"
    wait_for(lambda: server.posts, "the quit")
    assert server.posts == ["/quitquitquit"], "every main has succeeded: quit once"
