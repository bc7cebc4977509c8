"""The Kubernetes binaries: found in the shared directory, decompressed once into the
checkout's cache, verified against the directory's SHA256SUMS.

The shared directory holds one folder per version (`v1.34.9/`, `v1.28.15/`), each with
`NAME.xz` files and a `SHA256SUMS` of the decompressed files. The cache is
`.cache/k8s/<version>/` in the checkout (git-ignored); a file is used only after its hash
matched once, and a stamp (size and mtime at that moment) saves the re-hash next time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
from pathlib import Path

from ._errors import ClusterError

REPO = Path(__file__).resolve().parents[3]
CACHE = REPO / ".cache" / "k8s"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
# Where the binaries are (see shared_dir).
DIR_ENV = "E2E_K8S_DIR"


def shared_dir() -> Path:
    """$E2E_K8S_DIR, else ../shared/k8s beside the checkout, or beside the main checkout
    when this one is a `git worktree` elsewhere."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).resolve()
    candidates = [REPO.parent / "shared" / "k8s"]
    try:
        common = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=REPO,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        if common:
            candidates.append(Path(common).parent.parent / "shared" / "k8s")
    except (OSError, subprocess.SubprocessError):
        pass
    return next((c.resolve() for c in candidates if c.is_dir()), candidates[0].resolve())


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", name))


def available(directory: Path | None = None) -> list[str]:
    """The versions present, e.g. ["v1.28.15", "v1.34.9"] (oldest first)."""
    root = directory or shared_dir()
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if p.is_dir() and re.fullmatch(r"v\d+\.\d+\.\d+", p.name)
             and (p / "SHA256SUMS").is_file()]
    return sorted(found, key=_version_key)


def resolve(version: str, directory: Path | None = None) -> str:
    """"1.34", "v1.34" or "v1.34.9" -> the newest matching folder name ("v1.34.9")."""
    want = version.removeprefix("v")
    matches = [v for v in available(directory) if v[1:] == want or v[1:].startswith(want + ".")]
    if not matches:
        have = ", ".join(available(directory)) or "none"
        raise ClusterError(f"no Kubernetes {version} in {directory or shared_dir()} (have: {have}; "
                           f"set {DIR_ENV} to the folder that holds v1.x.y/ directories)")
    return matches[-1]


def _sums(folder: Path) -> dict[str, str]:
    out = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.lstrip("*")] = digest
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def binaries(version: str, directory: Path | None = None, cache: Path | None = None) -> Path:
    """The folder of verified, executable binaries of `version` (decompressed on first use)."""
    src_root = directory or shared_dir()
    name = resolve(version, src_root)
    src = src_root / name
    dest = (cache or CACHE) / name
    dest.mkdir(parents=True, exist_ok=True)
    sums = _sums(src)
    with open(dest / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run of the same checkout may be decompressing
        stamps_file = dest / ".verified.json"
        stamps = json.loads(stamps_file.read_text()) if stamps_file.is_file() else {}
        for binary in BINARIES:
            if binary not in sums:
                raise ClusterError(f"{src}/SHA256SUMS does not list {binary}")
            target = dest / binary
            if target.is_file() and stamps.get(binary) == [sums[binary], *_stamp(target)]:
                continue
            if not target.is_file() or _sha256(target) != sums[binary]:
                tmp = dest / f".{binary}.tmp"
                with lzma.open(src / f"{binary}.xz") as fin, tmp.open("wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
                got = _sha256(tmp)
                if got != sums[binary]:
                    tmp.unlink()
                    raise ClusterError(f"{src}/{binary}.xz decompresses to sha256 {got}, SHA256SUMS says {sums[binary]}")
                tmp.chmod(0o755)
                tmp.replace(target)
            stamps[binary] = [sums[binary], *_stamp(target)]
        stamps_file.write_text(json.dumps(stamps, indent=1))
    return dest
