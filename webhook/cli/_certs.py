"""`initshift certs create|inject`: certificates for a webhook whose certificates are not
self-managed (or to bootstrap one by hand)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ..settings import Settings, SettingsError

from .. import kube
from certs import pki, store
from certs.rotation import merge_bundle
from ._common import EXIT_ERROR, EXIT_USAGE, Parser, add_kubeconfig_args, describe


class _Usage(Exception):
    """Flags that do not go together (exit 2)."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _parser(settings: Settings) -> argparse.ArgumentParser:
    srv = settings.server
    ap = Parser(prog="initshift certs", description="Create certificates or inject the CA.",
                epilog="Exit codes: 0 done, 1 a file, the certificate or the cluster failed, 2 usage or settings.")
    sub = ap.add_subparsers(dest="action", required=True)

    c = sub.add_parser("create", help="CA + serving certificate for the webhook Service")
    c.add_argument("--out", default="certs-out", help="directory for ca.crt, ca.key, tls.crt, tls.key")
    c.add_argument("--name", default=srv.service_name, help="Service name (default: %(default)s)")
    c.add_argument("--namespace", default=srv.namespace, help="Service namespace (default: %(default)s)")
    c.add_argument("--dns", action="append", default=[], help="extra DNS name (repeatable)")
    c.add_argument("--ip", action="append", default=[], help="IP SAN (repeatable)")
    c.add_argument("--days", type=_positive, default=pki.CERT_DAYS, help="serving certificate lifetime (days)")
    c.add_argument("--ca-days", type=_positive, default=pki.CA_DAYS, help="CA lifetime (days)")
    c.add_argument("--ca-cert", help="sign with this existing CA certificate (with --ca-key)")
    c.add_argument("--ca-key", help="key of --ca-cert")
    c.add_argument("--secret", help="also write a kubernetes.io/tls Secret with this name in --namespace")
    add_kubeconfig_args(c)

    i = sub.add_parser("inject", help="put a CA bundle into the MutatingWebhookConfiguration's caBundle")
    i.add_argument("--ca-file", required=True, help="PEM file with the CA certificate(s)")
    i.add_argument("--webhook-config", default=srv.webhook_config, help="configuration name (default: %(default)s)")
    i.add_argument("--keep-old", action="store_true",
                   help="keep the CAs already trusted (for a rotation: trust old and new until the new is in use)")
    add_kubeconfig_args(i)
    return ap


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise pki.PKIError(f"cannot read {what} {path}: {e.strerror}") from None


async def _with_client(args: argparse.Namespace, action):  # noqa: ANN001 - a coroutine function of the client
    async with await kube.KubeApi.from_config(args.kubeconfig, args.context) as api:
        return await action(api)


def create(args: argparse.Namespace) -> int:
    if bool(args.ca_cert) != bool(args.ca_key):
        raise _Usage("--ca-cert and --ca-key go together")
    if args.ca_cert:
        ca = pki.KeyPair(_read(args.ca_cert, "CA certificate"), _read(args.ca_key, "CA key"))
        if not pki.matches_key(ca):
            raise pki.PKIError(f"{args.ca_key} is not the key of {args.ca_cert}")
    else:
        ca = pki.create_ca(days=args.ca_days)
    dns = [*pki.service_dns_names(args.name, args.namespace), *args.dns]
    serving = pki.create_serving(ca, dns, args.ip, days=args.days)
    # An existing CA's key stays where the user keeps it; a new one is written next to the cert.
    store.write_dir(args.out, ca, serving, ca_key=not args.ca_cert)
    print(f"wrote {args.out}/{{{store.CA_CERT},{store.TLS_CERT},{store.TLS_KEY}}} for {', '.join(dns)}")
    if args.secret:
        data = store.secret_data(serving, ca.cert_pem)

        async def write(api):  # noqa: ANN001, ANN202
            await kube.write_secret(api, args.namespace, args.secret, data)

        asyncio.run(_with_client(args, write))
        print(f"wrote Secret {args.namespace}/{args.secret} ({store.SECRET_TYPE})")
    return 0


def inject(args: argparse.Namespace) -> int:
    new = pki.load_certs(_read(args.ca_file, "CA file"))
    if not new:
        raise pki.PKIError(f"{args.ca_file} holds no certificate")

    async def run(api):  # noqa: ANN001, ANN202
        certs = list(new)
        if args.keep_old:
            certs = merge_bundle(new[0], [*new[1:], *await kube.read_ca_bundle(api, args.webhook_config)],
                                 pki.utcnow())
        return await kube.inject_ca_bundle(api, args.webhook_config, pki.bundle(certs)), len(certs)

    changed, count = asyncio.run(_with_client(args, run))
    print(f"MutatingWebhookConfiguration {args.webhook_config}: caBundle ({count} CA) set on {changed} webhook(s)"
          if changed else f"MutatingWebhookConfiguration {args.webhook_config}: caBundle already up to date")
    return 0


def main(argv: list[str]) -> int:
    try:
        settings = Settings.from_env()
    except SettingsError as e:
        print(f"initshift certs: {e}", file=sys.stderr)
        return EXIT_USAGE
    args = _parser(settings).parse_args(argv)
    try:
        return create(args) if args.action == "create" else inject(args)
    except _Usage as e:
        print(f"initshift certs: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (pki.PKIError, kube.KubeError) as e:
        print(f"initshift certs: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:
        print(f"initshift certs: {describe(e)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
