"""`initshift serve` with several worker processes, as a real process tree: every worker
answers on the one port, `/metrics` adds them up, a certificate rotation reaches every
worker, a worker that dies is replaced, SIGTERM ends them all."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

from certs import pki
from tests.admission.test_server_rotation import der, secret_volume
from tests.support import https_helpers as h
from tests.support.hostile import children
from waiter import protocol as p
from webhook.admission._https import bind

REVIEW = h.review(h.kpack_istio(), namespace="builds")


def wait_for(condition, seconds: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def served(port: int, ctx: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        return s.getpeercert(binary_form=True)


def test_workers_share_the_port_reload_certificates_and_are_replaced(tmp_path):
    names = list(h.LOOPBACK.dns_names)
    old_ca, new_ca = pki.create_ca("old-ca"), pki.create_ca("new-ca")
    old = pki.create_serving(old_ca, names, h.LOOPBACK.ips)
    new = pki.create_serving(new_ca, names, h.LOOPBACK.ips)
    (tmp_path / "bundle.crt").write_bytes(old_ca.cert_pem + new_ca.cert_pem)
    ctx = h.client_context(tmp_path / "bundle.crt")
    vol = tmp_path / "tls"
    vol.mkdir()
    secret_volume(vol, "v1", old)
    sock, metrics_sock = bind(), bind()
    port, metrics_port = sock.getsockname()[1], metrics_sock.getsockname()[1]
    sock.close()
    metrics_sock.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INITSHIFT_", p.FEATURE_GATE_ENV))}
    env.update({p.FEATURE_GATE_ENV: "true", "INITSHIFT_HOST": "127.0.0.1", "INITSHIFT_PORT": str(port),
                "INITSHIFT_WORKERS": "2", "INITSHIFT_METRICS_PORT": str(metrics_port), "INITSHIFT_TLS_CERT": str(vol / "tls.crt"),
                "INITSHIFT_TLS_KEY": str(vol / "tls.key"), "INITSHIFT_LOG_LEVEL": "warning"})
    proc = subprocess.Popen([sys.executable, "-m", "webhook.cli", "serve"], env=env)
    url = f"https://127.0.0.1:{port}"
    try:
        wait_for(lambda: len(children(proc.pid)) == 2, what="two workers")
        first = children(proc.pid)

        def answers() -> bool:
            try:
                return httpx.get(f"{url}/readyz", verify=ctx).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(answers, what="the server")
        multiproc = next(line.split("=", 1)[1] for line in
                         Path(f"/proc/{min(first)}/environ").read_text().split("\0")
                         if line.startswith("PROMETHEUS_MULTIPROC_DIR="))
        posted = 0

        def both_answered() -> bool:  # a new connection each: the kernel spreads them over the workers
            nonlocal posted
            r = httpx.post(f"{url}/mutate", json=REVIEW, verify=ctx)
            assert r.status_code == 200 and r.json()["response"]["patch"]
            posted += 1
            # a worker's counter file appears with its first review
            return all((Path(multiproc) / f"counter_{pid}.db").exists() for pid in children(proc.pid))

        wait_for(both_answered, what="a review answered by each worker")
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text  # worker 0's port, every worker's values
        patched = re.search(r'^initshift_admission_requests_total\{outcome="patched"\} ([\d.]+)$', scraped, re.M)
        assert patched and float(patched.group(1)) == posted

        secret_volume(vol, "v2", new)  # every worker reloads on its own
        wait_for(lambda: all(served(port, ctx) == der(new) for _ in range(20)), what="the new certificate everywhere")

        victim = sorted(first)[-1]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(children(proc.pid)) == 2 and victim not in children(proc.pid), what="a replacement")
        wait_for(answers, what="the server after the replacement")
        assert served(port, ctx) == der(new)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0
    assert not children(proc.pid)


def test_worker_count_follows_the_cpu_limit(tmp_path):
    from webhook.admission._workers import AUTO_MAX_WORKERS, worker_count

    cpus = min(len(os.sched_getaffinity(0)), AUTO_MAX_WORKERS)
    assert worker_count(3, str(tmp_path)) == 3  # explicit wins
    assert worker_count(0, str(tmp_path)) == cpus  # no cgroup files: the CPUs it may run on
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert worker_count(0, str(tmp_path)) == cpus
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a CPU (cgroup v2)
    assert worker_count(0, str(tmp_path)) == 1
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")  # 1.5 CPUs (cgroup v1): 2 workers at most
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert worker_count(0, str(tmp_path)) == min(cpus, 2)


def test_worker_count_follows_the_memory_limit(tmp_path):
    """Issue 24 point 6: `0` starts no more workers than the container's memory limit holds,
    read from the process's own cgroup (v2 memory.max, v1 memory.limit_in_bytes) or the
    mount's root (a container's cgroup namespace)."""
    from webhook.admission._workers import (AUTO_MAX_WORKERS, SUPERVISOR_BYTES, WORKER_BYTES,
                                            cgroup_memory_limit, worker_count)

    cpus = min(len(os.sched_getaffinity(0)), AUTO_MAX_WORKERS)
    mine = tmp_path / "self-cgroup"
    mine.write_text("0::/kubepods/pod1/c1\n")
    assert worker_count(0, str(tmp_path), str(mine)) == cpus  # no memory files: CPUs decide
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(str(tmp_path), str(mine)) is None
    (tmp_path / "memory.max").write_text(f"{256 * 1024 * 1024}\n")  # the old Deployment's 256Mi: one worker
    assert worker_count(0, str(tmp_path), str(mine)) == 1
    own = tmp_path / "kubepods" / "pod1" / "c1"
    own.mkdir(parents=True)
    (tmp_path / "memory.max").write_text("max\n")
    (own / "memory.max").write_text(f"{SUPERVISOR_BYTES + 2 * WORKER_BYTES}\n")  # its own cgroup's limit counts
    assert worker_count(0, str(tmp_path), str(mine)) == min(cpus, 2)
    assert worker_count(5, str(tmp_path), str(mine)) == 5  # explicit wins
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory_limit(str(v1), str(mine)) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{64 * 1024 * 1024}\n")
    assert worker_count(0, str(v1), str(mine)) == 1  # never fewer than one
