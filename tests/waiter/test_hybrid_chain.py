"""A hybrid pod's step chain run for real: every wrapped container of the rewritten pod
started as a process from the exact args the webhook emitted (tests/waiter/test_end_to_end.py
does the same for the waiter strategy), with a proxy-like server on loopback that becomes
ready late. The proxy is a native sidecar there: step 0 gates on its loopback probe (the
watcher's ready file, its fallback, never comes here), the steps run in order, a failure
skips the rest with its exit code, and nothing POSTs a quit endpoint (the kubelet stops
native sidecars)."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import pytest

from tests.waiter.test_end_to_end import FakeProxy, build_pod, proxy, record, run_pod, settings_for  # noqa: F401
from waiter import protocol as p
from webhook.rewrite._rewrite import rewrite

READY_AFTER = 0.6  # seconds before the fake proxy answers its readiness probe with 200


def hybrid(pod: dict, fake: FakeProxy) -> dict:
    result = rewrite(pod, settings_for(fake), native_supported=True)  # auto on a cluster with native sidecars
    assert result.changed and result.strategy == p.MODE_HYBRID, result.warnings
    return result.pod


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_gate_on_the_loopback_probe_then_steps_in_order_and_no_quit(tmp_path, proxy):
    log = tmp_path / "order.log"
    scripts = {name: f'echo {name} >> "{log}"' for name in ("clone", "test", "package", "publish")}
    pod = hybrid(build_pod(proxy.port, scripts), proxy)
    assert [c["name"] for c in pod["spec"]["initContainers"]][-1] == "istio-proxy"
    copier, *wrapped = pod["spec"]["containers"]
    assert copier["name"] == p.COPY_CONTAINER_NAME
    assert p.FLAG_PROBE in wrapped[0]["args"] and all(p.FLAG_QUIT not in c["args"] for c in wrapped)
    ready_at: list[float] = []

    def become_ready() -> None:
        ready_at.append(time.time())
        proxy.ready.set()

    threading.Timer(READY_AFTER, become_ready).start()
    runs = run_pod(pod, tmp_path)
    assert {name: r.returncode for name, r in runs.items()} == dict.fromkeys(scripts, 0), \
        {n: r.stderr for n, r in runs.items()}
    assert log.read_text().split() == list(scripts), "in order"
    records = [record(tmp_path, i) for i in range(len(scripts))]
    assert [r["reason"] for r in records] == [p.REASON_COMPLETED] * len(scripts)
    assert _ts(records[0][p.RECORD_STARTED_AT]) >= ready_at[0], "step 0 ran only once the proxy was ready"
    for a, b in zip(records, records[1:]):
        assert _ts(b[p.RECORD_STARTED_AT]) >= _ts(a[p.RECORD_FINISHED_AT]), "each after the one before"
    assert proxy.quits == 0, "the kubelet stops native sidecars: no quit endpoint"


def test_a_failing_step_skips_the_rest_which_exit_0(tmp_path, proxy):
    log = tmp_path / "order.log"
    scripts = {"clone": f'echo clone >> "{log}"', "test": "exit 3",
               "package": f'echo package >> "{log}"', "publish": f'echo publish >> "{log}"'}
    proxy.ready.set()
    runs = run_pod(hybrid(build_pod(proxy.port, scripts), proxy), tmp_path)
    assert {name: r.returncode for name, r in runs.items()} == {"clone": 0, "test": 3, "package": 0, "publish": 0}, \
        "only the failing step carries its code (the pod ends Failed); a skipped one exits 0, as if never started"
    assert log.read_text().split() == ["clone"], "nothing ran after the failure"
    assert record(tmp_path, 1)["reason"] == p.REASON_ERROR and record(tmp_path, 1)["exitCode"] == 3
    for i in (2, 3):
        assert record(tmp_path, i)["reason"] == p.REASON_SKIPPED
        assert record(tmp_path, i)[p.RECORD_FAILED_STEP] == "test"
    assert proxy.quits == 0


def test_exit_codes_of_a_step_that_cannot_run(tmp_path, proxy):
    scripts = {"clone": "true", "missing": "true", "publish": "true"}
    pod = hybrid(build_pod(proxy.port, scripts), proxy)
    missing = next(c for c in pod["spec"]["containers"] if c["name"] == "missing")
    missing["args"][missing["args"].index(p.ARGV_SEPARATOR) + 1:] = ["/no/such/command"]
    proxy.ready.set()
    runs = run_pod(pod, tmp_path)
    assert runs["clone"].returncode == 0
    assert runs["missing"].returncode == p.EXIT_NOT_FOUND
    assert runs["publish"].returncode == 0 and record(tmp_path, 2)["reason"] == p.REASON_SKIPPED
    assert proxy.quits == 0


def _natively_injected(pod: dict) -> dict:
    """The proxy as a mesh injects it natively (Istio >= 1.27): an init container with
    restartPolicy Always, its startupProbe on the readiness endpoint, before the steps."""
    spec = pod["spec"]
    proxy = next(c for c in spec["containers"] if c["name"] == p.ISTIO_PROXY)
    spec["containers"] = [c for c in spec["containers"] if c is not proxy]
    spec["initContainers"].insert(1, {**proxy, "restartPolicy": "Always"})
    return pod


@pytest.mark.parametrize("ready_after", [0.3, 1.0])
@pytest.mark.parametrize("kind", ["natively-injected", "made-native"])
def test_without_the_startup_probe_nothing_runs_before_the_proxy_is_ready(tmp_path, proxy, kind, ready_after):
    """The hybrid rewrite removes the proxy's startupProbe, so the kubelet starts every regular
    container at once, as run_pod does here: each step and main checks, as its first act,
    that the proxy was ready (a marker the proxy writes just before it answers 200), and
    exits 42 if not. None does; each started after the proxy turned ready."""
    mark = tmp_path / "proxy-ready"
    scripts = {name: f'test -e "{mark}" || exit 42' for name in ("clone", "fetch", "build", "publish")}
    pod = build_pod(proxy.port, scripts)
    pod["spec"]["containers"].insert(1, {"name": "upload", "image": "busybox",
                                         "command": ["sh", "-c", f'test -e "{mark}" || exit 42']})
    if kind == "natively-injected":
        pod = _natively_injected(pod)
    out = hybrid(pod, proxy)
    native = next(c for c in out["spec"]["initContainers"] if c["name"] == p.ISTIO_PROXY)
    assert native["restartPolicy"] == "Always" and "startupProbe" not in native, "the kubelet's hold is gone"
    assert p.ANNOTATION_STARTUP_PROBES_REMOVED in out["metadata"]["annotations"]
    ready_at: list[float] = []

    def become_ready() -> None:
        mark.touch()
        ready_at.append(time.time())
        proxy.ready.set()

    threading.Timer(ready_after, become_ready).start()
    runs = run_pod(out, tmp_path)
    assert {name: r.returncode for name, r in runs.items()} == dict.fromkeys([*scripts, "upload"], 0), \
        {n: (r.returncode, r.stderr) for n, r in runs.items()}
    starts = [_ts(record(tmp_path, i)[p.RECORD_STARTED_AT]) for i in range(len(runs))]
    assert min(starts) >= ready_at[0], "no step or main started before the proxy was ready"
