"""`initshift dev-server` (what `make run` runs): the webhook on https://127.0.0.1:8443
with a self-signed CA kept in `.run/`, the feature gate on, and a ready-to-paste curl.

The environment still wins for every setting except the certificate paths, which always
point into the run directory (that is the point of this command).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from waiter import protocol as p

from ..settings import Settings, SettingsError
from ._common import EXIT_USAGE, Parser, add_kubeconfig_args, describe, fatal, path_arg

if TYPE_CHECKING:
    from ..admission import HttpsServer

_PROG = "initshift dev-server"
_RUN_DIR = ".run"
# The example review of the checkout this runs from, by its absolute path so the printed
# curl works from any directory.
_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "review.json"
_DEV_DEFAULTS = {p.FEATURE_GATE_ENV: "true", "INITSHIFT_HOST": "127.0.0.1", "INITSHIFT_PORT": "8443"}


def _dev_settings(run_dir: Path, environ: Mapping[str, str]) -> Settings:
    env = {**_DEV_DEFAULTS, **environ,
           "INITSHIFT_TLS_CERT": str(run_dir / "tls.crt"), "INITSHIFT_TLS_KEY": str(run_dir / "tls.key")}
    return Settings.from_env(env)


def _ensure_certs(run_dir: Path, host: str) -> str:
    """CA kept across runs (trust it once), serving pair renewed when due; returns the CA path."""
    from ..admission import ensure_local_certificates, unbracketed
    from certs import rotation, store

    names = ("localhost",)
    host = unbracketed(host)
    ips = tuple(dict.fromkeys(("127.0.0.1", "::1", *([host] if _is_ip(host) and host not in ("0.0.0.0", "::") else []))))
    ensure_local_certificates(run_dir, rotation.Wanted(names, ips))
    return str((run_dir / store.CA_CERT).resolve())


def _is_ip(value: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _shown(host: str) -> str:
    """The address a client on this machine reaches a listening `host` at, as a URL writes it."""
    from ..admission import unbracketed

    host = unbracketed(host)
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _curl_command(ca: str, host: str, port: int, example: Path = _EXAMPLE) -> str:
    """The curl to paste: the example review, or (outside a checkout) any pod through `review`."""
    curl = f"curl -sS --cacert {shlex.quote(ca)} -H 'Content-Type: application/json'"
    url = f"https://{_shown(host)}:{port}/mutate"
    if example.is_file():
        return f"{curl} --data @{shlex.quote(str(example))} {url}"
    return f"initshift review POD.yaml | {curl} --data @- {url}"


def metrics_url(host: str, port: int) -> str:
    """Where `curl` finds the metrics, or why it does not."""
    if not port:
        return "metrics off (INITSHIFT_METRICS_PORT=0)"
    return f"metrics on http://{_shown(host)}:{port}/metrics"


def main(argv: list[str]) -> int:
    ap = Parser(prog=_PROG, description=__doc__.split("\n\n")[0],
                epilog="Exit codes: 0 stopped (SIGTERM, Ctrl-C), 1 the certificates, a port, the cluster or the watcher "
                       "failed, 2 usage or settings.")
    ap.add_argument("--dir", type=path_arg, default=_RUN_DIR,
                    help="where the CA and certificate live (default: %(default)s)")
    ap.add_argument("--watch", action="store_true", help="also run the watcher (needs a cluster)")
    add_kubeconfig_args(ap)
    from ._serve import run

    args = ap.parse_args(argv)
    run_dir = Path(args.dir)
    try:
        settings = _dev_settings(run_dir, os.environ)
    except SettingsError as e:
        print(f"{_PROG}: {e}", file=sys.stderr)
        return EXIT_USAGE
    from certs.pki import PKIError

    from .. import logs

    logs.configure(settings.server.log_level)  # from here on stderr is JSON; the banner goes to stdout
    try:
        ca = _ensure_certs(run_dir, settings.server.host)
    except (PKIError, OSError) as e:
        return fatal(_PROG, f"certificates in {run_dir}: {describe(e)}")
    srv = settings.server
    pipe = (" | python3 -c 'import sys,json,base64; r=json.load(sys.stdin)[\"response\"]; "
            "print(json.dumps(r.get(\"warnings\"))); "
            "print(json.dumps(json.loads(base64.b64decode(r.get(\"patch\",\"\")) or \"[]\"), indent=1))'")

    def banner(server: "HttpsServer") -> None:
        # The bound ports: INITSHIFT_PORT=0 asks for any free one.
        gate = "on" if settings.feature_gate else "off"
        curl = _curl_command(ca, srv.host, server.port)
        print(f"\ninitshift dev-server on https://{_shown(srv.host)}:{server.port} (feature gate {gate}, CA {ca})\n"
              f"{metrics_url(srv.host, server.metrics_port or 0)}\n"
              f"try:\n  {curl}\ndecoded patch:\n  {curl}{pipe}\n", flush=True)

    return run(settings, watch=args.watch, on_started=banner, kube=(args.kubeconfig, args.context), prog=_PROG)
