"""The frozen bundle (dist/waiter, `make waiter`) where pods run it: an empty chroot holding
only the bundle, a busybox-static root, a read-only root with one writable dir, uid 12345,
and `waiter-init init` from the initshift image layout. Needs root (chroot, unshare, mount)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from waiter import protocol as p
from tests.support.waiter_support import DIST, catches, ensure_bundle, has_signal, holding, proc_status, record, \
    wait_for

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chroot, unshare and bind mounts"),
    pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("chroot") is None,
                       reason="needs util-linux unshare and coreutils chroot"),
]
BUSYBOX = shutil.which("busybox") or "/bin/busybox"
CHROOT = shutil.which("chroot") or "chroot"
UNSHARE = shutil.which("unshare") or "unshare"
MOUNT = shutil.which("mount") or "mount"
APPLETS = ["sh", "env", "printf", "cat", "sleep", "echo", "touch", "true", "false", "kill", "grep"]
WORK = "/work"  # the one writable dir inside the roots (an emptyDir in a pod)


@pytest.fixture(scope="module")
def bundle() -> Path:
    return ensure_bundle()


def install(bundle: Path, root: Path) -> None:
    """The pod's initshift-bin emptyDir, filled by `waiter init` (from source, --from dist)."""
    dest = root / p.BIN_MOUNT.lstrip("/")
    dest.mkdir(parents=True)
    dest.chmod(0o777)
    res = subprocess.run([os.sys.executable, "-m", "waiter", p.CMD_INIT, "--from", str(bundle), str(dest)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def make_root(tmp: Path, bundle: Path, busybox: bool) -> Path:
    root = tmp / "root"
    root.mkdir()
    install(bundle, root)
    work = root / WORK.lstrip("/")
    work.mkdir()
    work.chmod(0o1777)
    if busybox:
        if not os.path.exists(BUSYBOX):
            pytest.fail("busybox-static is missing: `make system-deps` installs it")
        (root / "bin").mkdir()
        shutil.copy(BUSYBOX, root / "bin" / "busybox")
        for applet in APPLETS:
            (root / "bin" / applet).symlink_to("busybox")
    return root


def in_root(root: Path, argv: list, *, uid: int | None = None, read_only: bool = False) -> list:
    """argv run chrooted into root (optionally read-only but for /work, as uid)."""
    user = [f"--userspec={uid}:{uid}"] if uid is not None else []
    if not read_only:
        return [CHROOT, *user, str(root), *argv]
    script = (f'{MOUNT} --bind "$1" "$1" && {MOUNT} --bind "$1/work" "$1/work" && '
              f'{MOUNT} -o remount,bind,ro "$1" && shift && exec {CHROOT} "$@"')
    return [UNSHARE, "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            str(root), *user, str(root), *argv]


def waiter_run(post: str, *flags: str, argv: list) -> list:
    return [p.WAITER_PATH, p.CMD_RUN, p.FLAG_POST, post, *flags, p.ARGV_SEPARATOR, *argv]


def test_empty_chroot_with_only_the_bundle(tmp_path: Path, bundle: Path) -> None:
    root = make_root(tmp_path, bundle, busybox=False)
    assert sorted(os.listdir(root)) == ["initshift", "work"]
    loader = f"{os.path.dirname(p.WAITER_PATH)}/{p.WAITER_LOADER_NAME}"
    first = subprocess.run(in_root(root, waiter_run(f"{WORK}/0", p.FLAG_NAME, "s0", argv=[loader, "--version"])),
                           capture_output=True, env={})
    assert first.returncode == 0, first.stderr
    assert record(root / "work" / "0")[p.RECORD_REASON] == p.REASON_COMPLETED
    second = subprocess.run(in_root(root, waiter_run(f"{WORK}/1", p.FLAG_WAIT, f"{WORK}/0", p.FLAG_NAME, "s1",
                                                     argv=["sh", "-c", "true"])),
                            capture_output=True, env={})
    assert second.returncode == p.EXIT_NOT_FOUND
    assert second.stderr.decode().strip() == "waiter[s1]: sh: command not found in PATH"
    assert record(root / "work" / "1")[p.RECORD_REASON] == p.REASON_WAITER_ERROR


@pytest.mark.parametrize("uid, read_only", [(None, False), (12345, True)], ids=["root-rw", "uid12345-ro"])
def test_busybox_root_chain(tmp_path: Path, bundle: Path, uid: int | None, read_only: bool) -> None:
    root = make_root(tmp_path, bundle, busybox=True)
    args = ["with space", "", "'q'", '"dq"', "é漢", "$HOME"]
    steps = [
        # (no /dev in these roots: no 2>/dev/null either)
        ["sh", "-c", f"if touch /rootfs-probe; then echo writable; else echo ro; fi > {WORK}/rootfs"],
        ["sh", "-c", f'printf "%s\\n" "$@" > {WORK}/argv', "sh", *args],
        ["sh", "-c", f"env > {WORK}/env"],
    ]
    env = {"PATH": "/bin", "LD_LIBRARY_PATH": "/custom/lib", "FOO": "a b=c"}
    procs = []
    for i in reversed(range(len(steps))):
        flags = [p.FLAG_NAME, f"s{i}"] + ([p.FLAG_WAIT, f"{WORK}/{i - 1}"] if i else [])
        procs.append(subprocess.Popen(in_root(root, waiter_run(f"{WORK}/{i}", *flags, argv=steps[i]),
                                              uid=uid, read_only=read_only),
                                      env=env, stderr=subprocess.PIPE))
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    work = root / "work"
    assert (work / "rootfs").read_text().strip() == ("ro" if read_only else "writable")
    assert (work / "argv").read_text() == "".join(f"{a}\n" for a in args)
    got = dict(line.split("=", 1) for line in (work / "env").read_text().splitlines())
    got.pop("PWD", None)  # busybox sh exports PWD itself
    got.pop("SHLVL", None)
    assert got == env
    for i in range(3):
        rec = record(work / str(i))
        assert rec[p.RECORD_REASON] == p.REASON_COMPLETED
        if uid is not None:
            assert (work / str(i)).stat().st_uid == uid


def test_unset_library_path_stays_unset(tmp_path: Path, bundle: Path) -> None:
    root = make_root(tmp_path, bundle, busybox=True)
    res = subprocess.run(in_root(root, waiter_run(f"{WORK}/0", argv=["sh", "-c", f"env > {WORK}/env"])),
                         env={"PATH": "/bin"}, capture_output=True)
    assert res.returncode == 0, res.stderr
    names = {line.split("=", 1)[0] for line in (root / "work" / "env").read_text().splitlines()}
    assert names - {"PWD", "SHLVL"} == {"PATH"}


def env_of_step(root: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment a step's command sees, the frozen waiter started with `env` in `root`
    as a pod's PID 1 (its own PID namespace, /proc mounted); the shell's PWD and SHLVL aside."""
    script = f'{MOUNT} -t proc proc "$1/proc" && exec {CHROOT} "$@"'
    res = subprocess.run([UNSHARE, "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", script,
                          "sh", str(root), *waiter_run(f"{WORK}/0", argv=["sh", "-c", f"env > {WORK}/env"])],
                         env=env, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = dict(line.split("=", 1) for line in (root / "work" / "env").read_text().splitlines())
    got.pop("PWD", None)
    got.pop("SHLVL", None)
    return got

def test_a_containers_own_library_path_orig_stays_as_it_is(tmp_path: Path, bundle: Path) -> None:
    """LD_LIBRARY_PATH_ORIG is where the bootloader saves an LD_LIBRARY_PATH it found: one
    the container sets itself, without an LD_LIBRARY_PATH, came to the command as its
    LD_LIBRARY_PATH, and vanished. With /proc, as in a pod."""
    root = make_root(tmp_path, bundle, busybox=True)
    (root / "proc").mkdir()
    for env in ({"PATH": "/bin", "LD_LIBRARY_PATH_ORIG": "/user/orig"},
                {"PATH": "/bin", "LD_LIBRARY_PATH": "/custom/lib"}):
        assert env_of_step(root, env) == env
        (root / "work" / "0").unlink()


def test_images_library_path_does_not_reach_the_bundles_loader(tmp_path: Path, bundle: Path) -> None:
    """An image whose LD_LIBRARY_PATH holds another libc.so.6 (an older glibc, a vendored one):
    LD_LIBRARY_PATH outranks a RUNPATH, so the loader must find the bundle through an RPATH.
    With /proc mounted, as in a pod, the child's environment comes from /proc/self/environ."""
    root = make_root(tmp_path, bundle, busybox=True)
    foreign = root / "custom" / "lib"
    foreign.mkdir(parents=True)
    # Stands for a libc the bundle was not built with: a real library that lacks glibc's symbols.
    libz = subprocess.run(["sh", "-c", "ldconfig -p | grep -m1 'libz.so.1 ' | sed 's/.*=> //'"],
                          capture_output=True, text=True).stdout.strip()
    shutil.copy(libz, foreign / "libc.so.6")
    subprocess.run(["patchelf", "--set-soname", "libc.so.6", str(foreign / "libc.so.6")], check=True)
    (root / "proc").mkdir()
    env = {"PATH": "/bin", "LD_LIBRARY_PATH": "/custom/lib"}
    assert env_of_step(root, env) == env


def test_frozen_forwards_sigterm_and_exits_with_the_childs_code(tmp_path: Path, bundle: Path) -> None:
    root = make_root(tmp_path, bundle, busybox=True)
    script = (f"trap 'echo got > {WORK}/term; exit 7' TERM; touch {WORK}/ready; "
              "while true; do sleep 0.05; done")
    proc = subprocess.Popen(in_root(root, waiter_run(f"{WORK}/0", argv=["sh", "-c", script])),
                            env={"PATH": "/bin"}, stderr=subprocess.PIPE)
    wait_for(lambda: (root / "work" / "ready").exists(), "the child to start")
    assert catches(proc.pid, signal.SIGTERM)  # chroot exec'd the waiter: same pid
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 7
    assert (root / "work" / "term").read_text() == "got\n"
    assert record(root / "work" / "0")[p.RECORD_EXIT_CODE] == 7


ORPHANS = """
echo $PPID > /work/ppid
i=0; while [ $i -lt 5 ]; do (sleep 0.05 &); i=$((i+1)); done
n=0
while [ $n -lt 400 ]; do
  # an orphan that exited but was not reaped stays listed as "(sleep) Z"
  [ "$(cat /proc/[0-9]*/stat 2>&1 | grep -c '(sleep)')" = 0 ] && exit 0
  sleep 0.05; n=$((n+1))
done
exit 9
"""


def test_frozen_as_pid_1_reaps_orphans(tmp_path: Path, bundle: Path) -> None:
    root = make_root(tmp_path, bundle, busybox=True)
    (root / "proc").mkdir()
    script = f'{MOUNT} -t proc proc "$1/proc" && exec {CHROOT} "$@"'
    res = subprocess.run([UNSHARE, "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", script,
                          "sh", str(root), *waiter_run(f"{WORK}/0", argv=["sh", "-c", ORPHANS])],
                         env={"PATH": "/bin"}, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (root / "work" / "ppid").read_text().strip() == "1"  # the waiter was PID 1


def _stop_in_start(unshare: subprocess.Popen) -> int | None:
    """SIGSTOP the namespace's PID 1 once the waiter has blocked SIGTERM and before it has a
    handler for it; its pid, or None when it went past that point first."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
    wait_for(lambda: children.read_text().strip(), "unshare's child")
    pid = int(children.read_text().split()[0])
    while True:
        status = proc_status(pid)
        if not status or has_signal(status, "SigCgt", signal.SIGTERM):
            return None
        if holding(status):
            os.kill(pid, signal.SIGSTOP)
            wait_for(lambda: proc_status(pid).get("State", "T").startswith("T"), "the waiter to stop")
            return None if catches(pid, signal.SIGTERM) else pid


def test_frozen_as_pid_1_keeps_a_sigterm_sent_in_its_start(tmp_path: Path, bundle: Path) -> None:
    """The kernel drops a signal sent to a PID namespace's init that has no handler for it
    (pid_namespaces(7)): a SIGTERM in the waiter's start would be lost and the container
    SIGKILLed at the end of the grace period. The waiter, stopped after it blocked SIGTERM
    and before its handlers exist, is sent SIGTERM: the kernel keeps it pending, and the
    waiter, let go, ends the step Stopped without running the command."""
    root = make_root(tmp_path, bundle, busybox=True)
    (root / "proc").mkdir()
    script = f'{MOUNT} -t proc proc "$1/proc" && exec {CHROOT} "$@"'
    argv = [UNSHARE, "--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "sh", "-c", script,
            "sh", str(root), *waiter_run(f"{WORK}/1", p.FLAG_WAIT, f"{WORK}/0", argv=["touch", f"{WORK}/ran"])]
    for _ in range(20):  # the poll may miss the ~30 ms between the two: start again
        unshare = subprocess.Popen(argv, env={"PATH": "/bin"}, stderr=subprocess.PIPE)
        try:
            pid = _stop_in_start(unshare)
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            assert has_signal(proc_status(pid), "ShdPnd", signal.SIGTERM), proc_status(pid)
            os.kill(pid, signal.SIGCONT)
            _, err = unshare.communicate(timeout=60)
            assert unshare.returncode == 128 + signal.SIGTERM, err
            assert record(root / "work" / "1")[p.RECORD_REASON] == p.REASON_STOPPED
            assert not (root / "work" / "ran").exists()
            return
        finally:
            unshare.kill()
            unshare.wait()
    pytest.fail("the waiter was never caught between blocking SIGTERM and handling it")


def test_waiter_init_from_the_image_layout(tmp_path: Path, bundle: Path) -> None:
    """What the initshift-init container does: the image holds the bundle at IMAGE_WAITER_DIR
    (no Python, no libc needed) and copies it, as the image's UID, into the emptyDir."""
    image = tmp_path / "image"
    shutil.copytree(bundle, image / p.IMAGE_WAITER_DIR.lstrip("/"), symlinks=True)
    (image / p.BIN_MOUNT.lstrip("/")).mkdir(parents=True)
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    empty_dir.chmod(0o777)
    script = f'{MOUNT} --bind "$1" "$2" && shift 2 && exec {CHROOT} "$@"'
    init = [UNSHARE, "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            str(empty_dir), str(image / p.BIN_MOUNT.lstrip("/")),
            f"--userspec={p.IMAGE_UID}:{p.IMAGE_UID}", str(image), *p.INIT_COMMAND]
    for _ in range(2):  # idempotent: a restarted init container installs again
        res = subprocess.run(init, capture_output=True, text=True, env={})
        assert res.returncode == 0, res.stderr
    assert sorted(os.listdir(empty_dir)) == [p.WAITER_DIR_NAME]
    installed = empty_dir / p.WAITER_DIR_NAME
    assert not (installed / p.WAITER_INIT_EXE_NAME).exists()
    for dirpath, dirnames, filenames in os.walk(installed):
        assert os.stat(dirpath).st_mode & 0o777 == 0o755
        for name in filenames:
            assert os.stat(os.path.join(dirpath, name)).st_mode & 0o777 in (0o755, 0o644)
    assert os.stat(installed / p.WAITER_EXE_NAME).st_mode & 0o777 == 0o755
    # A user image with nothing in it runs what init installed.
    user = tmp_path / "user"
    (user / "work").mkdir(parents=True)
    (user / "work").chmod(0o1777)
    shutil.move(str(empty_dir), user / p.BIN_MOUNT.lstrip("/").rsplit("/", 1)[0] / "bin")
    loader = f"{os.path.dirname(p.WAITER_PATH)}/{p.WAITER_LOADER_NAME}"
    res = subprocess.run(in_root(user, waiter_run(f"{WORK}/0", argv=[loader, "--version"]), uid=12345),
                         capture_output=True, env={})
    assert res.returncode == 0, res.stderr


def test_copier_hook_and_hold_from_the_image_layout(tmp_path: Path, bundle: Path) -> None:
    """What hybrid's initshift-copy container does: its process (`hold`) and its postStart
    hook (`init --hook`) run side by side in the initshift image as its UID; the bundle is
    copied into the emptyDir (by the process first, here), and the process ends with exit 0
    once the hook has."""
    image = tmp_path / "image"
    shutil.copytree(bundle, image / p.IMAGE_WAITER_DIR.lstrip("/"), symlinks=True)
    (image / p.BIN_MOUNT.lstrip("/")).mkdir(parents=True)
    (image / "proc").mkdir()  # a container always has /proc: hold reads the hook's there
    empty_dir = tmp_path / "emptydir"
    empty_dir.mkdir()
    empty_dir.chmod(0o777)
    script = f'{MOUNT} -t proc proc "$4/proc" && {MOUNT} --bind "$1" "$2" && shift 2 && exec {CHROOT} "$@"'

    def in_image(command: tuple[str, ...]) -> list:
        return [UNSHARE, "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(empty_dir),
                str(image / p.BIN_MOUNT.lstrip("/")), f"--userspec={p.IMAGE_UID}:{p.IMAGE_UID}", str(image), *command]

    def holding() -> list[int]:
        return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _argv(pid)[1:2] == [p.CMD_HOLD.encode()]
                and _argv(pid)[0].endswith(p.WAITER_INIT_EXE_NAME.encode())]

    hold = subprocess.Popen(in_image(p.COPY_HOLD_COMMAND), env={}, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: any(catches(pid, signal.SIGTERM) for pid in holding()) or hold.poll() is not None,
                 "hold to start")
        assert hold.poll() is None, hold.stderr.read()  # no hook has run: it can only wait
        res = subprocess.run(in_image(p.COPY_HOOK_COMMAND), capture_output=True, text=True, env={})
        assert res.returncode == 0, res.stderr
        assert hold.wait(timeout=30) == 0, hold.stderr.read()
    finally:
        if hold.poll() is None:
            for pid in holding():
                os.kill(pid, signal.SIGKILL)
            hold.wait()
    assert sorted(os.listdir(empty_dir)) == [p.COPY_DONE_FILE, p.WAITER_DIR_NAME]
    assert os.access(empty_dir / p.WAITER_DIR_NAME / p.WAITER_EXE_NAME, os.X_OK)
    assert (empty_dir / p.COPY_DONE_FILE).stat().st_uid == p.IMAGE_UID


def _argv(pid: str) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile
        return []


def test_bundle_is_self_contained() -> None:
    ensure_bundle()
    exe = DIST / p.WAITER_EXE_NAME
    interp = subprocess.run(["patchelf", "--print-interpreter", str(exe)], capture_output=True, text=True)
    assert interp.stdout.strip() == f"{os.path.dirname(p.WAITER_PATH)}/{p.WAITER_LOADER_NAME}"
    init = subprocess.run(["patchelf", "--print-interpreter", str(DIST / p.WAITER_INIT_EXE_NAME)],
                          capture_output=True, text=True)
    assert init.stdout.strip() == f"{p.IMAGE_WAITER_DIR}/{p.WAITER_LOADER_NAME}"


def test_no_runtime_hook_runs_at_start(bundle: Path) -> None:
    """PyInstaller adds a runtime hook for some collected modules (inspect, pkgutil,
    multiprocessing...), run before the waiter's first line at every start: the one for
    `inspect` imported inspect and zipfile, ~15 ms of each step's cold start. The build
    excludes what would bring one in."""
    from PyInstaller.archive.readers import CArchiveReader

    names = list(CArchiveReader(str(bundle / p.WAITER_EXE_NAME)).toc)  # a dict by name (6.5 and on)
    assert "initshift_waiter_entry" in names  # the archive was read
    assert [name for name in names if name.startswith("pyi_rth_")] == []


def test_the_bundle_holds_every_module_of_the_waiter(bundle: Path) -> None:
    """The entry imports some modules only when a flag asks for them (`waiter.hold`): each
    must be in the archive. Collected by importing `waiter`, they were left out where the
    environment resolved another checkout's package (an editable install elsewhere), and a
    rewritten pod's initshift-copy failed with `No module named 'waiter.hold'`."""
    from PyInstaller.archive.readers import CArchiveReader

    from waiter import build

    archive = CArchiveReader(str(bundle / p.WAITER_EXE_NAME))
    # The PYZ's name differs between releases (PYZ-00.pyz before 6.10): its type code is "z".
    (name,) = [name for name, entry in archive.toc.items() if entry[-1] == "z"]
    pyz = archive.open_embedded_archive(name)
    held = {name for name in pyz.toc if name == "waiter" or name.startswith("waiter.")}
    assert "waiter.hold" in build.own_modules() and "waiter.build" not in build.own_modules()
    assert held == set(build.own_modules())
