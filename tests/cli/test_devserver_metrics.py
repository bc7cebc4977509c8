"""`make run` (`initshift dev-server`) says where the metrics are, and they are there."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from webhook.admission._https import bind
from webhook.cli._devserver import metrics_url


def test_metrics_url_wording():
    assert metrics_url("0.0.0.0", 8080) == "metrics on http://127.0.0.1:8080/metrics"
    assert metrics_url("127.0.0.1", 9402) == "metrics on http://127.0.0.1:9402/metrics"
    assert metrics_url("127.0.0.1", 0).startswith("metrics off")


def test_dev_server_prints_and_serves_metrics(tmp_path):
    socks = [bind(), bind()]
    port, metrics_port = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INITSHIFT_")}
    env.update(INITSHIFT_PORT=str(port), INITSHIFT_METRICS_PORT=str(metrics_port), HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "dev-server", "--dir", str(tmp_path / "run")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        banner = ""  # on stdout: stderr holds the JSON log lines only
        deadline = time.monotonic() + 60
        while "metrics on" not in banner and time.monotonic() < deadline and proc.poll() is None:
            banner += proc.stdout.readline()
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        assert f"metrics on {url}" in banner, banner
        text = httpx.get(url, timeout=10).text
        assert 'initshift_build_info{version="' in text
        assert 'initshift_certificate_expiration_timestamp_seconds{certificate="serving"}' in text
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
