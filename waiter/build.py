"""`make waiter`: freeze the waiter into a folder that runs in any Linux image.

    python -m waiter.build dist/waiter

PyInstaller --onedir (no extraction, nothing written at start), then the bundle is made
independent of the image's libc: the glibc loader and every shared library the executable
and its extension modules need are copied in, the executable's ELF interpreter is pointed
at the bundled loader (an absolute path: the kernel resolves PT_INTERP before any code runs)
and every library gets an $ORIGIN-relative RUNPATH. Two copies of the executable differ only
in that interpreter path: `waiter` for the pod path (protocol.WAITER_PATH) and `waiter-init`
for the initshift image (protocol.IMAGE_WAITER_DIR), where `waiter init` runs.

Build-time only: it uses subprocess, ldd and patchelf, none of which ship in the bundle.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

from . import protocol as p

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Libraries and Python's files live in this sub-folder: with "." the executable `waiter`
# would sit where the frozen importer looks for the `waiter` package, and shadow it.
CONTENTS = "_internal"
ENTRY = "from waiter.cli import run\nrun()\n"
# Stdlib the waiter never imports: keeps the bundle small and the archive quick to open.
# `inspect` must stay out: once collected, PyInstaller's runtime hook for it imports inspect and
# zipfile (ast, dis, tokenize, pathlib, shutil, threading...) at every start, ~15 ms of each
# step's cold start for a module the waiter never calls.
EXCLUDES = [
    "inspect", "zipfile", "pkgutil",
    "_bz2", "_lzma", "_decimal", "decimal", "bz2", "lzma", "hashlib", "_hashlib", "_blake2",
    "_sha3", "unittest", "pydoc", "doctest", "email", "http", "xml", "xmlrpc",
    "_multibytecodec", "_codecs_cn", "_codecs_hk", "_codecs_iso2022", "_codecs_jp", "_codecs_kr",
    "_codecs_tw", "tkinter", "asyncio", "multiprocessing", "sqlite3", "distutils", "lib2to3",
    "setuptools", "pkg_resources", "pdb", "difflib", "tarfile", "gzip",
    "webhook", "certs", "waiter.build", "subprocess", "tempfile",
    "argparse", "csv",
]
SKIP_RPATH = re.compile(r"^(ld-linux.*|ld\.so|libc\.so.*|libm\.so.*|libdl\.so.*|libpthread\.so.*|"
                        r"librt\.so.*|libutil\.so.*)$")


class BuildError(Exception):
    pass


def _run(cmd: list[str], **kw: object) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise BuildError(f"{' '.join(cmd[:3])}... failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-4000:]}")
    return res.stdout


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _elves(bundle: str) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(bundle):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and _is_elf(path):
                out.append(path)
    return sorted(out)


def _ldd(path: str) -> tuple[dict[str, str], str | None]:
    """(soname -> resolved path, loader path) for one ELF file."""
    res = subprocess.run(["ldd", path], capture_output=True, text=True)
    libs: dict[str, str] = {}
    loader = None
    for line in res.stdout.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (\S+) \(0x", line)
        if m:
            libs[m.group(1)] = m.group(2)
        elif re.match(r"^/\S*ld-linux\S* \(0x", line):
            loader = line.split()[0]
        elif "=> not found" in line:
            raise BuildError(f"{path}: {line}")
    return libs, loader


def freeze(work: str) -> str:
    """Run PyInstaller; return the onedir folder."""
    entry = os.path.join(work, "initshift_waiter_entry.py")
    with open(entry, "w") as f:
        f.write(ENTRY)
    cmd = [sys.executable, "-m", "PyInstaller", "--onedir", "--noconfirm", "--log-level", "WARN",
           "--name", p.WAITER_EXE_NAME, "--contents-directory", CONTENTS, "--strip", "--noupx",
           "--distpath", os.path.join(work, "dist"), "--workpath", os.path.join(work, "work"),
           # Not --debug noarchive: loose .pyc files save ~2 ms of each cold start but make
           # `waiter init` copy 232 files instead of 19 (+40 ms of CPU, once per pod, before
           # any step can start).
           "--specpath", work, "--paths", ROOT]
    for mod in own_modules():
        cmd += ["--hidden-import", mod]
    for mod in EXCLUDES:
        cmd += ["--exclude-module", mod]
    _run(cmd + [entry], cwd=work)
    return os.path.join(work, "dist", p.WAITER_EXE_NAME)


def own_modules() -> list[str]:
    """Every module of this tree's waiter package, named from its folder: the entry imports
    some only when a flag asks for them. (--collect-submodules imports `waiter` wherever the
    environment resolves it, another checkout's editable install or PYTHONPATH, and then
    built a bundle without them, silently.)"""
    names = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "waiter")) if f.endswith(".py"))
    modules = ["waiter" if name == "__init__" else f"waiter.{name}" for name in names]
    return [m for m in modules if m not in EXCLUDES]


def make_self_contained(bundle: str) -> None:
    exe = os.path.join(bundle, p.WAITER_EXE_NAME)
    libdir = os.path.join(bundle, CONTENTS)
    present = set(os.listdir(libdir))
    loader = None
    for path in _elves(bundle):
        libs, found = _ldd(path)
        loader = loader or found
        for soname, resolved in libs.items():
            if soname not in present and not resolved.startswith(bundle):
                shutil.copyfile(os.path.realpath(resolved), os.path.join(libdir, soname))
                os.chmod(os.path.join(libdir, soname), 0o755)
                present.add(soname)
    if loader is None:
        raise BuildError(f"ldd found no ELF interpreter for {exe}: is this a glibc system?")
    bundled_loader = os.path.join(bundle, p.WAITER_LOADER_NAME)
    shutil.copyfile(os.path.realpath(loader), bundled_loader)
    os.chmod(bundled_loader, 0o755)
    for path in _elves(bundle):
        if path in (bundled_loader, exe) or SKIP_RPATH.match(os.path.basename(path)):
            continue
        rel = os.path.relpath(libdir, os.path.dirname(path))
        rpath = "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"
        _run(["patchelf", "--set-rpath", rpath, path])
    init_exe = os.path.join(bundle, p.WAITER_INIT_EXE_NAME)
    shutil.copyfile(exe, init_exe)
    os.chmod(init_exe, 0o755)
    # The loader finds the executable's $ORIGIN through /proc/self/exe, absent in a bare
    # chroot: the executables get their absolute folder first (libraries resolve $ORIGIN
    # from their own path, no /proc needed). An RPATH, not a RUNPATH: the image's
    # LD_LIBRARY_PATH outranks a RUNPATH and may hold another libc.so.6 (the bootloader puts
    # the bundle first only when it re-execs itself, after these libraries are loaded).
    for path, folder in ((exe, os.path.dirname(p.WAITER_PATH)), (init_exe, p.IMAGE_WAITER_DIR)):
        _run(["patchelf", "--set-interpreter", f"{folder}/{p.WAITER_LOADER_NAME}", "--force-rpath",
              "--set-rpath", f"{folder}/{CONTENTS}:$ORIGIN/{CONTENTS}", path])


def build(dest: str) -> str:
    if shutil.which("patchelf") is None:
        raise BuildError("patchelf is missing: `make system-deps` (apt-get install patchelf)")
    dest = os.path.abspath(dest)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="waiter-build-", dir=os.path.join(ROOT, "build"))
    try:
        bundle = freeze(work)
        make_self_contained(bundle)
        staged = dest + ".new"
        shutil.rmtree(staged, ignore_errors=True)
        shutil.move(bundle, staged)
        old = dest + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(dest):
            os.rename(dest, old)
        os.rename(staged, dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m waiter.build DEST (e.g. dist/waiter)", file=sys.stderr)
        return 2
    try:
        dest = build(args[0])
    except BuildError as exc:
        print(f"waiter build: {exc}", file=sys.stderr)
        return 1
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(dest) for f in fs)
    print(f"waiter bundle: {dest} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
