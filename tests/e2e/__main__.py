"""`python -m tests.e2e` (`make e2e`): initshift on a real apiserver and kubelet.

For each version asked (E2E_K8S: "1.34", "1.28", or both, the default), a throwaway
single-node cluster from ../shared/k8s (tests/support/k8s), the images built here and
imported, the test mesh, initshift installed from deploy/ and run as its ServiceAccount,
then the scenarios: phase 1 concurrently, phase 2 (timings, the watcher killed, the kubelet
and the apiserver restarted) one at a time, phase 3 (the documented uninstall), then phase 4
(the chart installed, upgraded and uninstalled as a Helm release). With
KUBECONFIG set, the same against that cluster instead (docs/testing.md says what it
needs). Prints PASS/FAIL, wall time and figures per scenario; a failure prints the pods'
status, events and logs. Exit 1 on any failure or anything left behind.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tests.support.k8s import Cluster, ClusterError, cluster

# Imported for what they do: each registers its scenarios.
from . import _admitted, _builds, _helmrelease, _jobs, _keepalive, _lookup, _serverpod, _timing, _tools, _uninstall  # noqa: F401
from . import _double, _podpatchpolicy, _reapply, _secondday, _semantics  # noqa: F401
from . import _evicted  # noqa: F401
from . import _images
from ._env import SCENARIOS, Env, Record, Scenario
from ._install import Install
from ._kube import Kube, KubeFailure
from ._mesh import Mesh
from ._pods import dump

DEFAULT_VERSIONS = ("1.34", "1.28")
_print_lock = threading.Lock()


def say(text: str = "") -> None:
    with _print_lock:
        print(text, flush=True)


@dataclass
class Outcome:
    scenario: Scenario
    ok: bool
    seconds: float
    record: Record
    error: str = ""
    diagnostics: str = ""


@dataclass
class VersionRun:
    label: str
    outcomes: list[Outcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # setup failures, leftovers
    seconds: float = 0.0


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{os.cpu_count()} CPUs ({model}), {platform.system()} {platform.release()}"


def run_one(env: Env, sc: Scenario) -> Outcome:
    rec = Record()
    started = time.monotonic()
    try:
        sc.run(env, rec)
        out = Outcome(sc, True, time.monotonic() - started, rec)
    except Exception as exc:  # noqa: BLE001 - a scenario's failure is its report
        took = time.monotonic() - started
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, (AssertionError, KubeFailure)):
            error += "\n" + "".join(traceback.format_exception(exc)[-4:])
        diagnostics = "\n".join(dump(env.kube, ns) for ns in rec.namespaces)
        out = Outcome(sc, False, took, rec, error, diagnostics)
    report(out)
    return out


def report(out: Outcome) -> None:
    head = f"{'PASS' if out.ok else 'FAIL'}  {out.scenario.name:<22} {out.seconds:6.1f} s"
    lines = [f"{head}  {'; '.join(out.record.figures)}"]
    lines += [f"      {d}" for d in out.record.details]
    if not out.ok:
        lines.append(f"      {out.error}")
        if out.diagnostics:
            lines.append(out.diagnostics)
    say("\n".join(lines))


def run_scenarios(env: Env, only: list[str], jobs: int) -> list[Outcome]:
    chosen = [s for s in SCENARIOS if s.applies(env) and (not only or s.name in only)]
    skipped = [f"{s.name} (needs {s.needs})" for s in SCENARIOS if not s.applies(env) and (not only or s.name in only)]
    if skipped:
        say(f"not applicable here: {', '.join(skipped)}")
    outcomes: list[Outcome] = []
    first = [s for s in chosen if s.phase == 1]
    # the CronJob waits for the minute: start it first
    first.sort(key=lambda s: s.name != "cronjob")
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="scenario") as pool:
        outcomes += list(pool.map(lambda s: run_one(env, s), first))
    for sc in sorted((s for s in chosen if s.phase > 1), key=lambda s: s.phase):  # 3: the uninstall, last
        outcomes.append(run_one(env, sc))
    return outcomes


@contextlib.contextmanager
def installed(kubeconfig: Path, version_label: str, flavour: str, host: str, run: str,
              registry: _lookup.LocalRegistry | None = None,
              throwaway: Cluster | None = None) -> Iterator[Env]:
    kube = Kube(kubeconfig)
    version = kube.get("/version")
    minor = int("".join(ch for ch in version["minor"] if ch.isdigit()))
    images = _images.build()
    mesh = Mesh(kube, images.proxy, images.busybox, run, host)
    # The Helm install reads pull secrets (the chart's registry.pullSecrets: the private
    # registry's scenario); the kustomize one is the base, least privilege (`rbac`).
    install = Install(kubeconfig, flavour, images.initshift, host=host, pull_secrets=flavour == "helm")
    if registry is not None:  # steps without `command` get their image's ENTRYPOINT from it
        install.extra_env = {"INITSHIFT_REGISTRY_LOOKUP": "true", "INITSHIFT_REGISTRY_CA_FILE": str(registry.ca_file)}
    started = time.monotonic()
    env = None
    try:
        mesh.start()
        install.apply()
        install.start_server()
        install.start_watcher()
        install.wait_watcher_leads(kube)
        say(f"initshift installed ({flavour}: {', '.join(sorted({o['kind'] for o in install.objects}))}), "
            f"serving on {install.url} and watching as {install.sa_kubeconfig.name} in "
            f"{time.monotonic() - started:.1f} s")
        env = Env(kube, kubeconfig, minor, minor >= 29, images, install, mesh, run, registry, throwaway)
        yield env
    finally:
        install.stop()
        mesh.stop()
        kube.close()
        if env is None or env.keep_logs:
            say(f"logs of initshift serve and watch: {install.dir}")
        else:
            shutil.rmtree(install.dir, ignore_errors=True)


def _existing(kubeconfig: Path, args: argparse.Namespace, run: str) -> VersionRun:
    vr = VersionRun(f"the cluster of {kubeconfig}")
    started = time.monotonic()
    kube = Kube(kubeconfig)
    if kube.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/initshift-webhook"):
        vr.problems.append("initshift is installed in this cluster already: the e2e installs its own; "
                           "use a throwaway cluster (kind, minikube)")
        return vr
    images = _images.build()
    nodes = (kube.get("/api/v1/nodes") or {}).get("items") or []
    have = {n for node in nodes for img in (node.get("status") or {}).get("images") or [] for n in img.get("names", [])}
    missing = [ref for ref in (images.initshift, images.proxy, images.curl, images.busybox) if ref not in have
               and f"docker.io/{ref}" not in have]
    if missing:
        vr.problems.append("load these images into the cluster's nodes first (kind: `kind load image-archive "
                           "FILE`): " + " ".join(str(a) for a in images.archives))
        return vr
    with installed(kubeconfig, "existing", args.install or "helm", args.host, run) as env:
        try:
            vr.outcomes = run_scenarios(env, args.only, args.jobs)
            env.keep_logs = args.keep or not all(o.ok for o in vr.outcomes)
        finally:
            for ns in env.namespaces:
                with contextlib.suppress(Exception):
                    env.kube.delete(f"/api/v1/namespaces/{ns}")
            env.install.uninstall()
    vr.seconds = time.monotonic() - started
    return vr


def _throwaway(version: str, args: argparse.Namespace, run: str) -> VersionRun:
    vr = VersionRun(f"Kubernetes {version}")
    started = time.monotonic()
    images = _images.build()
    flavour = args.install or ("helm" if version.startswith("1.34") else "kustomize")
    try:
        with cluster(version, images=list(images.archives), log=lambda m: say(f"  {m}"), keep=args.keep) as c:
            vr.label = f"Kubernetes {c.version}"
            say(f"== {vr.label}: single node on {machine()} ==")
            with _lookup.local_registry(c.registry_hosts) as registry, \
                    installed(c.kubeconfig, c.version, flavour, "127.0.0.1", run, registry, c) as env:
                vr.outcomes = run_scenarios(env, args.only, args.jobs)
                env.keep_logs = args.keep or not all(o.ok for o in vr.outcomes)
            say("teardown ...")
    except ClusterError as exc:  # a setup failure, or a teardown that left something behind
        vr.problems.append(str(exc))
    else:
        say("teardown: nothing left behind (processes, mounts, bridge, cgroups, iptables rules, pod logs)")
    vr.seconds = time.monotonic() - started
    return vr


def summary(runs: list[VersionRun]) -> bool:
    ok = True
    say("\n== summary ==")
    for vr in runs:
        passed = sum(o.ok for o in vr.outcomes)
        failed = [o.scenario.name for o in vr.outcomes if not o.ok]
        ok &= not failed and not vr.problems
        say(f"{vr.label}: {passed} passed, {len(failed)} failed{' (' + ', '.join(failed) + ')' if failed else ''} "
            f"in {vr.seconds:.0f} s")
        for problem in vr.problems:
            say(f"  PROBLEM: {problem}")
        for o in vr.outcomes:
            if o.record.values:
                figures = ", ".join(f"{k} {v}" for k, v in o.record.values.items())
                say(f"  {o.scenario.name:<22} {figures}")
    return ok


def _interrupted(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.e2e", description=__doc__.split("\n\n")[0])
    ap.add_argument("--k8s", default=os.environ.get("E2E_K8S", ""),
                    help="versions, comma or space separated (default: E2E_K8S, else 1.34 and 1.28)")
    ap.add_argument("--only", action="append", default=[], metavar="SCENARIO", help="run only these (repeatable)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("E2E_JOBS", "6")),
                    help="phase-1 scenarios at once (default 6)")
    ap.add_argument("--install", choices=("helm", "kustomize"), default=os.environ.get("E2E_INSTALL") or None,
                    help="how initshift is installed (default: Helm on 1.34, kustomize on 1.28)")
    ap.add_argument("--host", default=os.environ.get("E2E_WEBHOOK_HOST", "127.0.0.1"),
                    help="with KUBECONFIG: the address the apiserver reaches this machine at")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs) afterwards")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args(argv)
    if args.list:
        for sc in SCENARIOS:
            say(f"{sc.name:<22} phase {sc.phase}  {sc.what}{f' (needs {sc.needs})' if sc.needs else ''}")
        return 0
    unknown = set(args.only) - {s.name for s in SCENARIOS}
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(sorted(unknown))} (see --list)")
    signal.signal(signal.SIGTERM, _interrupted)  # tear down as for Ctrl-C
    build = subprocess.run(["make", "--no-print-directory", "-s", "waiter"], cwd=_images.REPO)
    if build.returncode:
        return 1
    run = os.urandom(2).hex()
    started = time.monotonic()
    runs: list[VersionRun] = []
    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        runs.append(_existing(Path(kubeconfig.split(os.pathsep)[0]), args, run))
    else:
        for version in args.k8s.replace(",", " ").split() or DEFAULT_VERSIONS:
            runs.append(_throwaway(version, args, run))
    ok = summary(runs)
    say(f"e2e {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
