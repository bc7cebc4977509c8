"""`initshift review pod.yaml`: wrap a Pod into an AdmissionReview (CREATE) for curl.

`initshift review pod.yaml | curl ... --data @- https://127.0.0.1:8443/mutate`
"""

from __future__ import annotations

import json
import sys
import uuid

from ..admission import API_V1, API_V1BETA1, KIND
from ._common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Parser, describe, path_arg
from ._podio import InputError, read_pod


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


def main(argv: list[str]) -> int:
    ap = Parser(prog="initshift review", description="Wrap a Pod manifest into an AdmissionReview (CREATE) on stdout.",
                epilog="Exit codes: 0 printed, 1 the output file cannot be written, 2 bad input or usage.")
    ap.add_argument("pod", type=path_arg, help="Pod manifest (YAML or JSON), - for stdin")
    ap.add_argument("-n", "--namespace", default="", help="request namespace (default: the pod's, else default)")
    ap.add_argument("--v1beta1", action="store_true", help="admission.k8s.io/v1beta1 instead of v1")
    ap.add_argument("--dry-run", action="store_true", help="set request.dryRun")
    ap.add_argument("--uid", help="request uid (default: a random UUID)")
    ap.add_argument("-o", "--output", type=path_arg, help="write to this file instead of stdout")
    args = ap.parse_args(argv)
    try:
        pod = load_pod(args.pod)
    except InputError as e:
        print(f"initshift review: {e}", file=sys.stderr)
        return EXIT_USAGE
    review = wrap(pod, namespace=args.namespace, api_version=API_V1BETA1 if args.v1beta1 else API_V1,
                  dry_run=args.dry_run, uid=args.uid)
    text = json.dumps(review, indent=2) + "\n"
    if not args.output:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"initshift review: cannot write {describe(e)}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
