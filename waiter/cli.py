"""`waiter` command line: a table of subcommands, each a module with `main(argv) -> int`.

Modules are imported only when their command runs (every step pays the cold start); each
has `USAGE` and `main(argv) -> int`.
To add a subcommand, add a row: the frozen build collects every waiter submodule.
"""

from __future__ import annotations

import os
import sys

from . import protocol as p
from .signals import hold_terminating

COMMANDS: dict[str, tuple[str, str]] = {
    p.CMD_INIT: ("waiter.install", "copy the frozen waiter bundle into DEST (the shared emptyDir)"),
    p.CMD_HOLD: ("waiter.hold", "the copier container's main: wait until its postStart hook's copy has ended"),
    p.CMD_RUN: ("waiter.entrypointer", "wait for the previous step, run a command, record the result"),
    p.CMD_START_AFTER: ("waiter.startafter", "wait until earlier containers are ready, then exec the command"),
}

USAGE = "usage: waiter COMMAND [ARGS...]"


def _help() -> str:
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_help())
        return 0 if args else p.EXIT_USAGE
    entry = COMMANDS.get(args[0])
    if entry is None:
        sys.stderr.write(f"waiter: unknown command {args[0]!r} (commands: {', '.join(COMMANDS)})\n")
        return p.EXIT_USAGE
    module = __import__(entry[0], fromlist=["main"])  # importlib itself is one more import to pay
    if args[1:2] in (["-h"], ["--help"]):  # every subcommand's usage, in one place
        print(module.USAGE)
        return 0
    return int(module.main(args[1:]) or 0)


def run() -> None:
    """The executable's entry point: main(), then exit at once. The interpreter's orderly
    teardown (~5 ms of CPU, module by module) would run just after the completion record is
    written, on the core the next step wakes up on: the waiter holds nothing that needs it
    (files are closed where they are written), so only the standard streams are flushed."""
    hold_terminating()  # a SIGTERM in the start waits for the command's handlers (signals.py)
    code = main()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with that descriptor closed
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing left to say
            pass
    os._exit(code)
