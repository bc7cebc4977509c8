"""The rewrite's output run for real: every wrapped container of a rewritten pod is started
as a process from the exact args the webhook emitted (only the pod paths are remapped to
a temporary folder), all at once and in reverse order, with a fake proxy on loopback that
becomes ready late and counts quit calls. Order, skips and quits must come out right."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.fixtures import pods
from waiter import protocol as p
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

ROOT = Path(__file__).resolve().parents[2]


class FakeProxy:
    """An HTTP server answering the readiness probe (503 until ready) and the quit call."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.quits = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200 if proxy.ready.is_set() else 503)
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                proxy.quits += 1
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy():
    fake = FakeProxy()
    yield fake
    fake.close()


def build_pod(proxy_port: int, scripts: dict[str, str]) -> dict:
    pod = copy.deepcopy(pods.catalogue()["job-istio"])
    spec = pod["spec"]
    mesh_init = spec["initContainers"][0]
    spec["initContainers"] = [mesh_init] + [
        {"name": name, "image": "busybox", "command": ["sh", "-c", script]}
        for name, script in list(scripts.items())[:-1]
    ]
    main_name, main_script = list(scripts.items())[-1]
    proxy = next(c for c in spec["containers"] if c["name"] == "istio-proxy")
    proxy["readinessProbe"]["httpGet"]["port"] = proxy_port
    spec["containers"] = [{"name": main_name, "image": "busybox", "command": ["sh", "-c", main_script]}, proxy]
    return pod


def remap(arg: str, root: Path) -> str:
    for pod_path in (p.RUN_MOUNT_ROOT, p.READY_MOUNT, p.MAINS_MOUNT):
        if arg.startswith(pod_path):
            return str(root / pod_path.lstrip("/")) + arg[len(pod_path):]
    return arg


def run_pod(pod: dict, root: Path, timeout: float = 60) -> dict[str, subprocess.CompletedProcess]:
    """Start every wrapped container at once (last first) and wait for all of them."""
    wrapped = [c for c in pod["spec"]["containers"] if c.get("command") == [p.WAITER_PATH]]
    (root / p.READY_MOUNT.lstrip("/")).mkdir(parents=True)
    (root / p.MAINS_MOUNT.lstrip("/")).mkdir(parents=True)
    procs = {}
    for i, c in reversed(list(enumerate(wrapped))):
        (root / p.run_mount(i).lstrip("/")).mkdir(parents=True)
        args = [remap(a, root) for a in c["args"]]
        args[1:1] = [p.FLAG_TERMINATION_LOG, str(root / f"termination-{c['name']}")]
        procs[c["name"]] = subprocess.Popen([sys.executable, "-m", "waiter", *args], cwd=root,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return {c["name"]: out[c["name"]] for c in wrapped}


def settings_for(proxy: FakeProxy) -> Settings:
    quit_url = f"http://127.0.0.1:{proxy.port}/quitquitquit"
    return Settings(feature_gate=True, rewrite=RewriteSettings(quit_endpoints={"istio-proxy": quit_url}))


def record(root: Path, index: int) -> dict:
    return json.loads((root / p.completion_path(index).lstrip("/")).read_text())


def test_steps_run_in_order_after_the_gate_then_quit(tmp_path, proxy):
    log = tmp_path / "order.log"
    scripts = {name: f'echo {name} >> "{log}"' for name in ("clone", "test", "package", "publish")}
    result = rewrite(build_pod(proxy.port, scripts), settings_for(proxy))
    assert result.changed, result.warnings
    threading.Timer(0.5, proxy.ready.set).start()  # the proxy becomes ready late
    runs = run_pod(result.pod, tmp_path)
    assert {name: r.returncode for name, r in runs.items()} == dict.fromkeys(scripts, 0), \
        {n: r.stderr for n, r in runs.items()}
    assert log.read_text().split() == list(scripts)
    assert [record(tmp_path, i)["reason"] for i in range(4)] == [p.REASON_COMPLETED] * 4
    assert proxy.quits >= 1, "the main quit the sidecar"


def test_a_failing_step_skips_the_rest_and_still_quits(tmp_path, proxy):
    log = tmp_path / "order.log"
    scripts = {"clone": f'echo clone >> "{log}"', "test": "exit 3",
               "package": f'echo package >> "{log}"', "publish": f'echo publish >> "{log}"'}
    proxy.ready.set()
    runs = run_pod(rewrite(build_pod(proxy.port, scripts), settings_for(proxy)).pod, tmp_path)
    assert runs["clone"].returncode == 0 and runs["test"].returncode == 3
    assert runs["package"].returncode == 0 and runs["publish"].returncode == 0, "skipped: never ran, no exit code"
    assert log.read_text().split() == ["clone"], "nothing ran after the failure"
    assert record(tmp_path, 1)["reason"] == p.REASON_ERROR and record(tmp_path, 1)["exitCode"] == 3
    for i in (2, 3):
        assert record(tmp_path, i)["reason"] == p.REASON_SKIPPED
        assert "test" in record(tmp_path, i)["message"]
    assert proxy.quits >= 1, "the sidecar is quit even when the build failed"
