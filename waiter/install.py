"""`waiter init DEST`: copy the frozen bundle to DEST/waiter, idempotently and atomically,
readable and executable by any UID (steps run as arbitrary users). With `--hook` it runs
as hybrid's postStart hook: it copies unless the container's own process (`waiter hold`)
has put the bundle in place already, then records itself (waiter/copyrecord.py)."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys

from . import protocol as p
from .errors import UsageError, WaiterError
from .copyrecord import record_hook
from .signals import release_terminating

USAGE = f"usage: waiter init [--from BUNDLE_DIR] [{p.COPY_HOOK_FLAG}] DEST"
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def source_dir(explicit: str | None) -> str:
    """The bundle to copy: --from, else the running frozen bundle, else ./dist/waiter of the
    source tree (`make waiter`). The bare sources are not copyable: they need Python."""
    if explicit:
        src = explicit
    elif getattr(sys, "frozen", False):
        src = os.path.dirname(os.path.abspath(sys.executable))
    else:
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "dist", p.WAITER_DIR_NAME)
        if not os.path.isdir(src):
            raise UsageError(f"not a frozen waiter and no bundle at {src}: run `make waiter` "
                             "or pass --from BUNDLE_DIR")
    if not os.access(os.path.join(src, p.WAITER_EXE_NAME), os.X_OK):
        raise UsageError(f"{src} is not a waiter bundle (no executable {p.WAITER_EXE_NAME})")
    return src


def take_from(args: list[str]) -> str | None:
    """`--from DIR` or `--from=DIR` at the head of `args`, taken off them (None: none given)."""
    if not args or not (args[0] == "--from" or args[0].startswith("--from=")):
        return None
    if "=" in args[0]:
        return args.pop(0).partition("=")[2]
    if len(args) < 2:
        raise UsageError("--from needs a value")
    del args[0]
    return args.pop(0)


def _copy_file(src: str, dst: str) -> None:
    """0755 for executables, 0644 for data: any UID may run the bundle."""
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755 if os.stat(src).st_mode & 0o111 else 0o644)


def _ignore(src: str, names: list[str]) -> list[str]:
    # The image-path executable cannot run in a pod (its loader path is the image's).
    return [p.WAITER_INIT_EXE_NAME] if p.WAITER_INIT_EXE_NAME in names and \
        os.path.exists(os.path.join(src, p.WAITER_EXE_NAME)) else []


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (renameat2 RENAME_EXCHANGE); False when unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    except (OSError, AttributeError):
        return False
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def install(src: str, dest: str, *, replace: bool = True) -> str:
    """Copy `src` to DEST/waiter through a temporary directory renamed into place, so the
    path never holds half a bundle. A bundle already there is swapped for the new copy, or
    with `replace=False` kept (hybrid's copier: its hook and its process both copy, and
    steps may already run from the first copy placed: swapping it would delete their files
    under them)."""
    if not os.path.isdir(dest):
        raise UsageError(f"{dest}: not a directory (mount the {p.BIN_VOLUME} volume there)")
    final = os.path.join(dest, p.WAITER_DIR_NAME)
    tmp = os.path.join(dest, f".{p.WAITER_DIR_NAME}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, symlinks=True, copy_function=_copy_file, ignore=_ignore)
        for dirpath, _, _ in os.walk(tmp):
            os.chmod(dirpath, 0o755)
        try:
            os.rename(tmp, final)  # first install: atomic
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR):
                raise
            if not replace:  # whole (it came by a rename): ours is dropped below
                return os.path.join(final, p.WAITER_EXE_NAME)
            # Already installed: swap the new copy in, so the path never points at half a bundle.
            if not _exchange(tmp, final):
                old = final + f".{os.getpid()}.old"
                os.rename(final, old)
                os.rename(tmp, final)
                tmp = old
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return os.path.join(final, p.WAITER_EXE_NAME)


def main(argv: list[str]) -> int:
    release_terminating()  # no handlers here: a signal held since the start acts now
    args = list(argv)
    hook = p.COPY_HOOK_FLAG in args
    if hook:
        args.remove(p.COPY_HOOK_FLAG)
    try:
        explicit = take_from(args)
        if len(args) != 1 or args[0].startswith("-"):
            raise UsageError(USAGE)
        placed = os.path.join(args[0], p.WAITER_DIR_NAME, p.WAITER_EXE_NAME)
        if hook and os.access(placed, os.X_OK):  # `hold` copied first (a rename: whole or absent)
            exe = placed
        else:
            exe = install(source_dir(explicit), args[0], replace=not hook)
        if hook:
            record_hook(args[0])
    except WaiterError as exc:
        sys.stderr.write(f"waiter init: {exc.message}\n")
        return exc.exit_code
    except OSError as exc:
        sys.stderr.write(f"waiter init: {exc.filename or args[0]}: {exc.strerror}\n")
        return p.EXIT_CANNOT_EXEC
    print(f"waiter installed: {exe}")
    return 0
