"""Container images without a registry or a Docker engine: one layer written with
`tarfile`, wrapped as a docker-archive (`docker save`'s format), imported into the node's
containerd with `ctr images import`.

- `Image`: a reference, its files and its config; `write()` makes the archive.
- `pause_image()`: the sandbox image (pause.c, `gcc -static`), `busybox_image()`: Debian's
  busybox-static with a link per applet.
- `compile_static(source, out)`: a C file to a static binary, rebuilt when the source changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import ClusterError

HERE = Path(__file__).resolve().parent
REGISTRY = "e2e.initshift.local"  # never pulled from: every image is imported, pods use IfNotPresent
PAUSE = f"{REGISTRY}/pause:3.10"
BUSYBOX = f"{REGISTRY}/busybox:1.35"


@dataclass
class Image:
    ref: str
    # path in the image -> a host file, or bytes, or ("symlink", target)
    files: dict[str, Path | bytes | tuple[str, str]] = field(default_factory=dict)
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=lambda: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    user: str = ""

    def add_tree(self, source: Path, at: str) -> None:
        """Every file and symlink under `source`, placed under `at`."""
        for path in sorted(source.rglob("*")):
            target = f"{at.rstrip('/')}/{path.relative_to(source)}"
            if path.is_symlink():
                self.files[target] = ("symlink", str(path.readlink()))
            elif path.is_file():
                self.files[target] = path

    def layer(self) -> bytes:
        """The image's one layer, an uncompressed tar."""
        buf = io.BytesIO()
        dirs: set[str] = set()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            def add_dirs(path: str) -> None:
                parts = path.strip("/").split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d not in dirs:
                        dirs.add(d)
                        info = tarfile.TarInfo(d)
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(info)

            for d in ("tmp",):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777
                tar.addfile(info)
                dirs.add(d)
            for path, src in sorted(self.files.items()):
                add_dirs(path)
                info = tarfile.TarInfo(path.strip("/"))
                if isinstance(src, tuple):
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, src[1], 0o777
                    tar.addfile(info)
                elif isinstance(src, bytes):
                    info.size, info.mode = len(src), 0o755
                    tar.addfile(info, io.BytesIO(src))
                else:
                    info.size, info.mode = src.stat().st_size, src.stat().st_mode & 0o777
                    with src.open("rb") as f:
                        tar.addfile(info, f)
        return buf.getvalue()

    def config_json(self, layer: bytes) -> bytes:
        """The image's configuration over its one (uncompressed) `layer`."""
        config: dict = {"Env": self.env}
        if self.entrypoint is not None:
            config["Entrypoint"] = self.entrypoint
        if self.cmd is not None:
            config["Cmd"] = self.cmd
        if self.user:
            config["User"] = self.user
        return json.dumps({
            "architecture": "amd64", "os": "linux", "config": config,
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
            "history": [{"created_by": "tests/support/k8s/_images.py"}],
        }, sort_keys=True).encode()

    def write(self, path: Path) -> Path:
        """The docker-archive tar: manifest.json, the config, one layer."""
        layer = self.layer()
        diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
        config_json = self.config_json(layer)
        config_name = hashlib.sha256(config_json).hexdigest() + ".json"
        layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
        manifest = json.dumps([{"Config": config_name, "RepoTags": [self.ref], "Layers": [layer_name]}]).encode()
        tmp = path.with_suffix(".tmp")
        with tarfile.open(tmp, "w") as tar:
            for name, data in ((layer_name, layer), (config_name, config_json), ("manifest.json", manifest)):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        tmp.replace(path)
        return path


def compile_static(source: Path, out: Path) -> Path:
    """`gcc -static` of one C file, skipped when `out` is newer than the source."""
    if out.is_file() and out.stat().st_mtime_ns >= source.stat().st_mtime_ns:
        return out
    if not shutil.which("gcc"):
        raise ClusterError("gcc is not installed (Debian: gcc, libc6-dev)")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["gcc", "-static", "-O2", "-Wall", "-o", str(out) + ".tmp", str(source)],
                          capture_output=True, text=True)
    if proc.returncode:
        raise ClusterError(f"gcc {source}: {proc.stderr.strip()}")
    Path(str(out) + ".tmp").replace(out)
    return out


def pause_image(build: Path) -> Image:
    binary = compile_static(HERE / "images" / "pause.c", build / "pause")
    return Image(PAUSE, {"/pause": binary}, entrypoint=["/pause"])


def busybox_image() -> Image:
    busybox = Path(shutil.which("busybox") or "/bin/busybox")
    if not busybox.is_file():
        raise ClusterError("busybox is not installed (Debian: busybox-static)")
    applets = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    image = Image(BUSYBOX, {"/bin/busybox": busybox.resolve()}, cmd=["sh"])
    for applet in applets:
        if f"/{applet}" != "/bin/busybox":
            image.files[f"/{applet}"] = ("symlink", "/bin/busybox")
    return image


def import_images(ctr_address: Path, archives: list[Path], namespace: str = "k8s.io") -> None:
    """`ctr images import` each archive into the node's containerd (unpacked for its snapshotter)."""
    for archive in archives:
        proc = subprocess.run(["ctr", "--address", str(ctr_address), "-n", namespace, "images", "import",
                               str(archive)], capture_output=True, text=True, timeout=300)
        if proc.returncode:
            raise ClusterError(f"ctr images import {archive.name}: {proc.stderr.strip() or proc.stdout.strip()}")
