"""The child's environment: exactly what Kubernetes gave the container.

/proc/self/environ is the block the process was exec'd with, untouched by anything the
interpreter did at start-up (e.g. C-locale coercion setting LC_CTYPE). The frozen
bootloader re-execs itself with LD_LIBRARY_PATH pointing into the bundle (the original
saved in LD_LIBRARY_PATH_ORIG) plus its own _PYI_* variables: those are undone here.
A LD_LIBRARY_PATH that was set but empty is indistinguishable from unset after the
bootloader, and comes back unset.
"""

from __future__ import annotations

import os
import sys

from . import protocol as p

LIBRARY_PATH = b"LD_LIBRARY_PATH"
LIBRARY_PATH_ORIG = b"LD_LIBRARY_PATH_ORIG"


def _initial_environment() -> dict[bytes, bytes]:
    try:
        with open("/proc/self/environ", "rb") as f:
            block = f.read()
    except OSError:  # no /proc (a bare chroot): the interpreter's copy is the best we have
        return dict(os.environb)
    env: dict[bytes, bytes] = {}
    for entry in block.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env[key] = value
    return env


def scrub(env: dict[bytes, bytes], frozen: bool, bundle: bytes = b"") -> dict[bytes, bytes]:
    """Remove what the freezer added and restore what it changed (`bundle`: the folder the
    bootloader put on LD_LIBRARY_PATH)."""
    if not frozen:
        return dict(env)
    exact = {name.encode() for name in p.FREEZER_ENV_EXACT}
    prefixes = tuple(prefix.encode() for prefix in p.FREEZER_ENV_PREFIXES)
    out = {k: v for k, v in env.items() if k not in exact and not k.startswith(prefixes)}
    # The bootloader saves an LD_LIBRARY_PATH it found in LD_LIBRARY_PATH_ORIG and puts its
    # own folder before it; with none, its folder alone, and an LD_LIBRARY_PATH_ORIG there
    # is the container's own (kept).
    if LIBRARY_PATH_ORIG in env and env.get(LIBRARY_PATH) != bundle:
        out[LIBRARY_PATH] = env[LIBRARY_PATH_ORIG]
    else:
        out.pop(LIBRARY_PATH, None)
        if LIBRARY_PATH_ORIG in env:
            out[LIBRARY_PATH_ORIG] = env[LIBRARY_PATH_ORIG]
    return out


def child_environment() -> dict[bytes, bytes]:
    bundle = getattr(sys, "_MEIPASS", "")
    return scrub(_initial_environment(), frozen=bool(getattr(sys, "frozen", False)),
                 bundle=os.fsencode(bundle) if bundle else b"")
