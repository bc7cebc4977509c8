"""The waiter's command line: what the webhook writes (webhook/rewrite/_command.py) is what
the waiter parses (waiter/flags.py, waiter/startafter.py), and the webhook reads back the
argv it wrote. Property-based: any names, paths, URLs and argv words round-trip."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st

from waiter import argvmap, flags as waiter_flags, protocol as p, startafter
from tests.support.expansion import expand_all
from webhook.rewrite._command import gate_of, read_argv, run_command, start_after_command, waiter_command
from webhook.rewrite._errors import RewriteError

# Words the kubelet may pass: anything but NUL; flag-like words and `--` included on purpose.
words = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
                 | st.sampled_from(["--", "--post", "-x", "--name=x", "$(HOME)"]), max_size=6)
nonempty = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=12)
ports = st.integers(1, 65535)
urls = st.builds(lambda port, path: f"http://127.0.0.1:{port}/{path}", ports, st.from_regex(r"[a-z0-9/]{0,8}", fullmatch=True))
HERE = argvmap.platform_keys()[-1]  # this machine's "os/arch": the entry the waiter picks here
argv_maps = st.none() | st.builds(
    lambda mine, others: {**others, HERE: mine}, st.lists(nonempty, min_size=1, max_size=3),
    st.dictionaries(st.sampled_from(["windows/amd64", "linux/s390x", "linux/riscv64"]),
                    st.lists(nonempty, min_size=1, max_size=3), max_size=2))


def _container(args: list[str]) -> dict:
    return {"name": "c", "command": [p.WAITER_PATH], "args": args}


# A container's name is an RFC 1123 label: it never starts with "-" (so never "--").
names = nonempty.filter(lambda n: not n.startswith("-"))


@settings(max_examples=200, deadline=None)
@given(name=names, argv=words, waits=st.booleans(), gate=st.booleans(),
       probes=st.lists(urls, max_size=3), timeout=st.integers(0, 10**6), retry=st.booleans(),
       skip_fails=st.booleans(), quits=st.lists(urls, max_size=2), mains=st.integers(0, 3), argv_map=argv_maps)
def test_run_command_round_trips_through_the_waiters_parser(tmp_path_factory: pytest.TempPathFactory, name: str,
                                                             argv: list[str], waits: bool, gate: bool,
                                                             probes: list[str], timeout: int, retry: bool,
                                                             skip_fails: bool, quits: list[str], mains: int,
                                                             argv_map: dict | None) -> None:
    root = tmp_path_factory.mktemp("run")
    post, wait = str(root / "self" / "done"), str(root / "before" / "done") if waits else None
    for d in ("self", "before", "mains"):
        (root / d).mkdir()
    if "/" in name or name.startswith("."):
        mains = 0  # a container name is neither (the mains' records are files named after them)
    mains_dir = str(root / "mains") if mains else None
    args = run_command(name=name, post=post, argv=argv, wait=wait, ready_file="/ready" if gate else None,
                       probes=probes, timeout=timeout, retry=retry, skip_fails=skip_fails, quits=quits,
                       mains_dir=mains_dir, mains=mains, argv_map=argv_map)
    assert args[0] == p.CMD_RUN and waiter_command(_container(args)) == p.CMD_RUN
    if argv or argv_map:
        opts = waiter_flags.parse_run(args[1:])
        assert (opts.name, opts.post, opts.wait, opts.ready_file) == (name, post, wait or "", "/ready" if gate else "")
        assert [e.url for e in opts.probes] == probes and [e.url for e in opts.quit] == quits
        assert opts.timeout == (float(timeout) if timeout else None) and opts.retry is retry
        assert opts.skip_fails is skip_fails
        assert (opts.mains_dir, opts.mains) == (mains_dir or "", mains)
        assert opts.termination_log == p.DEFAULT_TERMINATION_LOG  # a path the pod sets is its program's
        expected = [*(argv_map[HERE] if argv_map else []), *argv]
        assert opts.argv == [os.fsencode(a) for a in expected]
    assert read_argv(_container(args)) == (argv, argv_map)


# A container's name is an RFC 1123 label: it never starts with "-" (so never "--").
names = nonempty.filter(lambda n: not n.startswith("-"))


@settings(max_examples=200, deadline=None)
@given(name=names, argv=words, marker=st.booleans(),
       conditions=st.lists(st.tuples(st.sampled_from([p.FLAG_PROBE, p.FLAG_AFTER_MARKER, p.FLAG_AFTER_READY_FILE]),
                                     st.integers(1, 65535)), max_size=4),
       max_wait=st.integers(0, 3600), argv_map=argv_maps)
def test_start_after_command_round_trips_through_the_waiters_parser(name: str, argv: list[str], marker: bool,
                                                                     conditions: list[tuple[str, int]],
                                                                     max_wait: int, argv_map: dict | None) -> None:
    pairs = [(flag, f"tcp://127.0.0.1:{n}" if flag == p.FLAG_PROBE else f"/initshift/x/{n}") for flag, n in conditions]
    args = start_after_command(name=name, argv=argv, marker=f"/initshift/markers/{name}" if marker else None,
                               conditions=pairs, max_wait=max_wait, argv_map=argv_map)
    assert waiter_command(_container(args)) == p.CMD_START_AFTER
    if argv or argv_map:
        opts = startafter.parse(args[1:])
        assert opts.name == name and opts.marker == (f"/initshift/markers/{name}" if marker else "")
        assert len(opts.conditions) == len(pairs)
        assert opts.max_wait == (float(max_wait) if pairs and max_wait else None)
        assert opts.argv == [os.fsencode(a) for a in [*(argv_map[HERE] if argv_map else []), *argv]]
    assert read_argv(_container(args)) == (argv, argv_map)


# What a pod's fields may hold that the kubelet would expand once written into `args`.
dollars = st.from_regex(r"[a-z/]{0,3}(\$\(HOME\)|\$\$|\$\(|\$|\$x|\$\(NOPE\))[a-z/]{0,3}", fullmatch=True)
KUBELET_ENV = {"HOME": "/root", "NOPE": "defined"}  # the container's variables, as the kubelet sees them


@settings(max_examples=100, deadline=None)
@given(path=dollars, quit=dollars)
def test_text_from_the_pod_reaches_the_waiter_as_written(tmp_path_factory: pytest.TempPathFactory, path: str,
                                                         quit: str) -> None:
    """A probe's path and a quit URL are fields the kubelet never expands; in `args` it
    would: they are written so its expansion gives them back."""
    probe, quit_url = f"http://127.0.0.1:15021/{path}", f"http://127.0.0.1:15020/{quit}"
    post = str(tmp_path_factory.mktemp("run") / "done")
    args = run_command(name="s", post=post, argv=["x"], ready_file="/ready", probes=[probe], quits=[quit_url])
    opts = waiter_flags.parse_run(expand_all(args, KUBELET_ENV)[1:])
    assert [e.url for e in opts.probes] == [probe] and [e.url for e in opts.quit] == [quit_url]
    assert gate_of(_container(args)) == ("/ready", (probe,)), "read back as the waiter gets it"
    after = start_after_command(name="s", argv=["x"], conditions=[(p.FLAG_PROBE, probe)])
    assert startafter.parse(expand_all(after, KUBELET_ENV)[1:]).conditions[0].endpoint.url == probe


@pytest.mark.parametrize("container", [
    {"name": "c", "command": ["/bin/sh"], "args": [p.CMD_RUN, "--", "x"]},
    {"name": "c", "command": [p.WAITER_PATH], "args": ["init", "/x"]},
    {"name": "c", "command": [p.WAITER_PATH], "args": [p.CMD_RUN, p.FLAG_POST, "/a", "x"]},  # no separator
    {"name": "c", "command": [p.WAITER_PATH], "args": [p.CMD_RUN, "--bogus", "--", "x"]},
    {"name": "c", "command": [p.WAITER_PATH], "args": [p.CMD_RUN, p.FLAG_ARGV_MAP, "{not json", "--", "x"]},
])
def test_reading_anything_else_is_a_rewrite_error(container: dict) -> None:
    with pytest.raises(RewriteError, match="'c'"):
        read_argv(container)


def test_flag_order_is_fixed() -> None:
    """Re-invocation must give the same args, so the order is part of the contract."""
    args = run_command(name="s", post="/initshift/run/1/done", argv=["make"], wait="/initshift/run/0/done",
                       ready_file="/r", probes=["tcp://127.0.0.1:1"], timeout=5, retry=True,
                       quits=["http://127.0.0.1:15020/quitquitquit"], mains_dir="/m", mains=2,
                       argv_map={"linux/amd64": ["/a"]})
    assert [a for a in args if a.startswith("--")] == [
        p.FLAG_NAME, p.FLAG_POST, p.FLAG_WAIT, p.FLAG_READY_FILE, p.FLAG_PROBE, p.FLAG_TIMEOUT, p.FLAG_RETRY,
        p.FLAG_QUIT, p.FLAG_MAINS_DIR, p.FLAG_MAINS, p.FLAG_ARGV_MAP, p.ARGV_SEPARATOR]
