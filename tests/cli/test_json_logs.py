"""`initshift serve` and `initshift dev-server` as processes: every stderr line from start
to shutdown is one JSON object, uvicorn's own lines ("Started server process", "Shutting
down") included; dev-server's human banner goes to stdout. (`initshift watch`:
tests/cli/test_watcher_cmd.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.https_helpers import make_certs
from tests.support.k8s import free_port

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("INITSHIFT_") and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return {**env, "HOME": str(tmp_path), "INITSHIFT_PORT": str(free_port()), "INITSHIFT_METRICS_PORT": "0",
            **extra}


def run_until(argv: list[str], env: dict[str, str], marker: str) -> tuple[list[dict], str]:
    """Start, wait for a stderr line holding `marker`, SIGTERM; (every stderr line parsed, stdout)."""
    proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        while not lines or marker not in lines[-1]:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
        proc.send_signal(signal.SIGTERM)
        out, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += rest.splitlines(True)
    assert proc.returncode == 0, "".join(lines)  # SIGTERM: a graceful stop
    return [json.loads(line) for line in lines], out


def _messages(records: list[dict]) -> list[str]:
    return [r["msg"] for r in records]


def test_serve_writes_only_json_lines(tmp_path: Path) -> None:
    """One process: uvicorn's start line once; with no cluster at hand the native-sidecar
    detection says so once; a setting of a removed mechanism is named, and a misspelled one."""
    make_certs(tmp_path / "tls")
    env = _env(tmp_path, INITSHIFT_WORKERS="2", INITSHIFT_FAILURE_MOD="deny", INITSHIFT_TLS_CERT=str(tmp_path / "tls" / "tls.crt"),
               INITSHIFT_TLS_KEY=str(tmp_path / "tls" / "tls.key"), SUPPORT_INJECTED_SIDECARS="true")
    records, _ = run_until(["serve"], env, "Started server process")
    text = _messages(records)
    assert sum(m.startswith("Started server process") for m in text) == 1, text
    assert "Shutting down" in text and any(m.startswith("Finished server process") for m in text), text
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    assert sum("no API access" in r["msg"] for r in records if r["level"] == "warning") == 1, text
    assert any(m.startswith("INITSHIFT_WORKERS is no longer used") and r["level"] == "warning"
               for m, r in zip(text, records)), text
    assert any(m.endswith("did you mean INITSHIFT_FAILURE_MODE?") and r["level"] == "warning"
               for m, r in zip(text, records)), text


def test_serve_without_the_feature_gate_says_why_no_pod_is_rewritten(tmp_path: Path) -> None:
    """A server started without SUPPORT_INJECTED_SIDECARS said only "default strategy
    disabled", and warned of what a missing cluster would cost a rewrite that never comes."""
    make_certs(tmp_path / "tls")
    env = _env(tmp_path, INITSHIFT_TLS_CERT=str(tmp_path / "tls" / "tls.crt"),
               INITSHIFT_TLS_KEY=str(tmp_path / "tls" / "tls.key"))
    env.pop("SUPPORT_INJECTED_SIDECARS", None)
    records, _ = run_until(["serve"], env, "Started server process")
    text = _messages(records)
    assert any(m.endswith("default strategy disabled (SUPPORT_INJECTED_SIDECARS is not true: every pod is admitted "
                          "unchanged)") for m in text), text
    assert not any("no API access" in r["msg"] for r in records if r["level"] == "warning"), text


def test_dev_server_logs_json_and_prints_its_banner_on_stdout(tmp_path: Path) -> None:
    records, out = run_until(["dev-server", "--dir", str(tmp_path / "run")], _env(tmp_path),
                             '"serving: ')  # logged just before the banner
    text = _messages(records)
    assert any(m.startswith("Started server process") for m in text) and "Shutting down" in text, text
    assert "initshift dev-server on https://127.0.0.1:" in out and "curl -sS --cacert" in out
