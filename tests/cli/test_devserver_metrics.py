"""`make run` (`initshift dev-server`) says where the metrics are, and they are there."""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.https_helpers import ipv6_loopback
from webhook.admission._https import bind
from webhook.cli._devserver import metrics_url


def test_metrics_url_wording():
    assert metrics_url("0.0.0.0", 8080) == "metrics on http://127.0.0.1:8080/metrics"
    assert metrics_url("[::1]", 8080) == metrics_url("::1", 8080) == "metrics on http://[::1]:8080/metrics"
    assert metrics_url("::", 8080) == "metrics on http://[::1]:8080/metrics"
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


def test_the_banner_names_the_ports_picked_and_its_curl_works(tmp_path):
    """INITSHIFT_PORT=0 asks for any free port: the banner and the `serving` log line give
    the one picked, and the printed curl reaches it (a bracketed IPv6 host too, which the
    certificate then holds)."""
    host = "[::1]" if ipv6_loopback() else "127.0.0.1"
    env = {k: v for k, v in os.environ.items() if not k.startswith("INITSHIFT_") and k != "KUBECONFIG"}
    env.update(INITSHIFT_HOST=host, INITSHIFT_PORT="0", HOME=str(tmp_path))
    # The metrics port: an explicit free one (0 turns metrics off).
    sock = bind()
    env["INITSHIFT_METRICS_PORT"] = str(sock.getsockname()[1])
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "dev-server", "--dir", str(tmp_path / "run")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        serving = ""
        deadline = time.monotonic() + 60
        while '"serving: ' not in serving and time.monotonic() < deadline and proc.poll() is None:
            serving = proc.stderr.readline()
        banner = ""
        while "decoded patch" not in banner and time.monotonic() < deadline and proc.poll() is None:
            banner += proc.stdout.readline()
        port = int(re.search(r"dev-server on https://\[?[0-9a-f:.]+\]?:(\d+) ", banner).group(1))
        assert port != 0
        assert f"https://{host}:{port}/mutate" in json.loads(serving)["msg"], serving
        curl = shlex.split(re.search(r"try:\n  (.*)\n", banner).group(1))
        assert curl[-1] == f"https://{host}:{port}/mutate"
        ca, body = curl[curl.index("--cacert") + 1], curl[curl.index("--data") + 1].removeprefix("@")
        answer = httpx.post(curl[-1], content=Path(body).read_bytes(), verify=ssl.create_default_context(cafile=ca), timeout=10,
                            headers={"Content-Type": "application/json"})
        assert answer.status_code == 200 and answer.json()["kind"] == "AdmissionReview", answer.text
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
