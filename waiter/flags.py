"""`waiter run` flags (names from protocol.py), and the flag reading `start-after` shares.
Hand-parsed: argparse would print usage and exit 2, and the waiter must answer bad flags
with one line and its own exit code."""

from __future__ import annotations

import math
import os

from . import argvmap
from . import protocol as p
from .errors import UsageError
from .loopback import Endpoint

# Each command's grammar for `split`: (flags taking a value, the repeatable ones, switches).
# The webhook reads a wrapped container's command line back with these same grammars.
Grammar = tuple[frozenset[str], frozenset[str], frozenset[str]]
RUN: Grammar = (
    frozenset({p.FLAG_NAME, p.FLAG_WAIT, p.FLAG_POST, p.FLAG_READY_FILE, p.FLAG_PROBE, p.FLAG_TIMEOUT, p.FLAG_QUIT,
               p.FLAG_MAINS_DIR, p.FLAG_MAINS, p.FLAG_TERMINATION_LOG, p.FLAG_ARGV_MAP}),
    frozenset({p.FLAG_PROBE, p.FLAG_QUIT}),
    frozenset({p.FLAG_RETRY, p.FLAG_SKIP_FAILS}),
)
START_AFTER: Grammar = (
    frozenset({p.FLAG_NAME, p.FLAG_MARKER, p.FLAG_MAX_WAIT, p.FLAG_ARGV_MAP, p.FLAG_LOG_INTERVAL, p.FLAG_PROBE,
               p.FLAG_AFTER_MARKER, p.FLAG_AFTER_READY_FILE}),
    frozenset({p.FLAG_PROBE, p.FLAG_AFTER_MARKER, p.FLAG_AFTER_READY_FILE}),
    frozenset(),
)
GRAMMARS = {p.CMD_RUN: RUN, p.CMD_START_AFTER: START_AFTER}

USAGE = (f"usage: waiter run {p.FLAG_POST} FILE [{p.FLAG_NAME} NAME] [{p.FLAG_WAIT} FILE] "
         f"[{p.FLAG_READY_FILE} FILE] [{p.FLAG_PROBE} URL]... [{p.FLAG_TIMEOUT} SECONDS] "
         f"[{p.FLAG_QUIT} URL]... [{p.FLAG_MAINS_DIR} DIR {p.FLAG_MAINS} N] [{p.FLAG_TERMINATION_LOG} FILE] "
         f"[{p.FLAG_RETRY}] [{p.FLAG_SKIP_FAILS}] [{p.FLAG_ARGV_MAP} JSON] {p.ARGV_SEPARATOR} COMMAND [ARGS...]")


class RunOptions:
    """What `waiter run` was asked to do (a plain class: `dataclasses` costs cold start)."""

    def __init__(self) -> None:
        self.post = ""
        self.name = ""
        self.wait = ""
        self.ready_file = ""
        self.probes: list[Endpoint] = []
        self.timeout: float | None = None
        self.quit: list[Endpoint] = []
        self.mains_dir = ""
        self.mains = 0
        self.termination_log = p.DEFAULT_TERMINATION_LOG
        self.termination_log_explicit = False
        self.retry = False
        self.skip_fails = False
        self.argv: list[bytes] = []


def split(args: list[str], grammar: Grammar) -> tuple[list[tuple[str, str | None]], list[str]]:
    """Flags before the separator as (flag, value) pairs (None for a switch), and the argv
    after it; a flag given twice (unless repeatable) or with an empty value is refused."""
    valued, repeatable, switches = grammar
    pairs: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == p.ARGV_SEPARATOR:
            return pairs, args[i + 1:]
        flag, eq, value = arg.partition("=")
        if flag in switches and not eq:
            pairs.append((flag, None))
        elif flag in valued:
            if not eq:
                if i + 1 >= len(args) or args[i + 1] == p.ARGV_SEPARATOR:
                    raise UsageError(f"{flag} needs a value")
                value = args[i + 1]
                i += 1
            if not value:
                raise UsageError(f"{flag} needs a non-empty value")
            pairs.append((flag, value))
        else:
            raise UsageError(f"unknown flag {arg!r}" if arg.startswith("-") else
                             f"unexpected {arg!r} before {p.ARGV_SEPARATOR}")
        if flag in seen and flag not in repeatable:
            raise UsageError(f"{flag} given twice")
        seen.add(flag)
        i += 1
    raise UsageError(f"missing {p.ARGV_SEPARATOR} before the command")


def seconds(flag: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{flag} {value!r} is not a number of seconds") from None
    if not (math.isfinite(number) and number > 0):
        raise UsageError(f"{flag} must be a positive number of seconds")
    return number


def count(flag: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{flag} {value!r} is not a whole number") from None
    if number < 1:
        raise UsageError(f"{flag} must be at least 1")
    return number


def post_path_of(args: list[str]) -> str:
    """Best effort: this container's completion file even when other flags are bad,
    so a failure record can still be written and later steps do not hang."""
    for i, arg in enumerate(args):
        if arg == p.ARGV_SEPARATOR:
            break
        if arg.startswith(p.FLAG_POST + "="):
            return arg.partition("=")[2]
        if arg == p.FLAG_POST and i + 1 < len(args):
            return args[i + 1]
    return ""


def endpoint(flag: str, url: str, schemes: tuple[str, ...] = ("http", "https", "tcp")) -> Endpoint:
    try:
        endpoint = Endpoint.parse(url)
    except ValueError as exc:
        raise UsageError(f"{flag} {exc}") from None
    if endpoint.scheme not in schemes:
        raise UsageError(f"{flag} {url!r}: scheme must be one of {', '.join(schemes)}")
    return endpoint


def parse_run(args: list[str]) -> RunOptions:
    pairs, argv = split(args, RUN)
    opts = RunOptions()
    argv_map = None
    for flag, value in pairs:
        v = value or ""
        if flag == p.FLAG_POST:
            opts.post = v
        elif flag == p.FLAG_NAME:
            opts.name = v
        elif flag == p.FLAG_WAIT:
            opts.wait = v
        elif flag == p.FLAG_READY_FILE:
            opts.ready_file = v
        elif flag == p.FLAG_PROBE:
            opts.probes.append(endpoint(flag, v))
        elif flag == p.FLAG_QUIT:
            opts.quit.append(endpoint(flag, v, ("http", "https")))
        elif flag == p.FLAG_MAINS_DIR:
            opts.mains_dir = v
        elif flag == p.FLAG_MAINS:
            opts.mains = count(flag, v)
        elif flag == p.FLAG_TERMINATION_LOG:
            opts.termination_log, opts.termination_log_explicit = v, True
        elif flag == p.FLAG_RETRY:
            opts.retry = True
        elif flag == p.FLAG_SKIP_FAILS:
            opts.skip_fails = True
        elif flag == p.FLAG_TIMEOUT:
            opts.timeout = seconds(flag, v)
        elif flag == p.FLAG_ARGV_MAP:
            argv_map = argvmap.parse(v)
    if not opts.post:
        raise UsageError(f"{p.FLAG_POST} FILE is required")
    if not os.path.isdir(os.path.dirname(opts.post) or "."):
        raise UsageError(f"{p.FLAG_POST} {opts.post}: directory does not exist")
    if opts.wait and not os.path.isdir(os.path.dirname(opts.wait) or "."):
        raise UsageError(f"{p.FLAG_WAIT} {opts.wait}: directory does not exist")
    if bool(opts.mains_dir) != bool(opts.mains):
        raise UsageError(f"{p.FLAG_MAINS_DIR} and {p.FLAG_MAINS} go together")
    if opts.mains_dir and not os.path.isdir(opts.mains_dir):
        raise UsageError(f"{p.FLAG_MAINS_DIR} {opts.mains_dir}: directory does not exist")
    if opts.mains_dir and (not opts.name or "/" in opts.name or opts.name.startswith(".")):
        raise UsageError(f"{p.FLAG_MAINS_DIR} needs {p.FLAG_NAME} with a container name (its record's name there)")
    opts.argv = argvmap.final_argv(argv, argv_map)
    return opts
