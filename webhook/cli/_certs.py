"""`initshift certs create|inject`: certificates for a webhook whose certificates are not
self-managed (or to bootstrap one by hand).

`create` keeps a CA it finds in `--out` (as kubeadm keeps its CA): running it again renews
the serving pair and the caBundle stays valid. It never replaces a CA key without `--force`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from ..settings import Settings, SettingsError

from .. import k8snames, kube
from certs import pki, store
from certs.rotation import merge_bundle
from ._common import (EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError, Parser, add_kubeconfig_args, describe,
                      name_arg, path_arg, whole_number)

_CREATE_EXITS = ("Exit codes: 0 written, 1 a file in --out or the Secret cannot be written, 2 usage or bad "
                 "input (--ca-cert that is not a CA or not the key's, a CA already in --out that cannot be "
                 "kept, a bad name or IP).")
_INJECT_EXITS = ("Exit codes: 0 set or already up to date, 1 the cluster failed, 2 usage or bad input (--ca-file "
                 "missing or without a certificate).")


def _argument(check):  # noqa: ANN001, ANN202 - a pki check as an argparse type
    def parse(text: str) -> str:
        try:
            return check(text)
        except pki.PKIError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def _ip(text: str) -> str:
    return str(pki.parse_ips([text])[0])


_MAX_DAYS = 36500  # a hundred years: far enough, and every date stays a valid X.509 time
_days = whole_number(1, _MAX_DAYS, "days")


def _parser(settings: Settings) -> argparse.ArgumentParser:
    srv = settings.server
    ap = Parser(prog="initshift certs", description="Create certificates or inject the CA.",
                epilog="Exit codes: 0 done, 1 a file to write or the cluster failed, 2 usage, settings or bad input.")
    sub = ap.add_subparsers(dest="action", required=True)

    c = sub.add_parser("create", help="CA + serving certificate for the webhook Service", epilog=_CREATE_EXITS,
                       description="Write a CA (ca.crt, ca.key) and a serving certificate for the Service "
                                   "(tls.crt, tls.key) to --out. A CA already there is kept and signs the new "
                                   "serving certificate, so the caBundle stays valid; --force replaces it.")
    c.add_argument("--out", type=path_arg, default="certs-out", help="directory for ca.crt, ca.key, tls.crt, tls.key")
    # The rules INITSHIFT_SERVICE_NAME and INITSHIFT_NAMESPACE hold them to: a Service's name
    # starts with a letter (RFC 1035), a namespace's may start with a digit (RFC 1123).
    c.add_argument("--name", type=name_arg(k8snames.DNS_1035_LABEL), default=srv.service_name,
                   help="Service name (default: %(default)s)")
    c.add_argument("--namespace", type=name_arg(k8snames.DNS_LABEL), default=srv.namespace,
                   help="Service namespace (default: %(default)s)")
    c.add_argument("--dns", action="append", type=_argument(pki.check_dns_name), default=[],
                   help="extra DNS name (repeatable)")
    c.add_argument("--ip", action="append", type=_argument(_ip), default=[], help="IP SAN (repeatable)")
    c.add_argument("--days", type=_days, default=pki.CERT_DAYS, help="serving certificate lifetime (days)")
    c.add_argument("--ca-days", type=_days, default=pki.CA_DAYS, help="lifetime of a new CA (days)")
    c.add_argument("--ca-cert", type=path_arg,
                   help="sign with this CA certificate and --ca-key instead; the CA's own issuers may follow it in "
                        "the file")
    c.add_argument("--ca-key", type=path_arg, help="key of --ca-cert")
    c.add_argument("--force", action="store_true", help="replace a CA already in --out")
    c.add_argument("--secret", type=name_arg(k8snames.DNS_SUBDOMAIN),
                   help="also write a kubernetes.io/tls Secret with this name in --namespace")
    add_kubeconfig_args(c)

    i = sub.add_parser("inject", help="put a CA bundle into the MutatingWebhookConfiguration's caBundle",
                       epilog=_INJECT_EXITS, description="Set the caBundle of every webhook of the "
                                                         "MutatingWebhookConfiguration to the CA(s) of --ca-file "
                                                         "(with --keep-old, and those it trusts already).")
    i.add_argument("--ca-file", type=path_arg, required=True, help="PEM file with the CA certificate(s)")
    i.add_argument("--webhook-config", type=name_arg(k8snames.DNS_SUBDOMAIN), default=srv.webhook_config,
                   help="configuration name (default: %(default)s)")
    i.add_argument("--keep-old", action="store_true",
                   help="keep the CAs already trusted (for a rotation: trust old and new until the new is in use)")
    add_kubeconfig_args(i)
    return ap


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {what} {describe(e)}", EXIT_USAGE) from None


def _given_ca(cert_path: str, key_path: str) -> pki.KeyPair:
    """--ca-cert and --ca-key, when they can sign a serving certificate that verifies."""
    ca = pki.KeyPair(_read(cert_path, "CA certificate"), _read(key_path, "CA key"))
    try:
        pki.load_certs(ca.cert_pem)  # every certificate of the file, not only the first, is PEM
        pki.check_ca(ca)
    except pki.PKIError as e:
        raise CliError(f"--ca-cert {cert_path} --ca-key {key_path}: {e}", EXIT_USAGE) from None
    return ca


def _kept_ca(out: Path) -> pki.KeyPair | None:
    """The CA a previous run left in `out`, to sign with again; None when there is none.
    CliError when something there would be lost: a CA key without a usable CA beside it,
    or a CA certificate whose key is elsewhere."""
    cert, key = out / store.CA_CERT, out / store.CA_KEY
    if not key.exists():
        if cert.exists():
            raise CliError(f"{cert} is a CA whose key is not in {out}: sign with it again with --ca-cert {cert} "
                           f"--ca-key KEY, or --force to replace it with a new CA", EXIT_USAGE)
        return None
    ca = pki.KeyPair(_read(cert, "the CA certificate") if cert.exists() else b"", _read(key, "the CA key"))
    try:
        if not ca.cert_pem:
            raise pki.PKIError(f"{store.CA_CERT} is missing")
        pki.check_ca(ca)
    except pki.PKIError as e:
        raise CliError(f"{out} holds a CA key that cannot be kept ({e}): --force replaces the CA (then inject the "
                       f"new {store.CA_CERT})", EXIT_USAGE) from None
    return ca


def _other_key(out: Path, ca: pki.KeyPair) -> Path | None:
    """`out`'s ca.key when it is not the key of `ca` (a CA made there before)."""
    key = out / store.CA_KEY
    if not key.exists():
        return None
    return None if pki.matches_key(pki.KeyPair(ca.cert_pem, _read(key, "the CA key"))) else key


def _first_cert(path: Path) -> x509.Certificate | None:
    """The CA certificate a previous run wrote there, if it reads as one."""
    try:
        return pki.load_cert(path.read_bytes())
    except (OSError, pki.PKIError):
        return None


def _until(cert: x509.Certificate) -> str:
    return f"valid until {cert.not_valid_after_utc:%Y-%m-%d}"


@dataclass
class _Plan:
    """What `certs create` writes to `out`, and what it found there."""

    out: Path
    ca: pki.KeyPair
    made: str  # new, kept (found in out) or given (--ca-cert)
    serving: pki.KeyPair
    names: list[str]
    before: x509.Certificate | None  # the CA certificate out held
    had_ca: bool  # out held a CA certificate or key
    stale: Path | None  # out's key of another CA, removed with --force


def _plan(args: argparse.Namespace) -> _Plan:
    if bool(args.ca_cert) != bool(args.ca_key):
        raise CliError("--ca-cert and --ca-key go together", EXIT_USAGE)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out}: not a directory", EXIT_USAGE)
    before = _first_cert(out / store.CA_CERT)
    stale: Path | None = None
    if args.ca_cert:
        ca, made = _given_ca(args.ca_cert, args.ca_key), "given"
        stale = _other_key(out, ca)
        if stale is not None and not args.force:
            raise CliError(f"{stale} is the key of another CA: choose another --out, or --force to replace that "
                           "CA", EXIT_USAGE)
    else:
        kept = None if args.force else _kept_ca(out)
        ca, made = (kept, "kept") if kept is not None else (pki.create_ca(days=args.ca_days), "new")
    names = [*pki.service_dns_names(args.name, args.namespace), *args.dns]
    serving = pki.create_serving(ca, names, args.ip, days=args.days)
    return _Plan(out, ca, made, serving, names, before, before is not None or (out / store.CA_KEY).exists(), stale)


def _write(plan: _Plan, args: argparse.Namespace) -> None:
    """The files, and a line for each thing done."""
    out, ca = plan.out, plan.ca
    # A given CA's key stays where the user keeps it; a new one is written next to the cert.
    store.write_dir(out, ca, plan.serving, ca_key=plan.made == "new")
    if plan.stale is not None:
        plan.stale.unlink()
    ca_cert = out / store.CA_CERT
    if plan.made == "new":
        print(f"{'replaced the CA in' if plan.had_ca else 'wrote a new CA to'} {out}: {ca_cert}, "
              f"{out / store.CA_KEY} ({_until(ca.cert)})")
    elif plan.made == "kept":
        print(f"kept the CA in {out} ({store.CA_CERT}, {store.CA_KEY}; {_until(ca.cert)}): the caBundle need not "
              "change")
    else:
        print(f"wrote {ca_cert}: the CA of --ca-cert ({_until(ca.cert)}; its key stays in {args.ca_key})"
              + (f"; removed {plan.stale}, the previous CA's key" if plan.stale else ""))
    # create_serving ends the certificate with its CA at the latest: say so when it did.
    cut = plan.serving.cert.not_valid_after_utc == ca.cert.not_valid_after_utc
    until = _until(plan.serving.cert) + (", the CA's end: --force or another --ca-cert for longer" if cut else "")
    print(f"wrote {out / store.TLS_CERT}, {out / store.TLS_KEY} ({until}) for {', '.join([*plan.names, *args.ip])}")
    if plan.had_ca and plan.made != "kept" and ca.cert != plan.before:
        print(f"the caBundle must trust the new CA: initshift certs inject --ca-file {ca_cert} --keep-old")


def create(args: argparse.Namespace) -> int:
    plan = _plan(args)
    if not args.secret:
        _write(plan, args)
        return EXIT_OK

    async def write(api):  # noqa: ANN001, ANN202
        _write(plan, args)  # once the cluster's configuration is known: a missing kubeconfig writes nothing
        await _warn_if_self_managed(api, args.namespace, args.secret)
        await kube.write_secret(api, args.namespace, args.secret, store.secret_data(plan.serving, plan.ca.cert_pem))

    asyncio.run(_with_client(args, write))
    print(f"wrote Secret {args.namespace}/{args.secret} ({store.SECRET_TYPE})")
    return EXIT_OK


async def _warn_if_self_managed(api: kube.KubeApi, namespace: str, name: str) -> None:
    """A Secret holding `ca.key` is a self-managed server's: it replaces a CA written there
    by hand at its next start. Said, not refused (the Secret may be left from a switch of
    modes); without `get` on Secrets nothing is said."""
    try:
        data = await kube.read_secret(api, namespace, name)
    except kube.KubeError as e:
        if e.status == 403:
            return
        raise
    if data and store.CA_KEY in data:
        print(f"warning: Secret {namespace}/{name} holds a {store.CA_KEY}: a self-managed server "
              f"(INITSHIFT_SELF_MANAGED_CERTS) keeps its own CA there and makes a new one at its next start; "
              f"to start a self-managed install's certificates over, delete the Secret and restart the server",
              file=sys.stderr)


async def _with_client(args: argparse.Namespace, action):  # noqa: ANN001 - a coroutine function of the client
    async with await kube.KubeApi.from_config(args.kubeconfig, args.context) as api:
        return await action(api)


def inject(args: argparse.Namespace) -> int:
    try:
        new = pki.load_certs(_read(args.ca_file, "CA file"))
    except pki.PKIError as e:
        raise CliError(f"{args.ca_file}: {e}", EXIT_USAGE) from None
    if not new:
        raise CliError(f"{args.ca_file} holds no certificate", EXIT_USAGE)
    for cert in new:
        if not pki.is_ca(cert):  # a serving certificate given by mistake: it pins itself, nothing it renews to
            print(f"warning: {args.ca_file}: {pki.subject_of(cert)} is not a CA: the apiserver will trust that "
                  "exact certificate alone, and the webhook fails once it is renewed", file=sys.stderr)

    async def run(api):  # noqa: ANN001, ANN202
        certs = list(new)
        if args.keep_old:
            certs = merge_bundle(new[0], [*new[1:], *await kube.read_ca_bundle(api, args.webhook_config)],
                                 pki.utcnow())
        return await kube.inject_ca_bundle(api, args.webhook_config, pki.bundle(certs)), len(certs)

    changed, count = asyncio.run(_with_client(args, run))
    print(f"MutatingWebhookConfiguration {args.webhook_config}: caBundle ({count} CA) set on {changed} webhook(s)"
          if changed else f"MutatingWebhookConfiguration {args.webhook_config}: caBundle already up to date")
    return EXIT_OK


def main(argv: list[str]) -> int:
    try:
        settings = Settings.from_env()
    except SettingsError as e:
        print(f"initshift certs: {e}", file=sys.stderr)
        return EXIT_USAGE
    args = _parser(settings).parse_args(argv)
    try:
        return create(args) if args.action == "create" else inject(args)
    except CliError as e:
        print(f"initshift certs {args.action}: {e}", file=sys.stderr)
        return e.code
    except (pki.PKIError, kube.KubeError) as e:
        print(f"initshift certs {args.action}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as e:
        print(f"initshift certs {args.action}: {describe(e)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
