"""The launcher's binaries: found by version, decompressed once, refused when the hash differs.

No cluster: a fake shared directory of tiny xz files stands in for ../shared/k8s."""

from __future__ import annotations

import hashlib
import lzma
from pathlib import Path

import pytest

from tests.support.k8s import ClusterError, available, binaries, resolve
from tests.support.k8s._binaries import BINARIES


def _shared(root: Path, version: str, *, corrupt: str = "") -> Path:
    folder = root / version
    folder.mkdir(parents=True)
    sums = []
    for name in BINARIES:
        data = f"#!/bin/sh\necho {name} {version}\n".encode()
        (folder / f"{name}.xz").write_bytes(lzma.compress(data))
        digest = hashlib.sha256(b"other" if name == corrupt else data).hexdigest()
        sums.append(f"{digest}  {name}")
    (folder / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return root


def test_versions_resolve_by_prefix(tmp_path):
    root = _shared(tmp_path / "k8s", "v1.28.15")
    _shared(root, "v1.34.9")
    _shared(root, "v1.34.10")
    assert available(root) == ["v1.28.15", "v1.34.9", "v1.34.10"]
    assert resolve("1.34", root) == "v1.34.10"
    assert resolve("v1.28", root) == "v1.28.15"
    assert resolve("1.34.9", root) == "v1.34.9"
    with pytest.raises(ClusterError, match=r"no Kubernetes 1\.3 .*have: v1\.28\.15"):
        resolve("1.3", root)


def test_binaries_are_decompressed_once_and_verified(tmp_path):
    root = _shared(tmp_path / "k8s", "v1.34.9")
    out = binaries("1.34", root, cache=tmp_path / "cache")
    kubelet = out / "kubelet"
    assert kubelet.read_text() == "#!/bin/sh\necho kubelet v1.34.9\n"
    assert kubelet.stat().st_mode & 0o111
    mtime = kubelet.stat().st_mtime_ns
    assert binaries("1.34", root, cache=tmp_path / "cache") == out
    assert kubelet.stat().st_mtime_ns == mtime  # reused, not decompressed again
    kubelet.write_text("tampered")  # a changed file is hashed again and replaced
    binaries("1.34", root, cache=tmp_path / "cache")
    assert kubelet.read_text().startswith("#!/bin/sh")


def test_a_hash_mismatch_is_refused(tmp_path):
    root = _shared(tmp_path / "k8s", "v1.28.15", corrupt="kube-scheduler")
    with pytest.raises(ClusterError, match="kube-scheduler.xz decompresses to sha256"):
        binaries("1.28", root, cache=tmp_path / "cache")
    assert not (tmp_path / "cache" / "v1.28.15" / "kube-scheduler").exists()
