"""`initshift` command line: a table of subcommands, each a module with `main(argv) -> int`.

Modules are imported only when their command runs, so `initshift mutate` does not pay for
the server's imports and `initshift --help` is instant.
"""

from __future__ import annotations

import importlib
import os
import sys

from .. import __version__
from ._common import EXIT_OK, EXIT_USAGE

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

PLUGIN = "kubectl-initshift"  # the same entry point as a kubectl plugin (`kubectl initshift ...`)


def _prog() -> str:
    return "kubectl initshift" if os.path.basename(sys.argv[0]) == PLUGIN else "initshift"


def _usage() -> str:
    return f"usage: {_prog()} [--version] COMMAND [ARGS...]"


def _help() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [_usage(), "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", f"`{_prog()} COMMAND --help` (or `{_prog()} help COMMAND`) describes one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(f"initshift: missing command ({_usage()}; see {_prog()} --help)", file=sys.stderr)
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
    module = importlib.import_module(entry[0])
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
