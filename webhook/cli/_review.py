"""`initshift review pod.yaml`: wrap a Pod into an AdmissionReview (CREATE) for curl.

`initshift review pod.yaml | curl ... --data @- https://127.0.0.1:8443/mutate`
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

from .. import k8snames
from ..admission import API_V1, API_V1BETA1, KIND
from ._common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Parser, describe, name_arg, path_arg
from ._podio import InputError, dump, read_pod, write_stdout

_FORMATS = ("json", "yaml")  # -o, as `initshift mutate -o` and kubectl's -o: a format, never a file


def wrap(pod: dict, *, namespace: str = "", api_version: str = API_V1, dry_run: bool = False,
         uid: str | None = None, operation: str = "CREATE") -> dict:
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    ns = namespace or meta.get("namespace") or "default"
    return {
        "apiVersion": api_version, "kind": KIND,
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta.get("name", ""), "namespace": ns, "operation": operation,
            "userInfo": {"username": "initshift-review", "groups": ["system:authenticated"]},
            "object": pod, "oldObject": None, "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def load_pod(path: str) -> dict:
    """The Pod in a file (or `-`): a Pod or an AdmissionReview's, as `initshift mutate` reads it."""
    return read_pod(path, workloads=False).pod


def _format(text: str) -> str:
    """-o: a format (an argparse type). `-o review.json`, once how a file was named, is
    refused with the flag that writes one, never taken as a file."""
    if text not in _FORMATS:
        raise argparse.ArgumentTypeError(f"expected a format ({', '.join(_FORMATS)}), got {text!r}; "
                                         "--out FILE writes to a file")
    return text


def _mismatch(pod: dict, namespace: str | None) -> str | None:
    """kubectl's refusal of `-n` against an object that names another namespace."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    own = meta.get("namespace")
    if not namespace or not own or own == namespace:
        return None
    return (f'the namespace from the provided object "{own}" does not match the namespace "{namespace}": '
            f"pass -n {own}, or leave -n out")


def main(argv: list[str]) -> int:
    ap = Parser(prog="initshift review", description="Wrap a Pod manifest into an AdmissionReview (CREATE) on stdout.",
                epilog="Exit codes: 0 printed, 1 the output file cannot be written, 2 bad input or usage.")
    ap.add_argument("pod", type=path_arg, help="Pod manifest (YAML or JSON), - for stdin")
    ap.add_argument("-n", "--namespace", type=name_arg(k8snames.DNS_LABEL), default=None,
                    help="request namespace (default: the pod's, else default); a pod in another namespace is refused")
    ap.add_argument("--v1beta1", action="store_true", help="admission.k8s.io/v1beta1 instead of v1")
    ap.add_argument("--dry-run", action="store_true", help="set request.dryRun")
    ap.add_argument("--uid", help="request uid (default: a random UUID)")
    ap.add_argument("-o", "--output", type=_format, default="json", metavar="{json,yaml}",
                    help="output format (default json, what the server reads)")
    ap.add_argument("--out", metavar="FILE", type=path_arg, help="write to this file instead of stdout")
    args = ap.parse_args(argv)
    try:
        pod = load_pod(args.pod)
    except InputError as e:
        print(f"initshift review: {e}", file=sys.stderr)
        return EXIT_USAGE
    mismatch = _mismatch(pod, args.namespace)
    if mismatch:
        print(f"initshift review: {mismatch}", file=sys.stderr)
        return EXIT_USAGE
    review = wrap(pod, namespace=args.namespace or "", api_version=API_V1BETA1 if args.v1beta1 else API_V1,
                  dry_run=args.dry_run, uid=args.uid)
    text = dump(review, args.output)
    if not args.out:
        write_stdout(text)
        return EXIT_OK
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"initshift review: cannot write {describe(e)}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
