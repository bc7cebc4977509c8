"""What every command shares: one exit-code convention (_exits.py), one-line usage errors, the
connection flags, settings read once with a one-line error, and `CliError`."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable, NoReturn

from ..errors import InitshiftError, os_reason
from ..settings import Settings, SettingsError, name_problem
from ._exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_OUTPUT_CLOSED, EXIT_USAGE  # noqa: F401 - shared
from ._invoked import invoked_as


class CliError(InitshiftError):
    """A one-line message for stderr; the command exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


class _Said(logging.Handler):
    """A library's log record as the command's own stderr lines say things (`warning: ...`),
    on whatever sys.stderr is when it is written."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(f"{record.levelname.lower()}: {record.getMessage()}", file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging's own contract: a failed emit is reported, not raised
            self.handleError(record)


def say_logged() -> None:
    """Warnings the library logs while a short command runs (a pull secret the registry lookup
    skips) said as `warning: ...`, not in logging's bare last-resort form. Long-running
    commands log JSON instead (webhook.logs), which this leaves alone."""
    root = logging.getLogger()
    if not root.handlers:
        handler = _Said(logging.WARNING)
        root.addHandler(handler)


class Parser(argparse.ArgumentParser):
    """argparse with a usage error as one stderr line (argparse prints the whole usage), and
    the usage in the words the user typed (`kubectl initshift status ...` under kubectl)."""

    def __init__(self, *args: Any, prog: str | None = None, **kwargs: Any) -> None:
        if prog is not None and prog.startswith("initshift "):
            prog = invoked_as() + prog[len("initshift"):]
        super().__init__(*args, prog=prog, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see --help)\n")


def path_arg(text: str) -> str:
    """A file or directory argument (an argparse type): an empty one (`--out "$DIR"` with DIR
    unset) is refused, not read as the current directory or a file without a name."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return text


def name_arg(kind: str) -> Callable[[str], str]:
    """An argparse type for a Kubernetes name of `kind` (a k8snames rule): a malformed one is
    a usage error before the cluster is contacted, an empty one too (it would address the
    whole collection: `--webhook-config "$NAME"` with NAME unset)."""
    def parse(text: str) -> str:
        problem = name_problem(text, kind)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return text
    return parse


def whole_number(low: int, high: int | None, unit: str) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` (to `high`), its error naming `unit`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"{low} or more" if high is None else f"{low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds} ({unit})")
        return value
    return parse


def add_kubeconfig_args(ap: argparse.ArgumentParser) -> None:
    # An empty --kubeconfig (`--kubeconfig "$KC"` with KC unset) is refused: the configuration
    # would otherwise skip it for $KUBECONFIG and blame that.
    ap.add_argument("--kubeconfig", type=path_arg, help="kubeconfig file (default: as kubectl: $KUBECONFIG, else ~/.kube/config, "
                                         "else the pod's service account)")
    ap.add_argument("--context", help="kubeconfig context to use")


def load_settings(prog: str, with_flags: Callable[[Settings], Settings] = lambda s: s) -> Settings | None:
    """INITSHIFT_* (and the command's flags on top); None once the error is printed as one line."""
    try:
        return with_flags(Settings.from_env())
    except SettingsError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None


def describe(error: object) -> str:
    """An error for a person: an OSError as `FILE: no such file or directory`, not Python's
    `[Errno 2] No such file or directory: 'FILE'`."""
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {os_reason(error)}" if error.filename else os_reason(error)
    return str(error)


def fatal(prog: str, error: object) -> int:
    """A long-running command's failure once its JSON logging is on: one `error` line like
    every other line it writes; returns EXIT_ERROR."""
    logging.getLogger("initshift.cli").error(f"{prog}: {describe(error)}")
    return EXIT_ERROR
