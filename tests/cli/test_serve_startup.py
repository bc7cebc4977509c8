"""`serve`, `dev-server` and `watch` refuse at start what they cannot run with, in one line,
before anything listens: a bad `-n`, an empty `--kubeconfig`, a kubeconfig or context the
user named that does not work, `--watch` without the cluster; and a failed start-up
leaves no second error line behind (an unclosed API client). The quiet fallback, serving
without the cluster when none was named: tests/cli/test_json_logs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_cli_errors import one_line, run
from tests.cli.test_watcher_cmd import kubeconfig
from tests.support.https_helpers import make_certs
from tests.support.k8s import free_port


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An empty home (no ~/.kube/config), valid certificates and free ports: whatever fails is
    the cluster's part, and without the checks the server would listen."""
    make_certs(tmp_path / "tls")
    home = tmp_path / "home"
    home.mkdir()
    return {"HOME": str(home), "INITSHIFT_NATIVE_SIDECARS": "false", "INITSHIFT_HOST": "127.0.0.1",
            "INITSHIFT_PORT": str(free_port()), "INITSHIFT_METRICS_PORT": "0",
            "INITSHIFT_TLS_CERT": str(tmp_path / "tls" / "tls.crt"),
            "INITSHIFT_TLS_KEY": str(tmp_path / "tls" / "tls.key")}


@pytest.mark.parametrize("value", ["", "Foo", "a,b", "-x", "a" * 64])
def test_watch_namespace_is_a_namespace_name(env: dict[str, str], value: str) -> None:
    # '' watched every namespace; 'a,b' became GET /api/v1/namespaces/a,b/pods
    one_line(run(["watch", "-n", "ci", f"--namespace={value}"], env), 2,
             f"argument -n/--namespace: expected a Kubernetes name (RFC 1123 label: lower-case letters, digits and "
             f"'-', at most 63 characters), got {value!r}", "initshift watch")


@pytest.mark.parametrize("command", ["serve", "watch", "dev-server"])
def test_an_empty_kubeconfig_is_refused(env: dict[str, str], tmp_path: Path, command: str) -> None:
    # it was skipped for $KUBECONFIG, which then took the blame
    env = {**env, "KUBECONFIG": str(tmp_path / "missing")}
    one_line(run([command, "--kubeconfig", ""], env), 2, "argument --kubeconfig: an empty path", f"initshift {command}")


def _named(tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str], str]]:
    (tmp_path / "garbage").write_text("clusters: [\n")
    (tmp_path / "dir").mkdir()
    good = kubeconfig(tmp_path / "good", "https://127.0.0.1:1")
    return {
        "missing": (["--kubeconfig", str(tmp_path / "missing")], {}, f"kubeconfig {tmp_path}/missing: no such file"),
        "garbage": (["--kubeconfig", str(tmp_path / "garbage")], {}, f"kubeconfig {tmp_path}/garbage: not YAML"),
        "directory": (["--kubeconfig", str(tmp_path / "dir")], {}, f"kubeconfig {tmp_path}/dir: is a directory"),
        "context": (["--kubeconfig", str(good), "--context", "nope"], {},
                    f"kubeconfig {good}: context 'nope' not found"),
        "context-alone": (["--context", "nope"], {},
                          f"kubeconfig {tmp_path}/home/.kube/config: context 'nope' not found"),
        "env": ([], {"KUBECONFIG": str(tmp_path / "missing")}, f"KUBECONFIG names {tmp_path}/missing"),
    }


@pytest.mark.parametrize("case", ["missing", "garbage", "directory", "context", "context-alone", "env"])
def test_a_named_kubeconfig_that_does_not_work_fails_start_up(env: dict[str, str], tmp_path: Path,
                                                              case: str) -> None:
    # it was one warning ("no API access ..."), then the server served without the cluster
    argv, extra, words = _named(tmp_path)[case]
    proc = run(["serve", *argv], {**env, **extra})
    one_line(proc, 1, f"initshift serve: {words}", "initshift serve", json_line=True)
    assert b"Started server process" not in proc.stderr and b"no API access" not in proc.stderr


@pytest.mark.parametrize("command", ["serve", "dev-server"])
def test_watch_needs_the_cluster_before_listening(env: dict[str, str], tmp_path: Path, command: str) -> None:
    # it listened (dev-server printed its banner and curl), then the watcher failed
    argv = [command, "--watch"] + (["--dir", str(tmp_path / "run")] if command == "dev-server" else [])
    proc = run(argv, env)
    one_line(proc, 1, f"initshift {command}: --watch needs the cluster: no kubeconfig found", f"initshift {command}",
             json_line=True)
    assert b"Started server process" not in proc.stderr and proc.stdout == b"", proc.stdout


def test_a_failed_start_up_closes_its_api_client(env: dict[str, str], tmp_path: Path) -> None:
    # the one error line was followed by asyncio's "Unclosed client session"
    cfg = kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{free_port()}")
    proc = run(["serve", "--kubeconfig", str(cfg)], {**env, "INITSHIFT_SELF_MANAGED_CERTS": "true"})
    one_line(proc, 1, "cannot connect to 127.0.0.1", "initshift serve", json_line=True)
    assert b"Unclosed" not in proc.stderr

