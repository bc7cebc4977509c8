"""kubeconfig resolution as kubectl does it (webhook/kube/_config.py), and the one-line
errors of every command that connects, run as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.kubedouble import KubeDouble
from webhook.kube import KubeApi, KubeError
from webhook.kube._config import KubeConfigError, client_configuration, resolve


def kubeconfig(path: Path, *, server: str = "https://a.example", context: str = "a", cluster: str = "a",
               user: str = "a", namespace: str | None = None, current: str | None = "a", **cluster_extra) -> Path:
    ctx: dict = {"cluster": cluster, "user": user}
    if namespace:
        ctx["namespace"] = namespace
    doc = {"apiVersion": "v1", "kind": "Config",
           "clusters": [{"name": cluster, "cluster": {"server": server, **cluster_extra}}],
           "users": [{"name": user, "user": {"token": f"token-{user}"}}],
           "contexts": [{"name": context, "context": ctx}]}
    if current:
        doc["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def sa(tmp_path) -> Path:
    """A service-account directory as the kubelet mounts it."""
    d = tmp_path / "sa"
    d.mkdir()
    (d / "token").write_text("sa-token")
    (d / "namespace").write_text("initshift-system")
    from certs import pki

    (d / "ca.crt").write_bytes(pki.create_ca(days=1).cert_pem)
    return d


IN_POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_explicit_kubeconfig_wins_over_everything(tmp_path, sa):
    explicit = kubeconfig(tmp_path / "explicit", server="https://explicit", namespace="x")
    kubeconfig(tmp_path / "home/.kube/config", server="https://home")
    env = {**IN_POD, "KUBECONFIG": str(kubeconfig(tmp_path / "env", server="https://env"))}
    src = resolve(str(explicit), environ=env, home=tmp_path / "home", sa_dir=sa)
    assert (src.kind, src.files, src.namespace) == ("kubeconfig", [str(explicit)], "x")


def test_missing_explicit_kubeconfig_is_an_error(tmp_path):
    with pytest.raises(KubeConfigError, match="no such file"):
        resolve(str(tmp_path / "nope"), environ={}, home=tmp_path)


def _piped(text: bytes) -> int:
    """A pipe holding `text`, its writer closed, as the shell's `<(...)` gives one."""
    read_end, write_end = os.pipe()
    os.write(write_end, text)  # (within the pipe's buffer)
    os.close(write_end)
    return read_end


def test_a_kubeconfig_given_as_a_pipe_is_read_as_kubectl_reads_it(tmp_path):
    """`--kubeconfig <(kubectl config view --raw)`: the shell passes a pipe, /dev/fd/N."""
    first = _piped(kubeconfig(tmp_path / "a", server="https://piped", namespace="p").read_bytes())
    try:
        piped = f"/dev/fd/{first}"
        src = resolve(piped, environ={}, home=tmp_path)
        assert (src.kind, src.files, src.namespace) == ("kubeconfig", [piped], "p")
        # A pipe reads once; `serve` builds a client for certificates, detection and the watcher.
        assert resolve(piped, environ={}, home=tmp_path).config == src.config
    finally:
        os.close(first)
    second = _piped(kubeconfig(tmp_path / "b", server="https://other", namespace="q").read_bytes())
    try:  # another pipe, most likely under the same number: its own content
        assert resolve(f"/dev/fd/{second}", environ={}, home=tmp_path).namespace == "q"
    finally:
        os.close(second)


def test_dev_null_as_kubeconfig_is_an_empty_one(tmp_path):
    with pytest.raises(KubeConfigError, match="^kubeconfig /dev/null: no clusters, users or contexts; pass"):
        resolve("/dev/null", environ={}, home=tmp_path)


@pytest.mark.parametrize("how", ["flag", "KUBECONFIG"])
def test_a_directory_as_kubeconfig_says_so(tmp_path, how):
    (tmp_path / "kube").mkdir()
    explicit, env = (str(tmp_path / "kube"), {}) if how == "flag" else (None, {"KUBECONFIG": str(tmp_path / "kube")})
    with pytest.raises(KubeConfigError, match=f"^kubeconfig {tmp_path / 'kube'}: is a directory$"):
        resolve(explicit, environ=env, home=tmp_path)


def test_kubeconfig_list_merges_first_wins(tmp_path, sa):
    first = kubeconfig(tmp_path / "one", server="https://one", context="shared", cluster="c1", current="shared")
    second = kubeconfig(tmp_path / "two", server="https://two", context="shared", cluster="c2", current="other")
    # the second also brings a context of its own that the first lacks
    doc = yaml.safe_load(second.read_text())
    doc["contexts"].append({"name": "only-two", "context": {"cluster": "c2", "user": "a", "namespace": "two"}})
    second.write_text(yaml.safe_dump(doc))
    env = {**IN_POD, "KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), str(first), str(second)])}
    src = resolve(environ=env, home=tmp_path / "home", sa_dir=sa)
    assert src.kind == "kubeconfig" and src.files == [str(first), str(second)]
    assert src.context == "shared"  # current-context: the first file that sets it
    (shared,) = [c for c in src.config["contexts"] if c["name"] == "shared"]
    assert shared["context"]["cluster"] == "c1"  # same name in both: the first wins
    assert {c["name"] for c in src.config["clusters"]} == {"c1", "c2"}
    assert resolve(context="only-two", environ=env, home=tmp_path, sa_dir=sa).namespace == "two"


def test_relative_paths_are_relative_to_their_file(tmp_path):
    cfg = kubeconfig(tmp_path / "conf/dir/config", **{"certificate-authority": "ca.crt"})
    src = resolve(environ={"KUBECONFIG": str(cfg)}, home=tmp_path)
    assert src.config["clusters"][0]["cluster"]["certificate-authority"] == str(tmp_path / "conf/dir/ca.crt")


def test_kubeconfig_env_before_home(tmp_path):
    kubeconfig(tmp_path / "home/.kube/config", server="https://home", namespace="home")
    env_file = kubeconfig(tmp_path / "env", server="https://env", namespace="env")
    assert resolve(environ={"KUBECONFIG": str(env_file)}, home=tmp_path / "home").namespace == "env"
    assert resolve(environ={}, home=tmp_path / "home").namespace == "home"


def test_home_kubeconfig_before_in_cluster_as_client_go(tmp_path, sa):
    """client-go uses the service account only when the kubeconfig files give nothing."""
    kubeconfig(tmp_path / "home/.kube/config", namespace="home")
    assert resolve(environ=IN_POD, home=tmp_path / "home", sa_dir=sa).kind == "kubeconfig"
    src = resolve(environ=IN_POD, home=tmp_path / "empty", sa_dir=sa)
    assert (src.kind, src.namespace) == ("in-cluster", "initshift-system")
    # a KUBECONFIG that names only missing files is empty too
    src = resolve(environ={**IN_POD, "KUBECONFIG": str(tmp_path / "missing")}, home=tmp_path / "home", sa_dir=sa)
    assert src.kind == "in-cluster"
    assert resolve(environ={**IN_POD, "POD_NAMESPACE": "p"}, home=tmp_path, sa_dir=sa).namespace == "p"


async def test_in_cluster_configuration_uses_the_service_account(tmp_path, sa):
    src = resolve(environ=IN_POD, home=tmp_path, sa_dir=sa)
    cfg = await client_configuration(src, environ=IN_POD, sa_dir=sa)
    assert cfg.host == "https://10.0.0.1:443"
    assert cfg.api_key["BearerToken"].endswith("sa-token")


@pytest.mark.parametrize("env,sa_token,message", [
    ({}, False, "no kubeconfig found"),
    (IN_POD, False, "no service account token"),
])
def test_nothing_usable_is_one_clear_error(tmp_path, sa, env, sa_token, message):
    if not sa_token:
        (sa / "token").unlink()
    with pytest.raises(KubeConfigError, match=message):
        resolve(environ=env, home=tmp_path, sa_dir=sa)


def test_bad_kubeconfigs(tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match="not YAML"):
        resolve(str(bad), environ={}, home=tmp_path)
    cfg = kubeconfig(tmp_path / "nocurrent", current=None)
    with pytest.raises(KubeConfigError, match=r"no current-context \(pass --context; its contexts: 'a'\)$"):
        resolve(str(cfg), environ={}, home=tmp_path)
    with pytest.raises(KubeConfigError, match=r"context 'x' not found \(its contexts: 'a'\)$"):
        resolve(str(cfg), "x", environ={}, home=tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"user": "b"}, "context 'a': user 'b' not found"),
    ({"cluster": "b"}, "context 'a': cluster 'b' not found"),
    ({"server": "not a url"}, "server 'not a url' of cluster 'a' is not a URL"),
    ({"server": "https://a.example:port"}, "is not a URL"),
    ({"server": ""}, "cluster 'a' has no server"),
])
def test_a_context_whose_cluster_user_or_server_is_unusable_says_which(tmp_path, change, message):
    cfg = kubeconfig(tmp_path / "cfg")
    doc = yaml.safe_load(cfg.read_text())
    if "server" in change:
        doc["clusters"][0]["cluster"]["server"] = change["server"]
    else:
        doc["contexts"][0]["context"].update(change)
    cfg.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match=message):
        resolve(str(cfg), environ={}, home=tmp_path)


async def test_a_server_without_a_scheme_is_https_as_client_go_takes_it(tmp_path):
    source = resolve(str(kubeconfig(tmp_path / "cfg", server="a.example:6443")), environ={}, home=tmp_path)
    assert (await client_configuration(source)).host == "https://a.example:6443"


async def test_from_config_talks_to_the_api(tmp_path, monkeypatch):
    async with KubeDouble() as kube:
        cfg = kubeconfig(tmp_path / "a", server=kube.url, namespace="builds")
        monkeypatch.setenv("KUBECONFIG", str(cfg))
        async with await KubeApi.from_config() as api:
            assert api.namespace == "builds"
            assert (await api.list_pods("builds"))[0] == []
    with pytest.raises(KubeError, match="no such file"):
        await KubeApi.from_config(str(tmp_path / "nope"))


# --- the commands that connect: one line on stderr, no traceback, no library lines -------------

COMMANDS = {
    "status": ["status", "pod-1"],
    "logs": ["logs", "pod-1"],
    "watch": ["watch"],
    "certs inject": ["certs", "inject", "--ca-file", "{ca}"],
}


def run_cli(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webhook.cli", *argv], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", ""), **env}, timeout=60)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("situation", ["no-config", "pod-without-token", "missing-kubeconfig-list"])
def test_connecting_commands_fail_in_one_line(tmp_path, command, situation):
    from certs import pki

    ca = tmp_path / "ca.crt"
    ca.write_bytes(pki.create_ca(days=1).cert_pem)
    env = {"HOME": str(tmp_path / "home")}
    if situation == "pod-without-token":
        env.update(IN_POD)  # the token file is the real path, absent on this machine
        assert not Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()
    if situation == "missing-kubeconfig-list":
        env["KUBECONFIG"] = os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])
    proc = run_cli([a.format(ca=ca) for a in COMMANDS[command]], env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"initshift {command}: ") or lines[0].startswith("error: "), lines
    assert "Traceback" not in proc.stderr and "Config not found" not in proc.stderr
    want = {"pod-without-token": "no service account token", "no-config": "no kubeconfig found",
            "missing-kubeconfig-list": "KUBECONFIG names"}[situation]
    assert want in lines[0]


# --- kubeconfigs kubectl refuses, or reads otherwise than the library: one line each ------------

def _context_doc(server: str = "https://127.0.0.1:1") -> dict:
    """A kubeconfig of context `x` on cluster `c`, with user `u` to be filled in."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "users": [{"name": "u", "user": {"token": "t"}}]}


def _write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def _bad_kubeconfigs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """kubeconfig files kubectl does not load, with the line each gets (after the file's name)."""
    latin1 = tmp_path / "latin1"
    latin1.write_bytes(b"apiVersion: v1\nkind: Config\n# caf\xe9\nclusters: []\n")
    context_text, user_text, exec_text, namespace_list = (_context_doc() for _ in range(4))
    context_text["contexts"][0]["context"] = "oops"
    user_text["users"][0]["user"] = "oops"
    exec_text["users"][0]["user"] = {"exec": {"apiVersion": "v1", "command": "aws", "args": "token"}}
    namespace_list["contexts"][0]["context"]["namespace"] = ["a"]
    return {
        "not UTF-8": (latin1, ": not UTF-8 text (byte 0xe9 at offset 33)"),
        "context a string": (_write(tmp_path / "ctx", context_text), ": context 'x' is a string, not a mapping"),
        "user a string": (_write(tmp_path / "user", user_text), ": user 'u' is a string, not a mapping"),
        "exec args a string": (_write(tmp_path / "exec", exec_text),
                               ": user 'u': exec: args is a string, not a list"),
        "namespace a list": (_write(tmp_path / "ns", namespace_list), ": context 'x': namespace is a list, not a string"),
    }


@pytest.mark.parametrize("case", ["not UTF-8", "context a string", "user a string", "exec args a string",
                                  "namespace a list"])
def test_a_kubeconfig_kubectl_refuses_is_said_in_one_line(tmp_path, case):
    path, said = _bad_kubeconfigs(tmp_path)[case]
    with pytest.raises(KubeConfigError) as e:
        resolve(str(path), environ={}, home=tmp_path)
    assert str(e.value) == f"kubeconfig {path}{said}"


@pytest.mark.parametrize("command", [*COMMANDS, "check"])
def test_connecting_commands_say_a_bad_kubeconfig_in_one_line(tmp_path, command):
    from certs import pki

    ca = tmp_path / "ca.crt"
    ca.write_bytes(pki.create_ca(days=1).cert_pem)
    bad = _bad_kubeconfigs(tmp_path)
    for path, said in (bad["not UTF-8"], bad["user a string"]):  # every case: the test above
        proc = run_cli([a.format(ca=ca) for a in COMMANDS.get(command, [command])],
                       {"HOME": str(tmp_path), "KUBECONFIG": str(path)})
        assert (proc.returncode, proc.stderr) == (1, f"initshift {command}: kubeconfig {path}{said}\n"), proc


async def test_a_context_without_a_user_connects_anonymously_as_kubectl(tmp_path):
    """`kubectl config set-context x --cluster=c`: no user, so no client credentials (the
    library alone fails on it: "argument of type 'NoneType' is not iterable")."""
    doc = _context_doc()
    del doc["contexts"][0]["context"]["user"]
    source = resolve(str(_write(tmp_path / "cfg", doc)), environ={}, home=tmp_path)
    cfg = await client_configuration(source)
    assert (cfg.host, cfg.cert_file, cfg.key_file, cfg.api_key) == ("https://127.0.0.1:1", None, None, {})
    doc["contexts"][0]["context"]["user"] = "u"
    doc["users"] = [{"name": "u"}]  # a user entry without a body is as anonymous
    cfg = await client_configuration(resolve(str(_write(tmp_path / "cfg", doc)), environ={}, home=tmp_path))
    assert (cfg.host, cfg.cert_file, cfg.api_key) == ("https://127.0.0.1:1", None, {})


@pytest.mark.parametrize("user, said", [
    ({"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "nonexistent-aws"}},
     "exec plugin: executable nonexistent-aws not found"),
    ({"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "nonexistent-aws",
               "installHint": "Install the AWS CLI:\n  brew install awscli\n"}},
     "exec plugin: executable nonexistent-aws not found; Install the AWS CLI: brew install awscli"),
    ({"tokenFile": "/nonexistent/token"}, "tokenFile /nonexistent/token: no such file or directory"),
])
def test_a_missing_exec_plugin_or_token_file_is_said_as_kubectl_says_it(tmp_path, user, said):
    doc = _context_doc()
    doc["users"][0]["user"] = user
    path = _write(tmp_path / "cfg", doc)
    proc = run_cli(["status", "pod-1"], {"HOME": str(tmp_path), "KUBECONFIG": str(path)})
    assert (proc.returncode, proc.stderr) == (1, f"initshift status: kubeconfig {path}, context x: {said}\n"), proc
