"""The supervisor of `initshift serve` (INITSHIFT_WORKERS > 1) passes --kubeconfig and
--context on to its workers and never imports the kube package itself: kubernetes-asyncio
would add ~48 MB to a process that makes no API call (the memory budget counts on it)."""

from __future__ import annotations

import json
import subprocess
import sys

_PROBE = """
import json, sys
from webhook.admission import _workers
seen = {}
def run(self, on_started=None):
    seen.update(args=self.worker_args, kube_loaded="kubernetes_asyncio" in sys.modules)
    return 0
_workers.Supervisor.run = run
from webhook.cli import _serve
code = _serve.main(["--kubeconfig", "/nowhere/config", "--context", "dev", "--port", "0"])
print(json.dumps(dict(seen, code=code)))
"""


def test_supervisor_forwards_kubeconfig_flags_without_loading_the_kube_client(tmp_path):
    env = {"INITSHIFT_WORKERS": "2", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen == {"args": ["--kubeconfig", "/nowhere/config", "--context", "dev"], "kube_loaded": False, "code": 0}
