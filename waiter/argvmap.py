"""Pick the argv for the running platform from `--argv-map` (multi-arch images whose
entrypoint differs per platform): keys are "os/arch/variant" or "os/arch", Go-style."""

from __future__ import annotations

import json
import os

from . import protocol as p
from .errors import UsageError

# uname machine -> (GOARCH, variant)
_ARCH = {
    "x86_64": ("amd64", ""), "amd64": ("amd64", ""),
    "aarch64": ("arm64", "v8"), "arm64": ("arm64", "v8"),
    "armv8l": ("arm", "v8"), "armv7l": ("arm", "v7"), "armv7": ("arm", "v7"),
    "armv6l": ("arm", "v6"), "armv5tel": ("arm", "v5"),
    "i386": ("386", ""), "i486": ("386", ""), "i586": ("386", ""), "i686": ("386", ""),
    "ppc64le": ("ppc64le", ""), "ppc64": ("ppc64", ""), "s390x": ("s390x", ""),
    "riscv64": ("riscv64", ""), "mips64": ("mips64", ""), "loongarch64": ("loong64", ""),
}


def platform_keys(sysname: str | None = None, machine: str | None = None) -> list[str]:
    """Keys to try, most specific first."""
    u = os.uname()
    system = (sysname or u.sysname).lower()
    arch, variant = _ARCH.get(machine or u.machine, ((machine or u.machine).lower(), ""))
    keys = [f"{system}/{arch}/{variant}"] if variant else []
    return keys + [f"{system}/{arch}"]


def parse(text: str) -> dict[str, list[str]]:
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--argv-map is not JSON: {exc}") from None
    if not isinstance(table, dict) or not table:
        raise UsageError("--argv-map must be a non-empty JSON object {\"os/arch\": [argv...]}")
    for key, argv in table.items():
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise UsageError(f"--argv-map entry {key!r} must be a non-empty list of strings")
        # JSON can spell a NUL (\u0000), which no exec can carry: said here, not at the spawn.
        if any("\0" in a for a in argv):
            raise UsageError(f"--argv-map entry {key!r} holds a NUL character, which no program's argv can carry")
    return table


def choose(table: dict[str, list[str]], keys: list[str] | None = None) -> list[str]:
    keys = platform_keys() if keys is None else keys
    for key in keys:
        if key in table:
            return list(table[key])
    raise UsageError(f"no argv for platform {keys[0]} in --argv-map (has: {', '.join(sorted(table))})")


def final_argv(argv: list[str], argv_map: dict | None) -> list[bytes]:
    """The argv to run: this platform's entry of `--argv-map` (the image's ENTRYPOINT, and
    CMD when the container sets no args) followed by the words after `--` (the container's
    own args); as the exact bytes the kernel passed (surrogateescape round-trips any byte)."""
    if argv_map is not None:
        argv = [*choose(argv_map), *argv]
    if not argv:
        raise UsageError(f"no command after {p.ARGV_SEPARATOR}")
    return [os.fsencode(a) for a in argv]
