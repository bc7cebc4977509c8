"""`initshift` command line: a table of subcommands, each a module with `main(argv) -> int`.

Modules are imported only when their command runs, so `initshift mutate` does not pay for
the server's imports and `initshift --help` is instant.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from typing import Callable

from .. import __version__
from ..errors import os_reason
from ._exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_OUTPUT_CLOSED, EXIT_USAGE
from ._invoked import invoked_as

# name -> (module, one-line help). Each module defines `main(argv: list[str]) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "mutate": ("webhook.cli._mutate", "rewrite a Pod or AdmissionReview file and print the pod, patch or diff"),
    "serve": ("webhook.cli._serve", "run the admission webhook over HTTPS (--watch: with the watcher)"),
    "dev-server": ("webhook.cli._devserver", "the webhook on https://127.0.0.1:8443 with a CA in .run/ (make run)"),
    "review": ("webhook.cli._review", "wrap a Pod manifest into an AdmissionReview for curl"),
    "watch": ("webhook.cli._watch", "run the companion watcher (ready gate, outcome, ending sidecars)"),
    "certs": ("webhook.cli._certs", "certs create: CA + serving certificate; certs inject: set the caBundle"),
    "status": ("webhook.cli._status", "a pod's steps, mains and sidecars in execution order, and its result"),
    "logs": ("webhook.cli._logs", "a pod's step logs in step order, then the mains' (-f: follow)"),
    "check": ("webhook.cli._check", "verify the install (webhook, certificate, watcher, RBAC, meshes); --smoke runs a pod"),
}

def _usage() -> str:
    return f"usage: {invoked_as()} [--version] COMMAND [ARGS...]"


def _help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [_usage(), "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", f"`{invoked_as()} COMMAND --help` (or `{invoked_as()} help COMMAND`) describes one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return _guarded(f"initshift {args[0]}" if args and args[0] in COMMANDS else "initshift", lambda: _dispatch(args))


def _dispatch(args: list[str]) -> int:
    if not args:
        print(f"initshift: missing command ({_usage()}; see {invoked_as()} --help)", file=sys.stderr)
        return EXIT_USAGE
    if args[0] == "help" and args[1:]:  # `initshift help mutate`, as git and kubectl read it
        args = [args[1], "--help"]
    if args[0] in ("-h", "--help", "help"):
        print(_help())
        return EXIT_OK
    if args[0] == "--version":
        print(f"initshift {__version__}")
        return EXIT_OK
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"initshift: unknown command {args[0]!r} (commands: {', '.join(COMMANDS)})", file=sys.stderr)
        return EXIT_USAGE
    return int(importlib.import_module(entry[0]).main(args[1:]) or 0)


# A write to standard output that fails for want of room or a usable file (`> /dev/full`).
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF}


def _guarded(prog: str, run: Callable[[], int]) -> int:
    """`run`, with what no command handles itself answered in one place: Ctrl-C while a
    command imports (a second or two) or works, and standard output that cannot take what
    is written; each an exit code, never a traceback."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): written away, as to a closed pipe
        with open(os.devnull, "w", encoding="utf-8") as devnull, contextlib.redirect_stdout(devnull):
            return _guarded(prog, run)
    try:
        code = run()
        sys.stdout.flush()  # what is still buffered fails here, not in the interpreter's exit
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader stopped (`| head -1`): as kubectl and git, no message
        _drop_stdout()
        return EXIT_OUTPUT_CLOSED
    except OSError as e:
        if e.filename is not None or e.errno not in _OUTPUT_ERRNOS:
            raise
        _drop_stdout()
        print(f"{prog}: cannot write the output: {os_reason(e)}", file=sys.stderr)
        return EXIT_ERROR


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered must not fail again as Python exits
    (`Exception ignored ... BrokenPipeError`, exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stream without a file descriptor (a test's)
        pass


if __name__ == "__main__":
    sys.exit(main())
