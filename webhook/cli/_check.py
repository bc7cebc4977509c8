"""`initshift check`: verify an install the way `linkerd check` does, one ✔ or ✘ per fact.

Preflight (webhook/cli/_check_preflight.py): the API, the MutatingWebhookConfiguration
against what deploy/ ships, the certificate the server really presents (verified with the
configuration's caBundle), `/readyz`, the watcher's Lease, the service account's RBAC
(SubjectAccessReviews), the Deployment (webhook/cli/_check_deployment.py), the opted-in
namespaces and the mesh injectors. `--smoke NAMESPACE`
then runs a tiny build pod and a tiny Job-shaped pod through the whole path
(webhook/cli/_check_smoke.py).

Exit codes: 0 every check passed, 1 something failed, 2 usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TextIO
from urllib.parse import urlsplit

from .. import k8snames
from ._check_preflight import preflight
from ._check_report import Line, Target
from ._check_smoke import SmokeOptions, smoke
from ._common import Parser, name_arg
from ._podcli import EXIT_ERROR, EXIT_OK, CliError, add_kubeconfig_args, connect, paint, run_main, use_colour

_OK_MARK, _FAIL_MARK = "✔", "✘"


def _service_url(text: str) -> str:
    """https://HOST[:PORT], what a port-forward gives; checked before anything connects."""
    try:
        url = urlsplit(text)
        fine = (url.scheme == "https" and bool(url.hostname) and url.port != 0  # .port: ValueError past 65535
                and url.path in ("", "/") and not url.query)
    except ValueError:
        fine = False
    if not fine:
        raise argparse.ArgumentTypeError(f"expected https://HOST[:PORT] (e.g. https://127.0.0.1:8443), got {text!r}")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


_NAMESPACE = name_arg(k8snames.DNS_LABEL)
_OBJECT_NAME = name_arg(k8snames.DNS_SUBDOMAIN)  # a name of an object initshift's install holds


def _text(text: str) -> str:
    """An image or a URL (an argparse type): not empty, which the pod would not run with."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


# The flags that shape --smoke's pods, which do nothing without it: (attribute, flag).
_SMOKE_FLAGS = (("keep", "--keep"), ("timeout", "--timeout"), ("image", "--image"), ("net_image", "--net-image"),
                ("net_url", "--net-url"))


def _parser() -> argparse.ArgumentParser:
    d = Target.defaults()
    o = SmokeOptions()
    ap = Parser(
        prog="initshift check",
        description="Verify an initshift install: the webhook configuration, the certificate the server presents, "
                    "its readiness, the watcher's Lease, RBAC, opted-in namespaces and mesh injectors. Nothing is "
                    "changed, except with --smoke, which runs one tiny build pod and one Job-shaped pod (and "
                    "deletes them).",
        epilog="The server is reached where the apiserver reaches it (the Service's NAME.NAMESPACE.svc, or "
               "the configuration's URL); from outside the cluster, through a port-forward to a Ready pod behind "
               "the Service (as kubectl port-forward svc/NAME; it needs get on pods/portforward). Its "
               "certificate is verified for the Service's name either way. Exit codes: 0 all checks passed, 1 a "
               "check failed or the cluster cannot be reached, 2 usage.")
    add_kubeconfig_args(ap)
    ap.add_argument("-n", "--namespace", type=_NAMESPACE, default=d.namespace,
                    help=f"initshift's namespace (default {d.namespace})")
    ap.add_argument("--webhook-config", type=_OBJECT_NAME, default=d.webhook_config,
                    help="the MutatingWebhookConfiguration's name")
    ap.add_argument("--service-account", type=_OBJECT_NAME, default=d.service_account,
                    help="the server's service account")
    ap.add_argument("--lease", type=_OBJECT_NAME, default=d.lease, help="the watcher's leader-election Lease")
    ap.add_argument("--service-url", type=_service_url, help="reach the server here instead (e.g. https://127.0.0.1:8443 after "
                                          "`kubectl -n initshift-system port-forward svc/initshift 8443:443`, or "
                                          "the Service's name where it resolves outside the cluster); the "
                                          "certificate is still verified for the Service's name")
    ap.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format")
    ap.add_argument("--smoke", metavar="NAMESPACE", type=_NAMESPACE,
                    help="run a tiny build pod and a Job-shaped pod in this opted-in namespace")
    # Their defaults are SmokeOptions' (None: not given, which run() tells from given without --smoke).
    ap.add_argument("--keep", action="store_true", default=None, help="--smoke: keep the pods afterwards")
    ap.add_argument("--timeout", type=_seconds, help=f"--smoke: seconds for the whole run (default {o.timeout:g})")
    ap.add_argument("--image", type=_text, help=f"--smoke: image of step 0 and the build's main "
                                                f"(default {o.image})")
    ap.add_argument("--net-image", type=_text, help=f"--smoke: image of step 1 and the Job's main, which "
                                                    f"reach the network "
                                                    f"(default {o.net_image})")
    ap.add_argument("--net-url", type=_text, help=f"--smoke: what step 1 and the Job's main fetch "
                                                  f"(default {o.net_url})")
    return ap


class Printer:
    """Text lines as they come, grouped by section; or everything as JSON at the end."""

    def __init__(self, out: TextIO, fmt: str) -> None:
        self.out, self.fmt = out, fmt
        self.colour = use_colour(out)
        self.lines: list[Line] = []
        self._section = ""

    def __call__(self, line: Line) -> None:
        self.lines.append(line)
        if self.fmt != "text":
            return
        if line.section != self._section:
            self.out.write(("\n" if self._section else "") + f"{line.section}\n{'-' * len(line.section)}\n")
            self._section = line.section
        mark = paint(_OK_MARK, "32", self.colour) if line.ok else paint(_FAIL_MARK, "31", self.colour)
        self.out.write(f"{mark} {line.title}\n")
        if line.hint:
            self.out.write(f"    {line.hint}\n")
        self.out.flush()

    @property
    def ok(self) -> bool:
        return all(line.ok for line in self.lines)

    def finish(self) -> None:
        if self.fmt == "json":
            json.dump({"ok": self.ok, "checks": [line.to_json() for line in self.lines]}, self.out, indent=2)
            self.out.write("\n")
        else:
            failed = sum(not line.ok for line in self.lines)
            self.out.write(f"\nStatus check results are {_OK_MARK if self.ok else _FAIL_MARK}"
                           + (f" ({failed} failed)" if failed else "") + "\n")
        self.out.flush()


async def run(argv: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    ap = _parser()
    try:
        args = ap.parse_args(argv)
        given = [flag for attr, flag in _SMOKE_FLAGS if getattr(args, attr) is not None]
        if given and not args.smoke:  # they would be ignored: say so rather than run without them
            ap.error(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --smoke NAMESPACE")
    except SystemExit as e:
        return int(e.code or 0)
    target = Target(args.namespace, args.webhook_config, args.service_account, args.lease, args.service_url)
    printer = Printer(out, args.output)
    try:
        api, _ = await connect(args)
    except CliError as e:
        print(f"initshift check: {e}", file=err)
        if args.output == "json":  # the failure as data too: a script reads stdout
            printer(Line("kubernetes-api", False, "can reach the Kubernetes API", str(e)))
            printer.finish()
        return e.code
    async with api:
        await preflight(api, target, printer)
        if args.smoke:
            options = SmokeOptions(**{attr: getattr(args, attr) for attr, _ in _SMOKE_FLAGS
                                      if getattr(args, attr) is not None})
            await smoke(api, args.smoke, target, options, printer)
    printer.finish()
    return EXIT_OK if printer.ok else EXIT_ERROR


def main(argv: list[str]) -> int:
    return run_main(run, argv)
