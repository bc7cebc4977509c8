"""`initshift watch` as a real process against the API double, and its bad input."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.kubedouble import KubeDouble, running
from tests.watcher.test_watcher import build_pod, eventually
from waiter import protocol as p

ROOT = Path(__file__).resolve().parents[2]
BOUND = 30.0


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "u"}}],
    }))
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INITSHIFT_") and k != "KUBERNETES_SERVICE_HOST"}
    env.update(extra)
    return env


async def test_watch_command_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    async with KubeDouble() as kube:
        kube.put_pod(build_pod("cli"))
        kube.set_container_statuses("ci", "cli", [running("istio-proxy"), running("fetch")], phase="Running")
        cfg = kubeconfig(tmp_path / "config", kube.url)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "webhook.cli", "watch", "--kubeconfig", str(cfg), "-n", "ci",
            "--no-leader-election", cwd=ROOT, env=_env(INITSHIFT_WATCHER_CONCURENCY="4"), stderr=subprocess.PIPE)
        try:
            await eventually(lambda: (kube.pod("ci", "cli")["metadata"].get("annotations") or {})
                             .get(p.ANNOTATION_READY) == p.READY_TRUE, "the ready gate from the CLI", BOUND)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), BOUND)
        assert proc.returncode == 0, err.decode()
        patch = kube.patches("ci", "cli")[0]
        assert patch.user_agent.startswith("initshift-watcher/")
        lines = [json.loads(line) for line in err.decode().splitlines()]  # every line, start to stop, is JSON
        assert any(line.get("action") == "ready" for line in lines)
        assert any(line["level"] == "warning" and line["msg"].startswith("INITSHIFT_WATCHER_CONCURENCY is not an "
                   "initshift setting") for line in lines), lines


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webhook.cli", "watch", *args], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=BOUND)


def test_bad_input_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    cases = [
        (run_cli("--kubeconfig", str(tmp_path / "missing")), 1, "no such file"),
        (run_cli(INITSHIFT_GRACE_SECONDS="soon"), 2, "INITSHIFT_GRACE_SECONDS"),
        (run_cli("--grace-seconds", "-1"), 2, "--grace-seconds must be a number of seconds, 0 or more, got -1.0"),
        # float() reads these too: a grace that never ends, or never starts
        (run_cli("--grace-seconds", "inf"), 2, "--grace-seconds must be a number of seconds, 0 or more, got inf"),
        (run_cli("--grace-seconds", "nan"), 2, "--grace-seconds must be a number of seconds, 0 or more, got nan"),
    ]
    for result, code, text in cases:
        assert result.returncode == code, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("initshift watch:")]
        assert len(errors) == 1 and text in errors[0], result.stderr
        assert "Traceback" not in result.stderr
