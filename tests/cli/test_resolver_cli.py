"""`initshift mutate --resolve`: the dry run looks up entrypoints in a real registry."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fixtures import pods
from tests.support.registryd import Env, shared_env
from waiter import protocol as p

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env() -> Env:
    return shared_env()


def job(image: str, args: list[str] | None = None) -> dict:
    """The catalogue's Istio Job with its clone step turned into one without `command`."""
    pod = copy.deepcopy(pods.catalogue()["job-istio"])
    step = next(c for c in pod["spec"]["initContainers"] if c["name"] == "git-clone")
    step["image"] = image
    step.pop("command")
    step.pop("args")
    if args is not None:
        step["args"] = args
    return pod


def mutate(env: Env, pod: dict, *extra: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "INITSHIFT_REGISTRY_CA_FILE": str(env.pki.ca_file),
               "INITSHIFT_REGISTRY_BUDGET_SECONDS": "10"}
    return subprocess.run([sys.executable, "-m", "webhook.cli", "mutate", "-", "-o", "json", *extra],
                          input=json.dumps(pod), capture_output=True, text=True, cwd=ROOT, env=environ, timeout=60)


def step_command(pod: dict) -> list[str]:
    step = next(c for c in pod["spec"]["containers"] if c["name"] == "git-clone")
    return [*step["command"], *step.get("args", [])]


def test_resolve_fills_in_the_image_cmd(env: Env) -> None:
    out = mutate(env, job(f"{env.bearer.host}/public/tool", args=None), "--resolve")
    assert out.returncode == 0, out.stderr
    pod = json.loads(out.stdout)
    assert pod["metadata"]["labels"][p.LABEL_MANAGED] == p.MODE_WAITER
    argv = step_command(pod)
    assert argv[0] == p.WAITER_PATH and argv[-2:] == [p.ARGV_SEPARATOR, "/bin/tool"]


def test_resolve_hands_the_waiter_a_per_platform_map(env: Env) -> None:
    out = mutate(env, job(f"{env.bearer.host}/public/multi:v1", args=["--depth=1"]), "--resolve")
    assert out.returncode == 0, out.stderr
    pod = json.loads(out.stdout)
    argv = step_command(pod)
    mapping = json.loads(argv[argv.index(p.FLAG_ARGV_MAP) + 1])
    assert mapping == {"linux/amd64": ["/bin/amd"], "linux/arm64": ["/bin/arm"]}
    assert argv[-2:] == [p.ARGV_SEPARATOR, "--depth=1"]
    step = next(c for c in pod["spec"]["containers"] if c["name"] == "git-clone")
    assert step["image"] == f"{env.bearer.host}/public/multi:v1"  # nothing pinned


def test_without_resolve_or_with_a_failed_lookup_the_pod_is_denied(env: Env) -> None:
    image = f"{env.bearer.host}/public/tool"
    assert mutate(env, job(image)).returncode == 3
    missing = f"{env.bearer.host}/public/tool:nope"
    out = mutate(env, job(missing), "--resolve")
    assert out.returncode == 3
    assert f"container 'git-clone' has no command and the ENTRYPOINT of image '{missing}'" in out.stderr
    assert "not found (404" in out.stderr and "Traceback" not in out.stderr


def test_unreadable_ca_file_is_one_line(env: Env, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "webhook.cli", "mutate", "-", "--resolve"],
                         input=json.dumps(job(f"{env.bearer.host}/public/tool")), capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "INITSHIFT_REGISTRY_CA_FILE": str(tmp_path / "none.pem")},
                         timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == f"initshift mutate: INITSHIFT_REGISTRY_CA_FILE '{tmp_path / 'none.pem'}': " \
                                 "No such file or directory"


def test_a_manifest_looks_each_image_up_once(env: Env) -> None:
    """Two Jobs of one image in a manifest: one resolver for the whole run, so the second
    pod's lookup is the first one's (no request reaches the registry for it)."""
    proxy = env.proxy(env.bearer)
    image = f"{proxy.host}/public/tool"
    environ = {**os.environ, "INITSHIFT_REGISTRY_CA_FILE": str(env.pki.ca_file), "INITSHIFT_REGISTRY_BUDGET_SECONDS": "10"}

    def requests(*docs: dict) -> tuple[int, list[dict]]:
        before = proxy.count()
        out = subprocess.run([sys.executable, "-m", "webhook.cli", "mutate", "-", "-o", "json", "--resolve"],
                             input="\n---\n".join(json.dumps(d) for d in docs), capture_output=True, text=True,
                             cwd=ROOT, env=environ, timeout=60)
        assert out.returncode == 0, out.stderr
        printed = json.loads(out.stdout)
        return proxy.count() - before, printed["items"] if printed["kind"] == "List" else [printed]

    alone, _ = requests(job(image))
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}}
    both, printed = requests(job(image), service, job(image))
    assert alone > 0 and both == alone
    built = [o for o in printed if o["kind"] == "Pod"]
    assert len(built) == 2 and all(step_command(o)[-2:] == [p.ARGV_SEPARATOR, "/bin/tool"] for o in built)
