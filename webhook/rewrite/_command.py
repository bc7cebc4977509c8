"""The waiter's command line in a wrapped container: the one writer (`run_command`,
`start_after_command`) and the one reader (`read_argv`, and `gate_of` for step 0's gate).

The reader parses with the waiter's own grammars (`waiter.flags`), so what the webhook
writes is exactly what the waiter accepts; a round-trip property test holds them together.
Flag order is fixed (the patch of a re-invocation must be empty when nothing changed).
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from waiter import flags as waiter_flags
from waiter import protocol as p
from waiter.errors import UsageError

from ._entrypoint import escape_expansion, reduce_expansion
from ._errors import RewriteError

# Flags whose value is text from the pod or the settings (a probe's or a quit URL). In
# `args` the kubelet expands $(VAR) and reduces $$ to $: written escaped, so the waiter
# gets them as they are, and read back reduced.
_TEXT_FLAGS = frozenset((p.FLAG_PROBE, p.FLAG_QUIT))

Argv = tuple[list[str], dict | None]  # argv after `--`, and the per-platform `--argv-map`


def _flag(flag: str, value: str) -> list[str]:
    """A flag and its value as written into `args` (escaped for the text flags)."""
    return [flag, escape_expansion(value) if flag in _TEXT_FLAGS else value]


# The longest one argument of an exec may be (Linux's MAX_ARG_STRLEN, 32 pages of 4 KiB,
# less its NUL): an --argv-map over it makes the exec that starts the waiter fail, and the
# container never starts ("argument list too long").
MAX_ARG_BYTES = 32 * 4096 - 1


def _argv_map(value: dict | None) -> list[str]:
    return [] if value is None else [p.FLAG_ARGV_MAP, json.dumps(value, separators=(",", ":"), sort_keys=True)]


def argv_map_bytes(value: dict) -> int:
    """The bytes of `--argv-map`'s value as the waiter's exec gets it (the kubelet reduces $$)."""
    return len(reduce_expansion(_argv_map(value)[1]).encode())


def run_command(*, name: str, post: str, argv: Sequence[str], wait: str | None = None, ready_file: str | None = None,
                probes: Sequence[str] = (), timeout: int = 0, retry: bool = False, skip_fails: bool = False,
                quits: Sequence[str] = (),
                mains_dir: str | None = None, mains: int = 0, termination_log: str | None = None,
                argv_map: dict | None = None) -> list[str]:
    """`waiter run ...` as the container's `args` (the `command` is the waiter itself)."""
    args = [p.CMD_RUN, p.FLAG_NAME, name, p.FLAG_POST, post]
    if wait:
        args += [p.FLAG_WAIT, wait]
    if ready_file:
        args += [p.FLAG_READY_FILE, ready_file]
    for url in probes:
        args += _flag(p.FLAG_PROBE, url)
    if timeout:
        args += [p.FLAG_TIMEOUT, str(timeout)]
    if retry:
        args.append(p.FLAG_RETRY)
    if skip_fails:
        args.append(p.FLAG_SKIP_FAILS)
    for url in quits:
        args += _flag(p.FLAG_QUIT, url)
    if mains_dir and mains:
        args += [p.FLAG_MAINS_DIR, mains_dir, p.FLAG_MAINS, str(mains)]
    if termination_log:
        args += [p.FLAG_TERMINATION_LOG, termination_log]
    return [*args, *_argv_map(argv_map), p.ARGV_SEPARATOR, *argv]


def start_after_command(*, name: str, argv: Sequence[str], marker: str | None = None,
                        conditions: Sequence[tuple[str, str]] = (), max_wait: int = 0,
                        argv_map: dict | None = None) -> list[str]:
    """`waiter start-after ...`; `conditions` are (flag, value) pairs in the order they are checked."""
    args = [p.CMD_START_AFTER, p.FLAG_NAME, name]
    if marker:
        args += [p.FLAG_MARKER, marker]
    for flag, value in conditions:
        args += _flag(flag, value)
    if conditions and max_wait:
        args += [p.FLAG_MAX_WAIT, str(max_wait)]
    return [*args, *_argv_map(argv_map), p.ARGV_SEPARATOR, *argv]


def waiter_command(container: Mapping) -> str | None:
    """`run` or `start-after` when the waiter runs this container, else None."""
    args = container.get("args")
    if container.get("command") != [p.WAITER_PATH] or not isinstance(args, list) or not args:
        return None
    return args[0] if args[0] in waiter_flags.GRAMMARS else None


def _run_flags(container: Mapping) -> list[tuple[str, str | None]] | None:
    """The flags of a `waiter run` container's command line; None when the waiter does not
    run it or its command line does not parse."""
    if waiter_command(container) != p.CMD_RUN:
        return None
    try:
        pairs, _ = waiter_flags.split(list(container["args"][1:]), waiter_flags.RUN)
    except UsageError:
        return None
    return [(f, reduce_expansion(v) if f in _TEXT_FLAGS and v is not None else v) for f, v in pairs]


def gate_probes(container: Mapping) -> list[str] | None:
    """The loopback probes a `waiter run` container waits for before it starts (step 0's
    gate), or None when the waiter does not run it or its command line does not parse."""
    pairs = _run_flags(container)
    return None if pairs is None else [str(v) for f, v in pairs if f == p.FLAG_PROBE]


def gate_of(container: Mapping) -> tuple[str | None, tuple[str, ...]]:
    """The ready gate of a container `waiter run` runs: the ready file it reads (the
    downward-API file of `initshift.io/ready`) and the loopback probes it checks itself;
    (None, ()) for a container that waits for no gate, or whose command line does not parse."""
    pairs = _run_flags(container) or []
    ready = next((v for f, v in pairs if f == p.FLAG_READY_FILE and v), None)
    return ready, tuple(str(v) for f, v in pairs if f == p.FLAG_PROBE and v)


def read_argv(container: Mapping) -> Argv:
    """The original argv (and per-platform map) of a container the waiter runs."""
    command = waiter_command(container)
    if command is None:
        raise RewriteError(f"container {container.get('name')!r} is not run by the waiter as this pod's "
                           f"{p.ANNOTATION_STEPS} annotation says")
    try:
        pairs, argv = waiter_flags.split(list(container["args"][1:]), waiter_flags.GRAMMARS[command])
        argv_map = next((json.loads(v) for f, v in pairs if f == p.FLAG_ARGV_MAP and v), None)
    except (UsageError, ValueError) as e:
        raise RewriteError(f"container {container.get('name')!r}: its waiter command line does not parse "
                           f"({e})") from None
    return argv, argv_map
