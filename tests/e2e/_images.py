"""The images the scenarios run, built here as docker-archive tars (no registry, no Docker):

- the initshift image as the rewrite injects it (`initshift-init` runs the frozen waiter's
  `waiter-init` from `/opt/initshift/waiter`, as the Dockerfile's image holds it);
- `fakeproxy` (images/fakeproxy.c): the Istio-like and Linkerd-like proxies;
- Debian's curl with the libraries it links (what `initshift check --smoke` fetches with);
- busybox (tests/support/k8s), for the steps;
- `bare`: Debian's static busybox as `/busybox` and nothing else (no shell on a path, no
  `/etc`, no libraries): a step image as distroless as they come.

Tags carry a hash of the content (the waiter's: of its sources), so a cluster that keeps
images (kind) never runs a stale one.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.k8s import BUSYBOX, REGISTRY, ClusterError, Image, busybox_image, compile_static
from tests.support.k8s._binaries import REPO
from waiter import protocol as p

HERE = Path(__file__).resolve().parent
BUILD = REPO / ".cache" / "e2e"
WAITER_BUNDLE = REPO / "dist" / p.WAITER_DIR_NAME
LINKERD_AWAIT = "/usr/lib/linkerd/linkerd-await"  # where Linkerd's proxy image has it


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        for f in sorted(x for x in ([path] if path.is_file() else path.rglob("*")) if x.is_file()):
            h.update(str(f.relative_to(path.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Images:
    initshift: str
    proxy: str
    curl: str
    busybox: str
    bare: str
    archives: tuple[Path, ...]


def _libraries(binaries: list[Path]) -> dict[str, Path]:
    """Every shared library `binaries` load (`ldd`), at the paths the loader finds them."""
    out: dict[str, Path] = {}
    for binary in binaries:
        proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
        for found in re.finditer(r"(/\S+) \(0x", proc.stdout):
            out[found.group(1)] = Path(found.group(1)).resolve()
    return out


def _curl_image() -> Image:
    curl = shutil.which("curl")
    if not curl:
        raise ClusterError("curl is not installed (Debian: curl)")
    files: dict[str, Path | bytes | tuple[str, str]] = {"/usr/bin/curl": Path(curl).resolve(),
                                                         **_libraries([Path(curl)])}
    tag = _digest(sorted({v for v in files.values() if isinstance(v, Path)}))
    return Image(f"{REGISTRY}/curl:{tag}", files, entrypoint=["/usr/bin/curl"])


def initshift_image() -> Image:
    """initshift's image as the rewrite injects it: the frozen waiter where the Dockerfile
    puts it, tagged by the waiter's sources (each `make waiter` writes other bytes)."""
    sources = sorted((REPO / "waiter").glob("*.py"))
    image = Image(f"{REGISTRY}/initshift:{_digest(sources)}", user=f"{p.IMAGE_UID}:{p.IMAGE_UID}")
    image.add_tree(WAITER_BUNDLE, p.IMAGE_WAITER_DIR)
    return image


PYTHON = Path("/usr/bin/python3.11")  # Debian's: what `make venv` builds .venv from, so the wheels fit it
SITE = "/usr/lib/python3/dist-packages"  # on Debian's python3.11 sys.path
# The standard library less what a server never imports.
_STDLIB_SKIPPED = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data",
                   "config-3.11-x86_64-linux-gnu"}


def server_image() -> Image:
    """initshift's whole image, as the Dockerfile makes it but from this machine's own parts
    (no Docker engine here): Debian's Python 3.11 with the libraries it and its extension
    modules load, the runtime dependencies (constraints/image.txt names them) as installed in
    .venv, initshift's packages, the `initshift` command, and the frozen waiter where the
    rewrite's `initshift-init` runs it."""
    from importlib import metadata

    files: dict[str, Path | bytes | tuple[str, str]] = {"/usr/bin/python3.11": PYTHON.resolve(),
                                                         "/usr/bin/python3": ("symlink", "python3.11")}
    stdlib = Path("/usr/lib/python3.11")
    for path in sorted(stdlib.rglob("*")):
        rel = path.relative_to(stdlib)
        if rel.parts[0] in _STDLIB_SKIPPED or "__pycache__" in rel.parts:
            continue
        if path.is_symlink():
            files[f"{stdlib}/{rel}"] = ("symlink", str(path.readlink()))
        elif path.is_file():
            files[f"{stdlib}/{rel}"] = path
    names = [line.split("==")[0] for line in (REPO / "constraints" / "image.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not for this Python (an environment marker left it out)
        for entry in dist.files or ():
            if entry.parts[0] == ".." or "__pycache__" in entry.parts:
                continue  # the scripts in .venv/bin; bytecode a read-only root would not use
            source = Path(str(dist.locate_file(entry)))
            if source.is_file():
                files[f"{SITE}/{entry}"] = source
    for package in ("webhook", "waiter", "certs"):
        for path in sorted((REPO / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"{SITE}/{path.relative_to(REPO)}"] = path
    files["/usr/local/bin/initshift"] = b"#!/usr/bin/python3.11\nimport sys\nfrom webhook.cli import main\nsys.exit(main())\n"
    shared = [v for k, v in files.items() if isinstance(v, Path) and (k.endswith(".so") or ".so." in k)]
    for lib, source in _libraries([PYTHON, *shared]).items():
        files.setdefault(lib, source)
    waiter = initshift_image()
    image = Image(f"{REGISTRY}/initshift-server:{_digest([p for p in files.values() if isinstance(p, Path)])}",
                  {**files, **waiter.files}, user=f"{p.IMAGE_UID}:{p.IMAGE_UID}")
    return image


def build() -> Images:
    """Every image, written once per content into .cache/e2e/images/."""
    if not (WAITER_BUNDLE / p.WAITER_INIT_EXE_NAME).is_file():
        raise ClusterError(f"no frozen waiter in {WAITER_BUNDLE}: run `make waiter` first")
    out = BUILD / "images"
    out.mkdir(parents=True, exist_ok=True)
    proxy_bin = compile_static(HERE / "images" / "fakeproxy.c", BUILD / "fakeproxy")
    initshift = initshift_image()
    proxy = Image(f"{REGISTRY}/fakeproxy:{_digest([proxy_bin])}",
                  {"/fakeproxy": proxy_bin, LINKERD_AWAIT: ("symlink", "/fakeproxy")}, entrypoint=["/fakeproxy"])
    curl = _curl_image()
    busybox = busybox_image()
    static = busybox.files["/bin/busybox"]
    assert isinstance(static, Path)
    bare = Image(f"{REGISTRY}/bare:{_digest([static])}", {"/busybox": static}, env=[])
    archives = []
    for image in (initshift, proxy, curl, busybox, bare):
        repo, tag = image.ref.rsplit("/", 1)[1].split(":")
        path = out / f"{repo}-{tag}.tar"
        if not path.is_file() or image.ref in (BUSYBOX, initshift.ref):  # the bundle may be rebuilt
            image.write(path)
        for stale in out.glob(f"{repo}-*.tar"):  # an earlier content's archive
            if stale != path:
                stale.unlink()
        archives.append(path)
    return Images(initshift.ref, proxy.ref, curl.ref, BUSYBOX, bare.ref, tuple(archives))
