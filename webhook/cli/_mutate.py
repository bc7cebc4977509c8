"""`initshift mutate FILE|-`: the webhook's rewrite as a dry run on the command line.

Exit codes: 0 the pod was rewritten (or printed unchanged), 1 the pod is left unchanged
(the warnings on stderr say why) and `--check` was given, 2 bad input or usage, 3 the
webhook would deny the pod (the message on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys

from waiter import protocol as p

from ..admission import make_patch
from ._common import EXIT_OK, EXIT_USAGE, Parser
from ._podio import InputError, dump, read_objects, read_pod
from ..rewrite import Lookup, UnresolvedEntrypoint, plan
from ..settings import Settings, SettingsError

_EXIT_UNCHANGED, _EXIT_DENIED = 1, 3  # beside the shared 0 and 2 (_common)


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="initshift mutate",
        description="Rewrite a Pod, the Pod inside an AdmissionReview, or a workload's pod template "
                    "(Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, CronJob), YAML or JSON, "
                    "the way the webhook would.",
        epilog="Settings come from the same INITSHIFT_* variables as the server; the feature gate is on "
               "unless --respect-gate is given. Exit codes: 0 rewritten or printed, 1 unchanged with --check, "
               "2 bad input, 3 the webhook would deny the pod.")
    ap.add_argument("file", help="a file, or - for standard input")
    ap.add_argument("-o", "--output", choices=["yaml", "json", "patch", "diff"], default="yaml",
                    help="the rewritten pod (yaml, json), the JSONPatch, or a unified diff")
    ap.add_argument("--mode", choices=list(p.MODES),
                    help="override INITSHIFT_MODE for pods without the initshift.io/mode annotation")
    ap.add_argument("--native-sidecars", action="store_true",
                    help="assume the cluster supports native sidecars (for mode auto)")
    ap.add_argument("--respect-gate", action="store_true",
                    help=f"honour {p.FEATURE_GATE_ENV} instead of forcing it on")
    ap.add_argument("--limit-ranges", metavar="FILE",
                    help="the LimitRanges of the pod's namespace (`kubectl get limitranges -n NS -o yaml`), which "
                         "the server reads itself and the rewritten pod must pass")
    ap.add_argument("--quotas", metavar="FILE",
                    help="the ResourceQuotas of the pod's namespace, with their status (`kubectl get resourcequotas "
                         "-n NS -o yaml`), which the server reads itself and the rewritten pod must fit")
    ap.add_argument("--namespace", metavar="FILE",
                    help="the pod's Namespace (`kubectl get namespace NS -o yaml`), whose mesh label the server reads "
                         "itself: a proxy it asks for is waited for where quotas or pod-level requests bound the pod")
    ap.add_argument("--check", action="store_true", help="exit 1 when the pod would be left unchanged")
    ap.add_argument("--resolve", action="store_true",
                    help="look up the ENTRYPOINT of steps without `command` in the registry (INITSHIFT_REGISTRY_* "
                         "settings; pull secrets through kubeconfig when INITSHIFT_REGISTRY_PULL_SECRETS is on)")
    return ap


def _one(namespaces: list[dict], path: str) -> dict:
    if len(namespaces) != 1:
        raise InputError(f"{path}: expected one Namespace, got {len(namespaces)}")
    return namespaces[0]


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        pod_in = read_pod(args.file)
        limit_ranges = read_objects(args.limit_ranges, "LimitRange") if args.limit_ranges else []
        quotas = read_objects(args.quotas, "ResourceQuota") if args.quotas else []
        namespace = _one(read_objects(args.namespace, "Namespace"), args.namespace) if args.namespace else None
    except (InputError, SettingsError) as e:
        print(f"initshift mutate: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not args.respect_gate:
        settings = settings.replace(feature_gate=True)
    if args.mode:
        settings = settings.replace(rewrite=dataclasses.replace(settings.rewrite, mode=args.mode))
    the_plan = plan(pod_in.pod, settings, native_supported=True if args.native_sidecars else None,
                    mode_from="--mode" if args.mode else None)
    images, lookup_error = None, None
    try:
        if args.resolve:
            images, lookup_error = _resolve(pod_in.pod, settings, the_plan.lookups())
    except OSError as e:  # an unreadable INITSHIFT_REGISTRY_CA_FILE
        print(f"initshift mutate: {e}", file=sys.stderr)
        return EXIT_USAGE
    result = the_plan.rewrite(images=images, lookup_error=lookup_error, limit_ranges=limit_ranges, quotas=quotas,
                              namespace=namespace)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if result.denied:
        print(f"denied: {result.denied}", file=sys.stderr)
        return _EXIT_DENIED
    sys.stdout.write(_render(pod_in.document, pod_in.put(result.pod), args.output))
    return _EXIT_UNCHANGED if args.check and not result.changed else EXIT_OK


def _resolve(pod: dict, settings: Settings, lookups: list[Lookup]) -> tuple[dict | None, str | None]:
    """The registry lookup the server would make: (images, None), or (None, why it failed),
    and the rewrite decides (deny or admit, per INITSHIFT_ON_UNRESOLVED) with that reason."""
    import asyncio

    from ..registry import make_resolver

    if not lookups:
        return None, None
    resolver = make_resolver(settings.replace(registry=dataclasses.replace(settings.registry, lookup=True)))
    assert resolver is not None

    async def run() -> dict:
        try:
            return await resolver.resolve(pod, lookups)
        finally:
            await resolver.aclose()

    try:
        return asyncio.run(run()), None
    except UnresolvedEntrypoint as e:
        return None, str(e)


def _render(before: dict, after: dict, fmt: str) -> str:
    if fmt == "patch":
        return json.dumps(make_patch(before, after), indent=2) + "\n"
    if fmt == "diff":
        a, b = dump(before, "yaml").splitlines(True), dump(after, "yaml").splitlines(True)
        return "".join(difflib.unified_diff(a, b, "pod", "pod (initshift)"))
    return dump(after, fmt)
