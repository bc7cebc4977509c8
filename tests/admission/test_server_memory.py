"""The memory budget holds (issue 24 point 6): `initshift serve` with the default worker
count, started inside a memory cgroup limited to what the shipped Deployment allows, takes
every heavy case of tests/support/hostile.py (a 32 MB header flood, a metrics flood, slow
bodies, four clients flooding 7 MB reviews, 20,000 pipelined requests) without a worker
being OOM-killed, and still answers."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.support import hostile
from tests.support import https_helpers as h
from tests.support.deploy_render import Rendered, kustomize
from webhook.admission._workers import AUTO_MAX_WORKERS, cgroup_memory_limit, workers_for_memory
from webhook.rewrite._quantity import parse


def deployment_memory_limit() -> int:
    """The memory limit of the shipped Deployment (deploy/base, rendered by kustomize)."""
    return parse(Rendered(kustomize("base")).container["resources"]["limits"]["memory"], "memory")


def test_the_default_worker_count_survives_the_heavy_cases_inside_the_deployments_memory_limit():
    limit = deployment_memory_limit()
    cgroup = hostile.MemoryCgroup.create(limit, f"initshift-test-{os.getpid()}")
    if cgroup is None:
        pytest.skip("no writable memory cgroup here (cgroup v1 or v2 under this process's own)")
    d = Path(tempfile.mkdtemp(prefix="initshift-memcap-"))
    h.make_certs(d)
    env = {k: v for k, v in os.environ.items() if k != "INITSHIFT_WORKERS"}  # the default: 0
    proc = None
    try:
        proc, port = h.serve_process(d, hostile.small_body(), env={**env, "INITSHIFT_WORKERS": "0"},
                                     preexec_fn=cgroup.enter)
        cpus = min(len(os.sched_getaffinity(0)), AUTO_MAX_WORKERS)
        expected = min(cpus, workers_for_memory(limit))
        expected = expected if expected > 1 else 0  # one worker runs without a supervisor
        deadline = time.monotonic() + 120  # the others start once worker 0 serves
        while len(hostile.children(proc.pid)) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        workers = hostile.children(proc.pid)
        assert len(workers) == expected
        metrics_port = int(_env_of(proc.pid)["INITSHIFT_METRICS_PORT"])
        ctx = h.client_context(d / "ca.crt")
        seen: dict = {}
        hostile.run_all(port, metrics_port, str(d / "ca.crt"), large=hostile.large_body(7 * 1000 * 1000),
                        note=seen.__setitem__)
        assert cgroup.oom_kills() == 0, seen
        assert proc.poll() is None and hostile.children(proc.pid) == workers  # none died, none replaced
        assert 200 in seen["large reviews answered"]
        assert all(status == 200 for status, _ in seen["small reviews during the large flood"]), seen
        with httpx.Client(verify=ctx) as c:
            assert c.post(f"https://127.0.0.1:{port}/mutate", content=hostile.small_body(),
                          headers=hostile.JSON_CT).status_code == 200
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
        cgroup.remove()


def _env_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_server_reads_its_own_cgroups_memory_limit():
    """What `worker_count` reads in the cgroup the test above makes (or skips)."""
    cgroup = hostile.MemoryCgroup.create(300 * 1024 * 1024, f"initshift-probe-{os.getpid()}")
    if cgroup is None:
        pytest.skip("no writable memory cgroup here")
    try:
        import subprocess
        import sys

        out = subprocess.run([sys.executable, "-c", "from webhook.admission._workers import cgroup_memory_limit as m;"
                              "print(m())"], capture_output=True, text=True, preexec_fn=cgroup.enter, check=True)
        assert int(out.stdout) == 300 * 1024 * 1024
        assert cgroup_memory_limit() != 300 * 1024 * 1024  # this process is outside it
    finally:
        cgroup.remove()
