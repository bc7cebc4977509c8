"""The Dockerfile against the Makefile, CI, protocol.py and the settings. No Docker engine
runs here, so the image is checked by reading it: its steps must be the make targets CI
runs, and every path and name in it must be the one the code uses."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field

import pytest

from waiter import protocol as p
from webhook.cli import _main as cli
from webhook.settings import RewriteSettings, Settings

from tests.support.deploy_render import REPO, Rendered, kustomize

DOCKERFILE = REPO / "Dockerfile"
MAKEFILE = REPO / "Makefile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, op: str) -> list[str]:
        return [a for o, a in self.instructions if o == op]


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions per stage (continuations joined, comments dropped)."""
    logical: list[str] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    stages: list[Stage] = []
    for inst in logical:
        op, _, arg = inst.strip().partition(" ")
        op, arg = op.upper(), " ".join(arg.split())
        if op == "FROM":
            words = arg.split()
            stages.append(Stage(words[0], words[2] if len(words) > 2 and words[1].upper() == "AS" else None))
        elif stages:
            stages[-1].instructions.append((op, arg))
        elif op != "ARG":
            raise AssertionError(f"{op} before the first FROM")
    return stages


def make_targets(text: str) -> dict[str, list[str]]:
    """target -> prerequisites, for the Makefile's explicit rules."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)([^\n]*)$", text, re.M):
        out[m.group(1)] = m.group(2).split()
    return out


def closure(targets: dict[str, list[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo += [d for d in targets.get(t, []) if d in targets]
    return seen


def make_dry_run(*targets: str) -> str:
    # -n prints the recipes without running them; -B so up-to-date stamps do not hide them.
    proc = subprocess.run(["make", "-n", "-B", "-C", str(REPO), *targets], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def builder(stages) -> Stage:
    (b,) = [s for s in stages if s.name == "builder"]
    return b


@pytest.fixture(scope="module")
def runtime(stages) -> Stage:
    assert stages[-1].name is None, "the last stage is the image"
    return stages[-1]


def make_calls(stage: Stage) -> list[str]:
    targets: list[str] = []
    for run in stage.args("RUN"):
        for part in re.split(r"&&|;", run):
            words = shlex.split(part)
            if words and words[0] == "make":
                targets += [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return targets


def test_two_stages_slim_debian_runtime(stages, builder, runtime):
    assert len(stages) == 2
    assert builder.base.startswith("debian:")
    assert re.fullmatch(r"python:3\.\d+-slim-\w+", runtime.base), runtime.base
    minor = int(runtime.base.split(":")[1].split(".")[1].split("-")[0])
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11" and minor >= 11


def test_builder_runs_make_targets_that_exist_and_ci_runs_them(builder):
    targets = make_targets(MAKEFILE.read_text())
    calls = make_calls(builder)
    assert calls == ["waiter", "wheel"], calls
    assert set(calls) <= set(targets)
    ci = (REPO / ".ci" / "run").read_text()
    ci_targets = [w for line in ci.splitlines() if line.strip().startswith("make ")
                  for w in line.split()[1:] if not w.startswith("-")]
    assert ci_targets, "CI runs make"
    ci_closure = set().union(*(closure(targets, t) for t in ci_targets))
    # The frozen waiter is built by the very target CI builds and tests it with.
    assert "waiter" in ci_closure
    # The builder needs Debian's python3 (the Makefile's preferred interpreter) and venv.
    (apt,) = [r for r in builder.args("RUN") if "apt-get install" in r]
    assert {"make", "python3", "python3-venv"} <= set(apt.split())
    assert "/usr/bin/python3" in MAKEFILE.read_text()


def test_make_targets_write_what_the_runtime_copies(runtime):
    dry = make_dry_run("waiter", "wheel")
    assert re.search(r"-m waiter\.build dist/waiter\b", dry), dry
    assert re.search(r"pip wheel .*-w dist/wheels \.", dry), dry
    copies = [a.split() for a in runtime.args("COPY")]
    from_builder = {c[-2]: c[-1] for c in copies if c[0] == "--from=builder"}
    assert from_builder["/src/dist/waiter/"].rstrip("/") == p.IMAGE_WAITER_DIR
    assert from_builder["/src/dist/wheels/"] == "/tmp/wheels/"
    (install,) = [r for r in runtime.args("RUN") if "pip install" in r]
    assert "/tmp/wheels/*.whl" in install
    # the dependencies come from the lock file, copied from the build context
    from_context = {c[0]: c[1] for c in copies if not c[0].startswith("--")}
    lock = from_context["constraints/image.txt"]
    assert f"-c {lock}" in install
    assert not ignored([ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                        if ln.strip() and not ln.startswith("#")], "constraints/image.txt")


def test_builder_copies_the_source_to_where_it_builds(builder):
    assert builder.args("WORKDIR") == ["/src"]
    assert builder.args("COPY") == [". ."]


def test_injected_init_command_lives_in_the_copied_bundle():
    assert p.INIT_COMMAND[0] == f"{p.IMAGE_WAITER_DIR}/{p.WAITER_INIT_EXE_NAME}"
    bundle = REPO / "dist" / p.WAITER_DIR_NAME
    if not bundle.is_dir():
        pytest.skip("dist/waiter not built (make test builds it first)")
    assert (bundle / p.WAITER_INIT_EXE_NAME).is_file()
    assert (bundle / p.WAITER_EXE_NAME).is_file()


def test_runtime_user_is_the_protocol_uid(runtime):
    (user,) = runtime.args("USER")
    uid, _, gid = user.partition(":")
    assert int(uid) == p.IMAGE_UID != 0
    assert int(gid or uid) == p.IMAGE_UID


def test_injected_image_defaults_to_the_images_own_tag(stages, runtime):
    (arg,) = runtime.args("ARG")
    name, _, default = arg.partition("=")
    assert name == "IMAGE"
    assert default == RewriteSettings().image
    env_field = next(f for f in RewriteSettings.__dataclass_fields__.values() if f.name == "image")
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(runtime.args("ENV"))))
    assert env[env_field.metadata["env"]] == "${IMAGE}"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1", "the root filesystem is read-only"
    # With that ENV, the running server injects the image it runs from.
    assert Settings.from_env({env_field.metadata["env"]: default}).rewrite.image == default


def test_entrypoint_is_the_deployments_command(runtime):
    import json

    (entrypoint,) = runtime.args("ENTRYPOINT")
    (cmd,) = runtime.args("CMD")
    argv = json.loads(entrypoint) + json.loads(cmd)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert argv[0] in scripts and scripts[argv[0]] == "webhook.cli:main"
    assert argv[1] in cli.COMMANDS
    assert Rendered(kustomize(".")).container["command"] == argv
    (ports,) = runtime.args("EXPOSE")
    assert [int(x) for x in ports.split()] == [Settings().server.port, Settings().server.metrics_port]


def ignored(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule, for the patterns used here: last match wins, `!` re-includes,
    a pattern matching a directory excludes what is under it."""
    out = False
    parts = path.split("/")
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat[1:] if neg else pat
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        pat_any = pat[3:] if pat.startswith("**/") else None
        if any(fnmatch.fnmatchcase(x, pat) or (pat_any and fnmatch.fnmatchcase(x.split("/")[-1], pat_any))
               for x in prefixes):
            out = not neg
    return out


def test_dockerignore_keeps_the_build_inputs_and_drops_host_state():
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    needed = ["Makefile", "pyproject.toml", "README.md", "webhook/server.py", "waiter/protocol.py",
              "certs/__init__.py"]
    needed += [str(f.relative_to(REPO)) for f in (REPO / "waiter").glob("*.py")]
    for path in needed:
        assert not ignored(patterns, path), path
    for path in (".venv/bin/python", ".venv-floors/bin/python", "dist/waiter/waiter", ".git/HEAD", "webhook/__pycache__/x.pyc",
                 "tests/test_deploy.py", "initshift.egg-info/PKG-INFO"):
        assert ignored(patterns, path), path
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for include in packages["include"]:
        assert not ignored(patterns, include.rstrip("*")), include


def test_dockerfile_parser_and_ignore_rules_are_honest():
    text = "ARG X=1\nFROM a AS b\nRUN make one \\\n  # note\n  && make two\nFROM c\nUSER 1\n"
    s = parse_dockerfile(text)
    assert [(x.base, x.name) for x in s] == [("a", "b"), ("c", None)]
    assert make_calls(s[0]) == ["one", "two"]
    assert ignored(["dist", "!dist/keep"], "dist/x") and not ignored(["dist", "!dist/keep"], "dist/keep")
    assert not ignored(["dist"], "distribution")
