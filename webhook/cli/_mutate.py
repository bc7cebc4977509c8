"""`initshift mutate FILE|-`: the webhook's rewrite as a dry run on the command line.

A manifest of several objects (a YAML stream, a List: `helm template`, `kubectl get -o
yaml`) has each Pod, AdmissionReview and workload rewritten and every other object printed
as it is, so the output can go on to `kubectl apply -f -`.

Exit codes: 0 the pods were rewritten (or printed unchanged), 1 a pod is left unchanged
(the warnings on stderr say why) and `--check` was given, 2 bad input or usage, 3 the
webhook would deny a pod (the message on stderr; nothing is printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys
from typing import Any

from waiter import protocol as p

from .. import k8snames
from ..admission import make_patch, protected
from ._common import EXIT_OK, EXIT_USAGE, CliError, Parser, add_kubeconfig_args, path_arg, say_logged
from ._podio import (InputError, PodInput, dump, label_of, passed_through_note, read_manifests, read_objects,
                     source_name, write_stdout)
from ..rewrite import Plan, QuantityError, RewriteResult, UnresolvedEntrypoint, parse_quantity, plan
from ..settings import Settings, SettingsError

_EXIT_UNCHANGED, _EXIT_DENIED = 1, 3  # beside the shared 0 and 2 (_common)
_Pair = tuple[str, dict, dict | None]  # (label, before, after; None: passed through)


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="initshift mutate",
        description="Rewrite a Pod, the Pod inside an AdmissionReview, or a workload's pod template "
                    "(Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, CronJob, ReplicationController), YAML "
                    "or JSON, the way the webhook would. In a manifest of several objects (a YAML stream, a List) "
                    "each of those is rewritten and every other object printed as it is, with a note for one "
                    "whose kind is among those but whose apiVersion is another group's.",
        epilog="Settings come from the same INITSHIFT_* variables as the server; the feature gate is on "
               "unless --respect-gate is given. --kubeconfig and --context name the cluster --resolve reads pull "
               "secrets from (refused otherwise). Exit codes: 0 rewritten or printed, 1 a pod unchanged with "
               "--check or the kubeconfig named unusable, 2 bad input, 3 the webhook would deny a pod.")
    ap.add_argument("file", type=path_arg, help="a file, or - for standard input")
    ap.add_argument("-o", "--output", choices=["yaml", "json", "patch", "diff"], default="yaml",
                    help="the rewritten objects (yaml: a stream of documents; json: a List when there are "
                         "several), the JSONPatch (one pod), or a unified diff per object")
    ap.add_argument("--mode", choices=list(p.MODES),
                    help="override INITSHIFT_MODE for pods without the initshift.io/mode annotation")
    ap.add_argument("--native-sidecars", action="store_true",
                    help="assume the cluster supports native sidecars (for mode auto)")
    ap.add_argument("--respect-gate", action="store_true",
                    help=f"honour {p.FEATURE_GATE_ENV} instead of forcing it on")
    ap.add_argument("--limit-ranges", metavar="FILE", type=path_arg,
                    help="the LimitRanges of the pod's namespace (`kubectl get limitranges -n NS -o yaml`), which "
                         "the server reads itself and the rewritten pod must pass")
    ap.add_argument("--quotas", metavar="FILE", type=path_arg,
                    help="the ResourceQuotas of the pod's namespace, with their status (`kubectl get resourcequotas "
                         "-n NS -o yaml`), which the server reads itself and the rewritten pod must fit")
    ap.add_argument("--namespace", metavar="FILE", type=path_arg,
                    help="the pod's Namespace (`kubectl get namespace NS -o yaml`), whose mesh label the server reads "
                         "itself: a proxy it asks for is waited for where quotas or pod-level requests bound the pod")
    ap.add_argument("--check", action="store_true", help="exit 1 when a pod would be left unchanged")
    ap.add_argument("--resolve", action="store_true",
                    help="look up the ENTRYPOINT of steps without `command` in the registry (INITSHIFT_REGISTRY_* "
                         "settings; pull secrets from the cluster of --kubeconfig/--context when "
                         "INITSHIFT_REGISTRY_PULL_SECRETS is on)")
    add_kubeconfig_args(ap)  # for --resolve's pull secrets only: refused without them (_cluster_flags)
    return ap


def _not_a_name(path: str) -> str:
    """--namespace's file; InputError saying what it takes when it is no file but a
    namespace's name (every other command's --namespace is a name)."""
    if not os.path.exists(path) and k8snames.is_name(path, k8snames.DNS_LABEL):
        raise InputError(f"--namespace takes the Namespace's manifest, not its name: `kubectl get namespace {path} "
                         f"-o yaml > ns.yaml`, then --namespace ns.yaml (no file named {path} here)")
    return path


def _one(namespaces: list[dict], path: str) -> dict:
    if len(namespaces) != 1:
        raise InputError(f"{path}: expected one Namespace, got {len(namespaces)}")
    return namespaces[0]


# The fields of --limit-ranges and --quotas the rewrite reads (webhook/rewrite's LimitRanger
# and quota rules), held to their API types: the apiserver validated the server's copies, but a
# file may hold anything, and the rewrite skips what it cannot read (the bound then silently
# not applied). Each LimitRange item's maps of quantities; a ResourceQuota's (part, map) pairs.
_LIMIT_FIELDS = ("min", "max", "default", "defaultRequest", "maxLimitRequestRatio")
_QUOTA_FIELDS = (("spec", "hard"), ("status", "hard"), ("status", "used"))


def _quantities_problem(values: Any, where: str) -> str | None:
    """None, or what is wrong with a map of quantities (`resource: quantity`) at `where`."""
    if not isinstance(values, dict):
        return f"{where} must be a mapping of quantities, not {type(values).__name__}"
    for name, value in values.items():
        try:
            parse_quantity(value, str(name))
        except QuantityError:
            return f"{where}.{name}: {value!r} is not a quantity"
    return None


def _limit_range_problem(lr: dict) -> str | None:
    spec = lr.get("spec")
    limits = spec.get("limits") if isinstance(spec, dict) else None
    if not isinstance(limits, list):
        return "spec.limits must be a list" if isinstance(spec, dict) else "spec must be a mapping"
    for i, item in enumerate(limits):
        at = f"spec.limits[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            return f"{at} must be a mapping with a type (Container, Pod)"
        for key in (k for k in _LIMIT_FIELDS if item.get(k) is not None):  # null: no value, as in the API
            problem = _quantities_problem(item[key], f"{at}.{key}")
            if problem:
                return problem
    return None


def _quota_problem(quota: dict) -> str | None:
    for part, key in _QUOTA_FIELDS:
        node = quota.get(part)
        if node is None:  # a quota the controller has not counted yet has no status
            continue
        if not isinstance(node, dict):
            return f"{part} must be a mapping"
        problem = _quantities_problem(node[key], f"{part}.{key}") if node.get(key) is not None else None
        if problem:
            return problem
    return None


def _namespace_files(args: argparse.Namespace) -> tuple[list[dict], list[dict], dict | None]:
    """--limit-ranges, --quotas and --namespace, read and checked; InputError naming the file."""
    limit_ranges = read_objects(args.limit_ranges, "LimitRange", _limit_range_problem) if args.limit_ranges else []
    quotas = read_objects(args.quotas, "ResourceQuota", _quota_problem) if args.quotas else []
    namespace = _one(read_objects(_not_a_name(args.namespace), "Namespace"), args.namespace) \
        if args.namespace else None
    return limit_ranges, quotas, namespace


def _cluster_flags(args: argparse.Namespace, settings: Settings) -> None:
    """--kubeconfig/--context name the cluster --resolve reads pull secrets from, and mutate
    reads it for nothing else: given where they would be ignored, they are refused (a usage
    error), as `check` refuses --smoke's flags without --smoke. Once accepted they are every
    API client's configuration (the pull-secret reader builds its own)."""
    if args.kubeconfig is None and args.context is None:
        return
    named = "--kubeconfig" if args.kubeconfig is not None else "--context"
    if not args.resolve:
        raise CliError(f"{named} is for --resolve's pull secrets; without --resolve mutate reads no cluster",
                       EXIT_USAGE)
    if not settings.registry.pull_secrets:
        raise CliError(f"{named} is for --resolve's pull secrets, which INITSHIFT_REGISTRY_PULL_SECRETS turns on; "
                       "without them mutate reads no cluster", EXIT_USAGE)
    from ..kube import use_config

    use_config(args.kubeconfig, args.context)


def _check_cluster(args: argparse.Namespace) -> None:
    """A configuration the user named (the flags, $KUBECONFIG) must work: said before any
    lookup (exit 1, as `status` says it), not turned into anonymous pulls and a wrong
    answer. The implicit one (~/.kube/config, a service account) may be missing, as before."""
    import asyncio

    from ..kube import KubeApi, KubeError

    if not (args.kubeconfig or args.context or os.environ.get("KUBECONFIG")):
        return

    async def check() -> None:
        try:
            api = await KubeApi.from_config(args.kubeconfig, args.context)
        except KubeError as e:
            raise CliError(e.message) from None
        await api.close()

    asyncio.run(check())


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    say_logged()
    try:
        return _run(args)
    except (InputError, SettingsError) as e:
        print(f"initshift mutate: {e}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as e:
        print(f"initshift mutate: {e}", file=sys.stderr)
        return e.code


def _run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    _cluster_flags(args, settings)
    objects = read_manifests(args.file)
    limit_ranges, quotas, namespace = _namespace_files(args)
    pods = [o for o in objects if isinstance(o, PodInput)]
    if args.output == "patch" and len(pods) > 1:
        raise CliError(f"-o patch prints one pod's JSONPatch; {source_name(args.file)} holds {len(pods)} "
                       f"({', '.join(i.label for i in pods)}): use -o diff", EXIT_USAGE)
    if not args.respect_gate:
        settings = settings.replace(feature_gate=True)
    if args.mode:
        settings = settings.replace(rewrite=dataclasses.replace(settings.rewrite, mode=args.mode))
    # The server's rule first: a pod in kube-system or initshift's own namespace is never mutated.
    shielded = [protected(o.namespace, settings.server.namespace) for o in pods]
    planned = [o for o, why in zip(pods, shielded) if not why]
    plans = [plan(o.pod, settings, native_supported=True if args.native_sidecars else None,
                  mode_from="--mode" if args.mode else None) for o in planned]
    found = _resolve([o.pod for o in planned], plans, settings, args) if args.resolve else [(None, None)] * len(planned)
    rewritten = iter([the_plan.rewrite(images=images, lookup_error=lookup_error, limit_ranges=limit_ranges,
                                       quotas=quotas, namespace=namespace)
                      for the_plan, (images, lookup_error) in zip(plans, found)])
    results = [RewriteResult(pod=o.pod, warnings=[why]) if why else next(rewritten)
               for o, why in zip(pods, shielded)]  # in the pods' order
    pairs, denied, unchanged = _said(objects, results)
    if denied:  # half a manifest must not go on to `kubectl apply`
        return _EXIT_DENIED
    write_stdout(_render(pairs, args.output))
    return _EXIT_UNCHANGED if args.check and unchanged else EXIT_OK


def _said(objects: list[PodInput | dict], results: list[RewriteResult]) -> tuple[list[_Pair], bool, bool]:
    """Each object's (label, before, after) in order, its warnings, denial or note said on
    stderr; and whether any pod was denied, any left unchanged."""
    pods = len(results)
    results_left = iter(results)
    pairs: list[_Pair] = []
    denied = unchanged = False
    for obj in objects:
        if not isinstance(obj, PodInput):
            note = passed_through_note(obj)
            if note:
                print(f"note: {note}", file=sys.stderr)
            pairs.append((label_of(obj), obj, None))
            continue
        result = next(results_left)
        said = f"{obj.label}: " if pods > 1 else ""  # which pod a line is about
        for w in result.warnings:
            print(f"warning: {said}{w}", file=sys.stderr)
        if result.denied:
            print(f"denied: {said}{result.denied}", file=sys.stderr)
            denied = True
        unchanged |= not result.changed
        pairs.append((obj.label, obj.document, obj.put(result.pod, rewritten=result.changed)))
    return pairs, denied, unchanged


def _resolve(pods: list[dict], plans: list[Plan], settings: Settings,
             args: argparse.Namespace) -> list[tuple[dict | None, str | None]]:
    """The registry lookups the server would make, each pod's: (images, None), or (None, why
    they failed), and the rewrite decides (deny or admit, per INITSHIFT_ON_UNRESOLVED) with
    that reason. One resolver serves the whole manifest: an image is looked up once."""
    import asyncio

    from ..registry import make_resolver

    if settings.registry.pull_secrets:
        _check_cluster(args)
    wanted = [the_plan.lookups() for the_plan in plans]
    if not any(wanted):
        return [(None, None)] * len(pods)
    try:
        resolver = make_resolver(settings.replace(registry=dataclasses.replace(settings.registry, lookup=True)))
    except OSError as e:  # an unreadable INITSHIFT_REGISTRY_CA_FILE
        raise CliError(str(e), EXIT_USAGE) from None
    assert resolver is not None

    async def run() -> list[tuple[dict | None, str | None]]:
        out: list[tuple[dict | None, str | None]] = []
        try:
            for pod, lookups in zip(pods, wanted):
                try:
                    out.append((await resolver.resolve(pod, lookups) if lookups else None, None))
                except UnresolvedEntrypoint as e:
                    out.append((None, str(e)))
        finally:
            await resolver.aclose()
        return out

    return asyncio.run(run())


def _render(pairs: list[_Pair], fmt: str) -> str:
    """One object as itself; several as a YAML stream, a JSON List (as kubectl prints
    them), one unified diff each. A patch is of the one pod (main refuses several)."""
    if fmt == "patch":
        return json.dumps(next(make_patch(a, b) for _, a, b in pairs if b is not None), indent=2) + "\n"
    if fmt == "diff":
        return "".join("".join(difflib.unified_diff(dump(a, "yaml").splitlines(True), dump(b, "yaml").splitlines(True),
                                                    label, f"{label} (initshift)"))
                       for label, a, b in pairs if b is not None)
    afters = [a if b is None else b for _, a, b in pairs]
    if len(afters) == 1:
        return dump(afters[0], fmt)
    if fmt == "json":
        return dump({"apiVersion": "v1", "kind": "List", "items": afters}, fmt)
    return "---\n".join(dump(b, fmt) for b in afters)
