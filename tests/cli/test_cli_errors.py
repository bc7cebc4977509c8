"""Every subcommand's bad input, as a user meets it: a real process, exactly one stderr line,
the documented exit code (0 done, 1 a file, the cluster or the server failed, 2 usage or bad
input), never a traceback. Long-running commands write that line as JSON once their
logging is on (`serve`, `dev-server`); before it, and in every other command, it reads
`initshift COMMAND: ...`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.cli._podio import MAX_INPUT_BYTES

ROOT = Path(__file__).resolve().parents[2]

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
              "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}


def nested(depth: int) -> bytes:
    """A valid Pod whose container holds a field `depth` objects deep, as JSON (written
    out: json.dumps itself recurses)."""
    field = '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)
    return b'{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": ' \
           b'[{"name": "c", "x": %s}]}}' % field.encode()


# Doubles ten times a line, nine lines: a billion values from 200 bytes.
ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"b{i}: &b{i} [{','.join(['*' + (f'b{i - 1}' if i else 'a')] * 10)}]\n" for i in range(9))

# name -> (bytes, words of the one-line message); a directory and a missing path are below.
FILES: dict[str, tuple[bytes, str]] = {
    "latin1.yaml": ("kind: Pod\nmetadata: {name: caf\xe9}\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 30)"),
    "binary.bin": (b"\x7fELF\x02\x01\x01\x00\x00\x00", "a binary file"),
    "huge.yaml": (b"#" * (MAX_INPUT_BYTES + 1), "larger than 8 MiB"),
    "broken.yaml": (b"kind: Pod\nspec:\n  containers: [\n    - name: a\n  x: y\n", "not YAML or JSON: line 4, column 5: expected the node content"),
    "broken.json": (b'{"kind": "Pod", "spec": {"containers": [}}', "not YAML or JSON: line 1, column 41"),
    "service.yaml": (b"apiVersion: v1\nkind: Service\nmetadata: {name: s}\n", "got a Service"),
    "list.yaml": (b"- a\n- b\n", "got a list"),
    "empty.yaml": (b"\n---\n", "empty"),
    "two-services.yaml": (yaml.safe_dump_all([SERVICE, SERVICE]).encode(), "2 objects (a Service, a Service)"),
    "no-spec.yaml": (b"kind: Pod\nmetadata: {name: p}\n", "the Pod has no spec"),
    "review-of-node.json": (json.dumps({"kind": "AdmissionReview", "request": {"object": {"kind": "Node"}}}).encode(),
                            "holds a Node, not a Pod"),
    # as deep as the server's 400 for the same bytes: the reader stops, no RecursionError
    "nested-500.json": (b"[" * 500, "nests deeper than 106 levels (line 1, column 107); no Kubernetes object does"),
    "pod-field-950-deep.json": (nested(950), "nests deeper than 106 levels (line 1, column"),
    # the server's own rule on the pod (webhook.rewrite.MAX_DEPTH): 101 levels, the 100 allowed
    "pod-101-deep.json": (nested(97), "the pod nests deeper than 100 levels"),
    "alias-bomb.yaml": (ALIAS_BOMB.encode(), "its aliases expand to more than 8388608 values (line 7, column"),
    "alias-loop.yaml": (b"kind: Pod\nspec: &s {containers: [*s]}\n",
                        "the alias *s is inside the node it names (line 2, column 24)"),
    # what JSON cannot hold, refused where it is (it failed as JSON was written: a traceback)
    "binary-tag.yaml": (b"kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, x: !!binary aGk=}]}\n",
                        "!!binary has no JSON form (line 3, column 34)"),
    "infinity.yaml": (b"kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, x: .inf}]}\n",
                      ".inf is not a number JSON can hold (line 3, column 34)"),
    # kubectl refuses it; PyYAML kept the last value, the first lost without a word
    "duplicate-key.yaml": (b"kind: Pod\nspec:\n  containers: [{name: a}]\n  containers: [{name: b}]\n",
                           "the key 'containers' is given again, first at line 3 (line 4, column 3)"),
    "list-of-scalars.yaml": (b"kind: List\nitems: [null, true]\n", "2 objects (a null, a boolean)"),
}


def run(argv: list[str], env: dict[str, str] | None = None, stdin: bytes | None = None, *,
        close_stdin: bool = False, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess:
    """The command in a process of its own; `close_stdin`: started with no stdin at all (`<&-`)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("INITSHIFT_") and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run([sys.executable, "-m", "webhook.cli", *argv], input=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, cwd=ROOT, env={**base, **(env or {})}, timeout=120,
                          preexec_fn=(lambda: os.close(0)) if close_stdin else None)


def one_line(proc: subprocess.CompletedProcess, code: int, words: str, prog: str, *, json_line: bool = False) -> None:
    """One error line: the only stderr line, or (`json_line`) the only `error` among JSON lines."""
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "[Errno" not in err and "_ssl.c" not in err, err
    lines = err.splitlines()
    if json_line:
        records = [json.loads(line) for line in lines]
        lines = [r["msg"] for r in records if r["level"] == "error"]
    assert proc.returncode == code and len(lines) == 1, (proc.returncode, err)
    line = lines[0]
    assert line.startswith(prog), line
    assert words in line, line


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    for name, (data, _) in FILES.items():
        (d / name).write_bytes(data)
    (d / "deployment.yaml").write_text(yaml.safe_dump(DEPLOYMENT))
    (d / "dir").mkdir()
    (d / "pod.yaml").write_text(yaml.safe_dump(POD))
    (d / "kubeconfig-broken").write_text("clusters: [\n")
    (d / "empty.crt").write_bytes(b"")
    from certs import pki, store

    ca = pki.create_ca()
    store.write_dir(d / "ca", ca, pki.create_serving(ca, ["initshift"]))
    (d / "ca-key-only").mkdir()
    (d / "ca-key-only" / "ca.key").write_bytes(ca.key_pem)
    return d


@pytest.mark.parametrize("command", ["mutate", "review"])
@pytest.mark.parametrize("name", [*FILES, "dir", "missing.yaml"])
def test_pod_readers_reject_bad_files_in_one_line(files: Path, command: str, name: str) -> None:
    words = {"dir": f"cannot read {files / 'dir'}: is a directory",
             "missing.yaml": f"cannot read {files / 'missing.yaml'}: no such file or directory"}.get(name) \
        or FILES[name][1]
    path = files / name
    proc = run([command, str(path)])
    one_line(proc, 2, words, f"initshift {command}")
    assert str(path) in proc.stderr.decode("utf-8", "replace")


@pytest.mark.parametrize("command", ["mutate", "review"])
@pytest.mark.parametrize("name", ["latin1.yaml", "binary.bin", "broken.yaml"])
def test_stdin_is_read_the_same_way(files: Path, command: str, name: str) -> None:
    data, words = FILES[name]
    proc = run([command, "-"], stdin=data)
    one_line(proc, 2, words, f"initshift {command}")
    assert "<stdin>" in proc.stderr.decode()


@pytest.mark.parametrize("command", ["mutate", "review"])
def test_a_closed_stdin_is_said(command: str) -> None:
    """`initshift mutate - <&-`: Python has no stdin stream at all (it was a traceback)."""
    one_line(run([command, "-"], close_stdin=True), 2, "cannot read <stdin>: standard input is closed",
             f"initshift {command}")


def test_a_large_manifest_is_read_with_libyaml() -> None:
    """`mutate` on a manifest of many pods: PyYAML's pure-Python reader took 23 s for 3 MB.
    Where PyYAML has libyaml, the reader scans with it under the same rules, and gives the
    same objects (the speed itself is a figure, not an assertion)."""
    from tests.support.fixtures import pods
    from webhook.cli import _podio

    assert _podio._CSafeLoader is not None, "PyYAML here is built with libyaml (the wheels are)"
    text = yaml.safe_dump_all([pods.catalogue()["job-istio"], pods.catalogue()["kpack-istio"]] * 20)
    fast = list(yaml.load_all(text, Loader=_podio._FastLoader))  # no fallback: it reads them itself
    assert fast == list(yaml.load_all(text, Loader=_podio._Loader))
    assert [o.pod for o in _podio.parse_manifests(text)] == fast  # type: ignore[union-attr]


def test_dates_stay_the_text_they_are_written_as(tmp_path: Path) -> None:
    """An unquoted date is a string to kubectl's reader; to PyYAML a date JSON cannot hold
    (`-o json` and `review` failed with a traceback)."""
    (tmp_path / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: "
                                       "{built: 2024-05-01, at: 2024-05-01T10:00:00Z}\nspec: {containers: [{name: c}]}\n")
    for argv in (["mutate", "-o", "json"], ["review"]):
        proc = run([*argv, str(tmp_path / "pod.yaml")])
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        pod = out["request"]["object"] if argv == ["review"] else out
        assert pod["metadata"]["annotations"] == {"built": "2024-05-01", "at": "2024-05-01T10:00:00Z"}


def test_the_pod_may_nest_as_deep_as_the_server_allows(tmp_path: Path) -> None:
    """100 levels below the pod, in a Pod, a CronJob's template (4 levels deeper) or that
    CronJob as a List's item (6): read."""
    from webhook.rewrite import MAX_DEPTH, depth_problem

    pod = json.loads(nested(96))
    assert depth_problem(pod) is None
    assert depth_problem(json.loads(nested(97))) == f"the pod nests deeper than {MAX_DEPTH} levels"
    cronjob = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
               "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": pod}}}}
    listed = {"apiVersion": "v1", "kind": "List", "items": [cronjob]}
    for name, doc in (("pod.json", pod), ("cronjob.json", cronjob), ("list.json", listed)):
        (tmp_path / name).write_text(json.dumps(doc))
        proc = run(["mutate", str(tmp_path / name), "-o", "json"])
        assert proc.returncode == 0, proc.stderr


def test_yaml_anchors_and_aliases_within_bounds_are_read(tmp_path: Path) -> None:
    """A shared env block (an anchor, used twice): read as kubectl reads it."""
    (tmp_path / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  restartPolicy: Never\n"
        "  initContainers:\n  - name: a\n    image: busybox\n    command: [true]\n"
        "    env: &env [{name: A, value: '1'}]\n"
        "  containers:\n  - name: b\n    image: busybox\n    command: [true]\n    env: *env\n")
    proc = run(["mutate", str(tmp_path / "pod.yaml"), "-o", "json"])
    assert proc.returncode == 0, proc.stderr
    pod = json.loads(proc.stdout)
    assert {c["name"]: c.get("env") for c in pod["spec"]["containers"]}["b"] == [{"name": "A", "value": "1"}]


@pytest.mark.parametrize("command,expected", [
    ("review", "expected a Pod or an AdmissionReview of a Pod"),
    ("mutate", "expected a Pod, an AdmissionReview of a Pod or a workload (Deployment, ReplicaSet, StatefulSet, "
               "DaemonSet, Job, CronJob, ReplicationController)"),
])
def test_what_each_reader_expects_is_named_in_plain_words(files: Path, command: str, expected: str) -> None:
    """`review` names only what it reads (no workload); of several objects it takes exactly
    one, `mutate` at least one."""
    one_line(run([command, str(files / "empty.yaml")]), 2, f"empty; {expected}", f"initshift {command}")
    how_many = "exactly" if command == "review" else "at least"
    one_line(run([command, str(files / "two-services.yaml")]), 2,
             f"2 objects (a Service, a Service); expected {how_many} one of them to be "
             f"{expected.replace('expected ', '')}", f"initshift {command}")


def test_review_takes_one_pod_of_several_objects(files: Path) -> None:
    (files / "two-pods.yaml").write_text(yaml.safe_dump_all([POD, POD]))
    one_line(run(["review", str(files / "two-pods.yaml")]), 2,
             "2 objects (a Pod, a Pod); expected exactly one of them to be a Pod or an AdmissionReview of a Pod",
             "initshift review")


def test_a_workload_is_mutate_input_and_named_by_review(files: Path) -> None:
    assert run(["mutate", str(files / "deployment.yaml")]).returncode == 0
    one_line(run(["review", str(files / "deployment.yaml")]), 2,
             "got a Deployment; `initshift mutate` reads a workload's pod template", "initshift review")


@pytest.mark.parametrize("argv", [["mutate", "examples/kpack-build-istio.yaml", "-o", "json"],
                                  ["review", "{d}/pod.yaml"], ["--help"], ["mutate", "--help"]])
def test_a_reader_that_stopped_ends_the_command_quietly(files: Path, argv: list[str]) -> None:
    """`... | head -1`: standard output's reader is gone before the command writes. Exit 141
    (128 + SIGPIPE), as kubectl and git end, and no word of it (it was a traceback)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = run([a.format(d=files) for a in argv], stdout=write)
    finally:
        os.close(write)
    err = proc.stderr.decode()
    assert proc.returncode == 141 and all(line.startswith("warning: ") for line in err.splitlines()), err


@pytest.mark.parametrize("argv", [["mutate", "examples/kpack-build-istio.yaml"], ["review", "{d}/pod.yaml"],
                                  ["--version"]])
def test_an_output_that_cannot_be_written_is_one_line(files: Path, argv: list[str]) -> None:
    """`> /dev/full`: one line and exit 1, not a traceback."""
    with open("/dev/full", "wb") as full:
        proc = run([a.format(d=files) for a in argv], stdout=full)
    prog = "initshift" if argv[0].startswith("-") else f"initshift {argv[0]}"
    one_line(proc, 1, "cannot write the output: no space left on device", prog)


def test_review_cannot_write_its_output(files: Path) -> None:
    one_line(run(["review", str(files / "pod.yaml"), "--out", str(files / "dir" / "no" / "out.json")]), 1,
             "cannot write", "initshift review")


# command -> [(argv, env, exit code, words, the line is JSON)]; {d} is the files fixture.
TABLE: dict[str, list[tuple[list[str], dict[str, str], int, str, bool]]] = {
    "initshift": [
        ([], {}, 2, "missing command (usage: initshift", False),
        (["frobnicate"], {}, 2, "unknown command 'frobnicate'", False),
        (["help", "frobnicate"], {}, 2, "unknown command 'frobnicate'", False),
    ],
    "mutate": [
        (["mutate"], {}, 2, "the following arguments are required: file", False),
        (["mutate", "{d}/pod.yaml", "-o", "xml"], {}, 2, "invalid choice: 'xml'", False),
        (["mutate", "{d}/pod.yaml"], {"INITSHIFT_MODE": "sometimes"}, 2, "INITSHIFT_MODE", False),
        # `"$FILE"` with FILE unset: it was "cannot read : no such file or directory"
        (["mutate", ""], {}, 2, "argument file: an empty path", False),
        (["mutate", "{d}/pod.yaml", "--quotas", ""], {}, 2, "argument --quotas: an empty path", False),
        # --namespace is a name everywhere else: a name given here is said to be one (it was "cannot read builds")
        (["mutate", "{d}/pod.yaml", "--namespace", "builds"], {}, 2, "--namespace takes the Namespace's manifest, "
         "not its name: `kubectl get namespace builds -o yaml > ns.yaml`, then --namespace ns.yaml", False),
        (["mutate", "{d}/pod.yaml", "--namespace", "{d}/missing.yaml"], {}, 2,
         "cannot read {d}/missing.yaml: no such file or directory", False),
    ],
    "review": [
        (["review", "--frob", "{d}/pod.yaml"], {}, 2, "unrecognized arguments: --frob", False),
        (["review", "{d}/pod.yaml", "--out", ""], {}, 2, "argument --out: an empty path", False),
        # -o is a format, as mutate's and kubectl's: a file name given to it is refused, never written
        (["review", "{d}/pod.yaml", "-o", "review.json"], {}, 2,
         "argument -o/--output: expected a format (json, yaml), got 'review.json'; --out FILE writes to a file",
         False),
        (["review", "{d}/pod.yaml", "-n", "Builds_1"], {}, 2,
         "argument -n/--namespace: expected a Kubernetes name (RFC 1123 label", False),
        (["review", "{d}/pod.yaml", "-n", ""], {}, 2, "argument -n/--namespace: expected a Kubernetes name", False),
        # as kubectl refuses `-n` against an object that names another namespace
        (["review", "examples/pod-kpack.yaml", "-n", "other"], {}, 2,
         'the namespace from the provided object "builds" does not match the namespace "other": pass -n builds',
         False),
    ],
    "status": [
        (["status", "p", "-A"], {}, 2, "-A is for the list: leave out POD", False),
        (["status"], {}, 1, "no kubeconfig found", False),  # the list: it needs the cluster
        (["status", "-A", "--kubeconfig", "{d}/missing"], {}, 1, "{d}/missing: no such file", False),
        (["status", "p", "--kubeconfig", "{d}/missing"], {}, 1, "{d}/missing: no such file", False),
        # an empty --kubeconfig ("$KC" unset) is refused, not skipped for $KUBECONFIG and blamed on it
        (["status", "p", "--kubeconfig", ""], {"KUBECONFIG": "{d}/missing"}, 2, "argument --kubeconfig: an empty path",
         False),
        (["status", "p"], {"KUBECONFIG": "{d}/missing"}, 1, "KUBECONFIG names {d}/missing, which does not exist",
         False),
        (["status", "p", "--kubeconfig", "{d}/kubeconfig-broken"], {}, 1, "not YAML", False),
        (["status", "p", "-o", "xml"], {}, 2, "invalid choice: 'xml'", False),
    ],
    "logs": [
        (["logs"], {}, 2, "the following arguments are required: POD", False),
        (["logs", "p", "--context", "nowhere", "--kubeconfig", "{d}/kubeconfig-broken"], {}, 1, "not YAML", False),
        (["logs", "p"], {"KUBECONFIG": "{d}/missing"}, 1, "KUBECONFIG names {d}/missing", False),
    ],
    "check": [
        (["check", "--frob"], {}, 2, "unrecognized arguments: --frob", False),
        (["check", "--kubeconfig", "{d}/missing"], {}, 1, "{d}/missing: no such file", False),
        (["check", "--kubeconfig", ""], {"KUBECONFIG": "{d}/missing"}, 2, "argument --kubeconfig: an empty path", False),
        (["check"], {"KUBECONFIG": "{d}/missing"}, 1, "KUBECONFIG names {d}/missing", False),
        (["check", "-o", "json"], {"KUBECONFIG": "{d}/missing"}, 1, "KUBECONFIG names {d}/missing", False),
        # arguments are checked before anything connects
        (["check", "--service-url", "127.0.0.1:8443"], {"KUBECONFIG": "{d}/missing"}, 2,
         "argument --service-url: expected https://HOST[:PORT] (e.g. https://127.0.0.1:8443), got '127.0.0.1:8443'",
         False),
        (["check", "--service-url", "https://127.0.0.1:99999"], {}, 2, "argument --service-url: expected https://",
         False),
        (["check", "--timeout", "-5"], {}, 2, "argument --timeout: must be a positive number of seconds", False),
        (["check", "--smoke", "Builds_1"], {}, 2, "argument --smoke: expected a Kubernetes name (RFC 1123 label", False),
        # what only --smoke reads is refused without it, not ignored (checked before anything connects)
        (["check", "--keep"], {"KUBECONFIG": "{d}/missing"}, 2, "--keep needs --smoke NAMESPACE", False),
        (["check", "--timeout", "5", "--image", "x", "--net-image", "y", "--net-url", "https://z"],
         {"KUBECONFIG": "{d}/missing"}, 2, "--timeout, --image, --net-image, --net-url need --smoke NAMESPACE", False),
        (["check", "--smoke", "builds", "--image", ""], {}, 2, "argument --image: must not be empty", False),
        # an empty name would read the whole collection
        (["check", "--webhook-config", ""], {"KUBECONFIG": "{d}/missing"}, 2,
         "argument --webhook-config: expected a Kubernetes name (RFC 1123 subdomain", False),
        (["check", "--lease", "Bad_Lease"], {}, 2, "argument --lease: expected a Kubernetes name", False),
    ],
    "certs": [
        (["certs"], {}, 2, "the following arguments are required: action", False),
        (["certs", "create", "--days", "0", "--out", "{d}/out"], {}, 2, "argument --days: must be 1 to 36500 (days)",
         False),
        (["certs", "create", "--ca-days", "999999999", "--out", "{d}/out"], {}, 2,
         "argument --ca-days: must be 1 to 36500 (days)", False),
        (["certs", "create", "--out", "{d}/pod.yaml"], {}, 2, "--out {d}/pod.yaml: not a directory", False),
        # an empty path is not the current directory (the CA and its key were written there)
        (["certs", "create", "--out", ""], {}, 2, "argument --out: an empty path", False),
        (["certs", "inject", "--ca-file", ""], {}, 2, "argument --ca-file: an empty path", False),
        (["certs", "inject", "--ca-file", "{d}/ca/ca.crt", "--kubeconfig", ""], {}, 2,
         "argument --kubeconfig: an empty path", False),
        (["certs", "inject", "--ca-file", "{d}/ca/ca.crt", "--webhook-config", ""], {"KUBECONFIG": "{d}/missing"}, 2,
         "argument --webhook-config: expected a Kubernetes name (RFC 1123 subdomain", False),
        # checked before the cluster is contacted, and before any file is written
        (["certs", "create", "--out", "{d}/not-written", "--secret", "Bad_Name"], {"KUBECONFIG": "{d}/missing"}, 2,
         "argument --secret: expected a Kubernetes name (RFC 1123 subdomain: lower-case letters, digits and '-', "
         "and dots, at most 253 characters), got 'Bad_Name'", False),
        # no configuration for the Secret: nothing is written either (tests/certs checks the files)
        (["certs", "create", "--out", "{d}/not-written", "--secret", "tls"], {"KUBECONFIG": "{d}/missing"}, 1,
         "KUBECONFIG names {d}/missing, which does not exist", False),
        (["certs", "create", "--ca-cert", "{d}/pod.yaml", "--out", "{d}/out"], {}, 2,
         "--ca-cert and --ca-key go together", False),
        (["certs", "inject", "--ca-file", "{d}/missing"], {}, 2,
         "cannot read CA file {d}/missing: no such file or directory", False),
        (["certs", "inject", "--ca-file", "{d}/binary.bin"], {}, 2, "not a PEM certificate bundle", False),
        (["certs", "create", "--out", "{d}/out"], {"INITSHIFT_PORT": "https"}, 2, "INITSHIFT_PORT", False),
        (["certs", "create", "--out", "{d}/out", "--ip", "999.1.1.1"], {}, 2,
         "argument --ip: not an IP address: '999.1.1.1'", False),
        (["certs", "create", "--out", "{d}/out", "--dns", "bad name"], {}, 2, "argument --dns: not a DNS name",
         False),
        (["certs", "create", "--out", "{d}/out", "--ca-cert", "{d}/ca/tls.crt", "--ca-key", "{d}/ca/tls.key"], {}, 2,
         "the certificate CN=initshift is not a CA certificate (basicConstraints CA:FALSE)", False),
        (["certs", "create", "--out", "{d}/out", "--ca-cert", "{d}/ca/ca.crt", "--ca-key", "{d}/ca/tls.key"], {}, 2,
         "the key does not belong to the certificate CN=initshift-ca", False),
        (["certs", "create", "--out", "{d}/ca-key-only"], {}, 2,
         "{d}/ca-key-only holds a CA key that cannot be kept (ca.crt is missing): --force replaces the CA", False),
    ],
    "serve": [
        (["serve", "--frob"], {}, 2, "unrecognized arguments: --frob", False),
        (["serve"], {"INITSHIFT_PORT": "https"}, 2, "INITSHIFT_PORT", False),
        (["serve", "--port", "0"], {"INITSHIFT_NATIVE_SIDECARS": "false",
                                    "INITSHIFT_TLS_CERT": "{d}/missing.crt", "INITSHIFT_TLS_KEY": "{d}/missing.key"},
         1, "TLS certificate {d}/missing.crt (INITSHIFT_TLS_CERT): no such file", True),
        (["serve", "--port", "0", "--kubeconfig", "{d}/missing"],
         {"INITSHIFT_SELF_MANAGED_CERTS": "true"}, 1, "{d}/missing: no such file", True),
        (["serve", "--port", "99999"], {}, 2, "argument --port: expected a port number (0 to 65535), got 99999", False),
        (["serve", "--port", "-1"], {}, 2, "argument --port: expected a port number (0 to 65535), got -1", False),
        (["serve", "--port", "https"], {}, 2, "argument --port: expected a port number (0 to 65535), got 'https'",
         False),
        (["serve"], {"INITSHIFT_PORT": "99999"}, 2, "INITSHIFT_PORT: expected a port number (0 to 65535), got 99999",
         False),
        (["serve"], {"INITSHIFT_PORT": "abc"}, 2, "INITSHIFT_PORT: expected a port number (0 to 65535), got 'abc'",
         False),
        (["serve"], {"INITSHIFT_METRICS_PORT": "99999"}, 2, "INITSHIFT_METRICS_PORT: expected a port number", False),
        (["serve"], {"INITSHIFT_MAX_BODY_BYTES": "lots"}, 2, "INITSHIFT_MAX_BODY_BYTES: expected a whole number, "
                                                              "got 'lots'", False),
        (["serve", "--port", "0"], {"INITSHIFT_NATIVE_SIDECARS": "false", "INITSHIFT_TLS_CERT": "{d}/dir",
                                    "INITSHIFT_TLS_KEY": "{d}/dir"},
         1, "TLS certificate {d}/dir (INITSHIFT_TLS_CERT): is a directory, not a PEM file", True),
        (["serve", "--port", "0"], {"INITSHIFT_NATIVE_SIDECARS": "false", "INITSHIFT_TLS_CERT": "{d}/empty.crt",
                                    "INITSHIFT_TLS_KEY": "{d}/empty.crt"},
         1, "TLS certificate {d}/empty.crt (INITSHIFT_TLS_CERT): the file is empty", True),
        (["serve", "--port", "0"], {"INITSHIFT_NATIVE_SIDECARS": "false", "INITSHIFT_TLS_CERT": "{d}/binary.bin",
                                    "INITSHIFT_TLS_KEY": "{d}/binary.bin"},
         1, "cannot load TLS certificate {d}/binary.bin with key {d}/binary.bin (INITSHIFT_TLS_CERT, INITSHIFT_TLS_KEY): {d}/binary.bin holds no PEM "
            "certificate", True),
    ],
    "watch": [
        (["watch", "--frob"], {}, 2, "unrecognized arguments: --frob", False),
        (["watch", "--kubeconfig", "{d}/missing"], {}, 1, "{d}/missing: no such file", False),
        (["watch"], {"KUBECONFIG": "{d}/missing"}, 1, "KUBECONFIG names {d}/missing", False),
        (["watch", "--context", "nowhere"], {"KUBECONFIG": "{d}/kubeconfig-broken"}, 1, "not YAML", False),
    ],
    "dev-server": [
        (["dev-server", "--frob"], {}, 2, "unrecognized arguments: --frob", False),
        (["dev-server"], {"INITSHIFT_METRICS_PORT": "metrics"}, 2, "INITSHIFT_METRICS_PORT", False),
        (["dev-server", "--dir", "{d}/pod.yaml"], {}, 1, "certificates in {d}/pod.yaml", True),
        (["dev-server", "--dir", ""], {}, 2, "argument --dir: an empty path", False),
    ],
}


@pytest.mark.parametrize("command,case", [(c, i) for c, cases in TABLE.items() for i in range(len(cases))],
                         ids=lambda v: str(v))
def test_every_subcommand_fails_in_one_line(files: Path, tmp_path: Path, command: str, case: int) -> None:
    argv, env, code, words, json_line = TABLE[command][case]
    d = str(files)
    env = {"HOME": str(tmp_path), **{k: v.format(d=d) for k, v in env.items()}}
    prog = "initshift" if command == "initshift" else f"initshift {command}"
    one_line(run([a.format(d=d) for a in argv], env), code, words.format(d=d), prog, json_line=json_line)


def test_a_busy_port_names_its_setting(files: Path, tmp_path: Path) -> None:
    from webhook.admission import bind

    busy = bind("127.0.0.1")
    try:
        port = str(busy.getsockname()[1])
        base = {"HOME": str(tmp_path), "INITSHIFT_NATIVE_SIDECARS": "false", "INITSHIFT_HOST": "127.0.0.1",
                "INITSHIFT_TLS_CERT": str(tmp_path / "tls.crt"), "INITSHIFT_TLS_KEY": str(tmp_path / "tls.key")}
        from tests.support.https_helpers import make_certs

        make_certs(tmp_path)
        for env, setting in (({"INITSHIFT_METRICS_PORT": port, "INITSHIFT_PORT": "0"}, "INITSHIFT_METRICS_PORT"),
                             ({"INITSHIFT_PORT": port, "INITSHIFT_METRICS_PORT": "0"}, "INITSHIFT_PORT or --port")):
            one_line(run(["serve"], {**base, **env}), 1, f"cannot listen on 127.0.0.1:{port} ({setting}): address "
                     "already in use", "initshift serve", json_line=True)
    finally:
        busy.close()
