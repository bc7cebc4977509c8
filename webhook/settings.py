"""The one settings object: environment variables with the INITSHIFT_ prefix plus the
feature gate SUPPORT_INJECTED_SIDECARS.

Each field names its variable and says what it does in its metadata; `settings_table()`
renders the settings table of docs/admission-server.md from the same metadata, so docs and
code cannot drift.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from waiter import protocol as p

from . import __version__, imageref, k8snames
from .errors import InitshiftError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingsError(InitshiftError, ValueError):
    """A variable has a value the server cannot use."""


def _env(name: str, doc: str, default: Any, **kw: Any) -> Any:
    meta = {"env": name, "doc": doc, **kw}
    if isinstance(default, (list, dict, tuple)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _choice(*values: str) -> dict[str, tuple[str, ...]]:
    return {"choices": values}


_PORT = {"port": True}
# A number may be 0 only where 0 means something (none, never, at once, no cache);
# any number is finite and never negative.
_ZERO_OK = {"zero_ok": True}


def _max(limit: int) -> dict[str, int]:
    """The largest value that makes sense: a typo of a few digits is refused, not obeyed."""
    return {"max": limit}


_INT32_MAX = 2**31 - 1
# A path the server must read: empty is refused (a setting that may be empty says what it means).
_FILE = {"file": True}

# Kubernetes object names are checked where they are read, not at the first API call that
# uses them: a Namespace is an RFC 1123 label, a Service an RFC 1035 label, a Secret, a
# Lease and a MutatingWebhookConfiguration an RFC 1123 subdomain.
def _name(kind: str) -> dict[str, str]:
    return {"k8s_name": kind}


def name_problem(value: str, kind: str) -> str | None:
    """Why `value` is no Kubernetes name of `kind`, in the words every setting and flag uses."""
    if k8snames.is_name(value, kind):
        return None
    return (f"expected a Kubernetes name ({kind}: lower-case letters, digits and '-'"
            f"{', and dots' if kind == k8snames.DNS_SUBDOMAIN else ''}"
            f"{', a letter first' if kind == k8snames.DNS_1035_LABEL else ''}, at most "
            f"{k8snames.RULES[kind][1]} characters), got {value!r}")


def _check_name(value: str, kind: str, variable: str) -> str:
    problem = name_problem(value, kind)
    if problem:
        raise SettingsError(f"{variable}: {problem}")
    return value


def port_number(text: str, name: str = "port") -> int:
    """A TCP port from text (0: any free one), or SettingsError saying what a port is."""
    try:
        port = int(text.strip())
    except ValueError:
        raise SettingsError(f"{name}: expected a port number (0 to 65535), got {text.strip()!r}") from None
    if not 0 <= port <= 65535:
        raise SettingsError(f"{name}: expected a port number (0 to 65535), got {port}")
    return port


@dataclass(frozen=True)
class RewriteSettings:
    mode: str = _env("INITSHIFT_MODE", "Strategy when a pod does not set `initshift.io/mode`.",
                     p.MODE_AUTO, **_choice(*p.MODES))
    native_sidecars: str = _env(
        "INITSHIFT_NATIVE_SIDECARS",
        "Whether the cluster runs native sidecars: `auto` detects it from the apiserver and kubelet versions.",
        "auto", **_choice("auto", "true", "false"))
    native_refresh_seconds: float = _env(
        "INITSHIFT_NATIVE_REFRESH_SECONDS",
        "How often `auto` native-sidecar detection re-reads the apiserver and kubelet versions.", 300.0)
    image: str = _env("INITSHIFT_IMAGE", "Image of the injected `initshift-init` (hybrid: `initshift-copy`) "
                      "container, which holds the waiter: this version's image (the rewrite writes the flags its "
                      "waiter reads).", f"ghcr.io/initshift/initshift:{__version__}",
                      image_ref=True)
    image_pull_policy: str = _env("INITSHIFT_IMAGE_PULL_POLICY", "pullPolicy of `initshift-init` and `initshift-copy`.",
                                  "IfNotPresent", **_choice("IfNotPresent", "Always", "Never"))
    image_pull_secrets: tuple[str, ...] = _env(
        "INITSHIFT_IMAGE_PULL_SECRETS",
        "Secrets added to the `imagePullSecrets` of every pod given `initshift-init` or `initshift-copy` (comma "
        "list of names, each a Secret in the pod's own namespace), for an INITSHIFT_IMAGE the nodes cannot pull "
        "anonymously, as Istio's `global.imagePullSecrets` does for its proxy; empty: the pod's own only.",
        (), **_name(k8snames.DNS_SUBDOMAIN))
    sidecar_names: tuple[str, ...] = _env("INITSHIFT_SIDECAR_NAMES", "Container names treated as sidecars (comma list).",
                                          p.DEFAULT_SIDECAR_NAMES)
    mesh_init_names: tuple[str, ...] = _env("INITSHIFT_MESH_INIT_NAMES",
                                            "Init containers of the mesh, always kept as init containers (comma list).",
                                            p.DEFAULT_MESH_INIT_NAMES)
    quit_endpoints: dict[str, str] = _env(
        "INITSHIFT_QUIT_ENDPOINTS",
        "Sidecar quit endpoints, `name=url` comma list; the last main POSTs them (`istio-proxy`'s on the "
        "status port pilot-agent reads where the pod or the mesh moves it: `status.sidecar.istio.io/port`, "
        "`statusPort` of `proxy.istio.io/config` or of the proxy's `PROXY_CONFIG`; `linkerd-proxy`'s on the "
        "port of its `LINKERD2_PROXY_ADMIN_LISTEN_ADDR`).",
        dict(p.DEFAULT_QUIT_ENDPOINTS), urls=True)
    resources_policy: str = _env("INITSHIFT_RESOURCES_POLICY",
                                 "How step requests are redistributed: `preserve`, `divide` or `keep`.",
                                 "preserve", **_choice("preserve", "divide", "keep"))
    on_unresolved: str = _env(
        "INITSHIFT_ON_UNRESOLVED",
        "A step without `command` whose entrypoint cannot be found (or, differing by platform, is over one exec "
        "argument's 128 KiB), where the strategy needs it: `deny` the pod "
        "or `admit` it unchanged (`auto` gives such a pod native where the cluster runs native sidecars).",
        "deny", **_choice("deny", "admit"))
    step_timeout_seconds: int = _env("INITSHIFT_STEP_TIMEOUT_SECONDS",
                                     "Per-step timeout passed to the waiter; 0 means none.", 0, **_ZERO_OK)
    start_order_max_wait_seconds: int = _env(
        "INITSHIFT_START_ORDER_MAX_WAIT_SECONDS",
        "Seconds a container gated by `initshift.io/start-order` waits before it exits non-zero; 0 waits forever.", 0, **_ZERO_OK)


@dataclass(frozen=True)
class ServerSettings:
    host: str = _env("INITSHIFT_HOST", "Address the HTTPS server binds; empty: every address, IPv6 and IPv4 "
                     "(IPv4 only where the node has no IPv6), as on an IPv6-only or dual-stack cluster.", "")
    port: int = _env("INITSHIFT_PORT", "Port the HTTPS server listens on (admission and health only).", 8443,
                     **_PORT)
    metrics_port: int = _env("INITSHIFT_METRICS_PORT",
                             "Plain-HTTP port serving `/metrics` (Prometheus); 0 turns it off.", 8080, **_PORT)
    metrics_host: str = _env("INITSHIFT_METRICS_HOST",
                             "Address the metrics port binds; empty: INITSHIFT_HOST (every address by default, "
                             "which a scrape through the pod IP or a Service needs).", "")
    tls_cert: str = _env("INITSHIFT_TLS_CERT", "Serving certificate (PEM); reloaded when it changes.",
                         "/etc/initshift/tls/tls.crt", **_FILE)
    tls_key: str = _env("INITSHIFT_TLS_KEY", "Serving key (PEM); reloaded when it changes.",
                        "/etc/initshift/tls/tls.key", **_FILE)
    client_ca: str = _env("INITSHIFT_CLIENT_CA", "CA bundle to verify client certificates; empty: no verification.", "")
    # The apiserver takes request bodies up to 3 MiB (its MaxRequestBodyBytes, twice etcd's
    # 1.5 MiB object limit) and sends the pod back as JSON with defaults, managedFields and
    # the review around it; docs/admission-server.md#the-body-limit says why 4 MiB.
    max_body_bytes: int = _env("INITSHIFT_MAX_BODY_BYTES", "Largest AdmissionReview accepted (bytes); larger: "
                               "HTTP 413.", 4 * 1024 * 1024)
    max_connections: int = _env(
        "INITSHIFT_MAX_CONNECTIONS",
        "Open connections on the HTTPS port; a new one past it closes, of the client address holding the most, "
        "the one waiting longest (for its request, its body or its turn).",
        128)
    max_header_bytes: int = _env(
        "INITSHIFT_MAX_HEADER_BYTES",
        "Largest request head (request line and header fields, however it arrives); more: HTTP 431, "
        "connection closed.", 32 * 1024)
    header_timeout_seconds: float = _env(
        "INITSHIFT_HEADER_TIMEOUT_SECONDS",
        "Seconds a connection has for its TLS handshake and its request's head, from its start or the "
        "head's first byte.", 5.0)
    body_timeout_seconds: float = _env(
        "INITSHIFT_BODY_TIMEOUT_SECONDS",
        "Seconds a request has, from its head, to send its whole body (else HTTP 408; a large review "
        "waiting for its turn meanwhile: HTTP 503).", 10.0)
    keepalive_timeout_seconds: float = _env(
        "INITSHIFT_KEEPALIVE_TIMEOUT_SECONDS",
        "Seconds a kept-alive connection waits for its next request; keep it above the apiserver's 90 s "
        "(a server closing first can lose a review the apiserver is sending).", 120.0)
    write_timeout_seconds: float = _env(
        "INITSHIFT_WRITE_TIMEOUT_SECONDS",
        "Seconds an answer may wait for its client to read it (the connection's send buffer full) "
        "before the connection is dropped.", 10.0)
    failure_mode: str = _env("INITSHIFT_FAILURE_MODE",
                             "An internal rewrite error: `ignore` (admit unchanged, warn) or `deny`.",
                             "ignore", **_choice("ignore", "deny"))
    namespace: str = _env("INITSHIFT_NAMESPACE", "The webhook's own namespace, never mutated.", "initshift-system",
                          **_name(k8snames.DNS_LABEL))
    service_name: str = _env("INITSHIFT_SERVICE_NAME", "Service name used in certificate DNS names.", "initshift",
                             **_name(k8snames.DNS_1035_LABEL))
    webhook_config: str = _env("INITSHIFT_WEBHOOK_CONFIG", "MutatingWebhookConfiguration to inject the caBundle into.",
                               "initshift-webhook", **_name(k8snames.DNS_SUBDOMAIN))
    self_managed_certs: bool = _env("INITSHIFT_SELF_MANAGED_CERTS",
                                    "Create/renew the certificate and inject the caBundle at start-up.", False)
    cert_secret: str = _env("INITSHIFT_CERT_SECRET", "Secret holding the serving certificate (self-managed mode).",
                            "initshift-tls", **_name(k8snames.DNS_SUBDOMAIN))
    renew_before_days: int = _env("INITSHIFT_RENEW_BEFORE_DAYS", "Renew the certificate this many days before expiry.", 30,
                                    **_ZERO_OK)
    log_level: str = _env("INITSHIFT_LOG_LEVEL", "Log level.", "info", **_choice("debug", "info", "warning", "error"))


@dataclass(frozen=True)
class WatcherSettings:
    namespaces: tuple[str, ...] = _env("INITSHIFT_WATCH_NAMESPACES", "Namespaces to watch (comma list); empty: all.", (),
                                       **_name(k8snames.DNS_LABEL))
    grace_seconds: float = _env("INITSHIFT_GRACE_SECONDS",
                                "Seconds a sidecar may keep running after the outcome before the pod is ended.", 10.0,
                                **_ZERO_OK)
    sidecar_ready_timeout_seconds: float = _env("INITSHIFT_SIDECAR_READY_TIMEOUT_SECONDS",
                                                "Seconds sidecars may take to become Ready before the pod fails.", 600.0)
    resync_seconds: float = _env("INITSHIFT_RESYNC_SECONDS",
                                 "Periodic full re-list; 0: never (pods re-listed only on 410 Gone or a failed list).", 0.0,
                                 **_ZERO_OK)
    leader_election: bool = _env("INITSHIFT_LEADER_ELECTION",
                                 "Use a Lease: the holder acts at once, the others only on work it left overdue.",
                                 True)
    lease_name: str = _env("INITSHIFT_LEASE_NAME", "Name of the leader-election Lease.", "initshift-watcher",
                          **_name(k8snames.DNS_SUBDOMAIN))
    lease_seconds: float = _env("INITSHIFT_LEASE_SECONDS", "Lease duration.", 15.0,
                                **_max(_INT32_MAX))  # the Lease's leaseDurationSeconds is an int32
    renew_seconds: float = _env("INITSHIFT_WATCHER_RENEW_SECONDS",
                                "How often the holder renews the Lease (and a follower retries it); each attempt "
                                "may take this long at most.", 2.0)
    renew_deadline_seconds: float = _env("INITSHIFT_WATCHER_RENEW_DEADLINE_SECONDS",
                                         "The holder stops leading when it could not renew for this long "
                                         "(below the Lease duration).", 10.0)
    takeover_seconds: float = _env("INITSHIFT_WATCHER_TAKEOVER_SECONDS",
                                   "A replica that does not hold the Lease acts on a pod whose action or Event "
                                   "has been due this long (the standstill after a leader dies silently).", 1.5)
    concurrency: int = _env("INITSHIFT_WATCHER_CONCURRENCY",
                            "Pods acted on at once (one action at a time per pod; Events are sent beside).", 32,
                            **_max(1024))
    request_timeout_seconds: float = _env("INITSHIFT_WATCHER_REQUEST_TIMEOUT_SECONDS",
                                          "Time allowed for one API call of the watcher (not the watch).", 10.0)
    list_page_size: int = _env("INITSHIFT_WATCHER_LIST_PAGE_SIZE",
                               "Pods per page when the watcher lists (bounds its memory on a re-list).", 500,
                               **_max(10_000))


@dataclass(frozen=True)
class RegistrySettings:
    lookup: bool = _env("INITSHIFT_REGISTRY_LOOKUP",
                        "Resolve the ENTRYPOINT of steps without `command` from the registry.", False)
    pull_secrets: bool = _env("INITSHIFT_REGISTRY_PULL_SECRETS",
                              "Read imagePullSecrets and ServiceAccounts for registry credentials (needs RBAC).", False)
    budget_seconds: float = _env("INITSHIFT_REGISTRY_BUDGET_SECONDS",
                                 "Time allowed for all lookups of one review (below the webhook timeout).", 4.0)
    tag_ttl_seconds: float = _env("INITSHIFT_REGISTRY_TAG_TTL_SECONDS", "How long a tag's digest is cached.", 300.0,
                                   **_ZERO_OK)
    cache_size: int = _env("INITSHIFT_REGISTRY_CACHE_SIZE", "Entries kept in the lookup cache.", 1024)
    insecure_registries: tuple[str, ...] = _env("INITSHIFT_REGISTRY_INSECURE",
                                                "Registries reached over plain HTTP (comma list of host[:port]).", ())
    ca_file: str = _env("INITSHIFT_REGISTRY_CA_FILE", "Extra CA bundle for registries; empty: system CAs.", "")


@dataclass(frozen=True)
class Settings:
    feature_gate: bool = _env(p.FEATURE_GATE_ENV,
                              "Feature gate; unset or false admits every pod unchanged.", False)
    rewrite: RewriteSettings = field(default_factory=RewriteSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    watcher: WatcherSettings = field(default_factory=WatcherSettings)
    registry: RegistrySettings = field(default_factory=RegistrySettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        return _load(cls, env)

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)


def _parse(f: dataclasses.Field, raw: str) -> Any:
    name, default = f.metadata["env"], _default(f)
    raw = raw.strip()
    try:
        if isinstance(default, bool):
            if not raw:  # `value: ""` (Helm's `--set x=`) is no choice: the default, as unset
                return default
            low = raw.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise SettingsError(f"{name}: expected true or false, got {raw!r}")
        if f.metadata.get("port"):
            if re.fullmatch(r"(tcp|udp|sctp)://\S+:\d+", raw):
                # The kubelet's Docker-link variable of a Service named like the setting.
                service = name.removesuffix("_PORT").lower().replace("_", "-")
                raise SettingsError(f"{name}: expected a port number, got {raw!r}: the kubelet's variable for the "
                                    f"Service {service!r} of the pod's namespace; set `enableServiceLinks: false` "
                                    f"on the pod (deploy/ does) or give {name} a value")
            return port_number(raw, name)
        if isinstance(default, (int, float)):
            return _number(raw, name, whole=isinstance(default, int), zero_ok=bool(f.metadata.get("zero_ok")),
                           most=f.metadata.get("max"))
        if isinstance(default, tuple):
            items = tuple(x.strip() for x in raw.split(",") if x.strip())
            kind = f.metadata.get("k8s_name")
            return tuple(_check_name(x, kind, name) for x in items) if kind else items
        if isinstance(default, dict):
            out: dict[str, str] = {}
            for item in filter(None, (x.strip() for x in raw.split(","))):
                key, sep, value = item.partition("=")
                if not sep or not key.strip() or not value.strip():
                    raise SettingsError(f"{name}: expected name=value items, got {item!r}")
                if key.strip() in out:
                    raise SettingsError(f"{name}: {key.strip()!r} is given twice")
                out[key.strip()] = value.strip()
            if f.metadata.get("urls"):
                for url in out.values():
                    _check_url(url, name)
            return out
    except ValueError as e:
        if isinstance(e, SettingsError):
            raise
        raise SettingsError(f"{name}: cannot parse {raw!r}: {e}") from None
    choices = f.metadata.get("choices")
    if choices and raw not in choices:
        raise SettingsError(f"{name}: expected one of {', '.join(choices)}, got {raw!r}")
    if f.metadata.get("file") and not raw:
        raise SettingsError(f"{name}: expected a file's path, got an empty value")
    if f.metadata.get("image_ref"):
        try:
            imageref.parse(raw)
        except imageref.InvalidReference as e:
            raise SettingsError(f"{name}: {e}") from None
    kind = f.metadata.get("k8s_name")
    return _check_name(raw, kind, name) if kind else raw


def _check_url(url: str, name: str) -> None:
    """A quit endpoint as the waiter will POST it (its own parser: one rule)."""
    from waiter.loopback import Endpoint

    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"{name}: expected an http:// or https:// URL, got {url!r}")
    try:
        Endpoint.parse(url)
    except ValueError as e:
        raise SettingsError(f"{name}: {e}") from None


def _number(raw: str, name: str, *, whole: bool, zero_ok: bool, most: int | None = None) -> int | float:
    what = "a whole number" if whole else "a number"
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected {what}, got {raw!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise SettingsError(f"{name}: expected {what} {'of 0 or more' if zero_ok else 'above 0'}, got {raw!r}")
    if most is not None and value > most:
        raise SettingsError(f"{name}: expected {what} of at most {most:,}, got {raw!r}")
    return value


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def _load(cls: type, env: Mapping[str, str]) -> Any:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if "env" not in f.metadata:  # a nested section
            values[f.name] = _load(f.default_factory, env)  # type: ignore[arg-type]
        elif f.metadata["env"] in env:
            values[f.name] = _parse(f, env[f.metadata["env"]])
    loaded = cls(**values)
    if cls is WatcherSettings:
        _check_lease_timing(loaded, env)
    return loaded


def _check_lease_timing(w: WatcherSettings, env: Mapping[str, str]) -> None:
    """client-go's order, lease > renew deadline > renew period, for what was set: one left
    unset follows the others (webhook/watcher/_leader.py derives it), one set against
    them is refused rather than quietly clamped."""
    names = {f.name: f.metadata["env"] for f in dataclasses.fields(WatcherSettings)}
    order = [("renew_deadline_seconds", "lease_seconds"), ("renew_seconds", "renew_deadline_seconds")]
    for lower, upper in order:
        if names[lower] in env and getattr(w, lower) >= getattr(w, upper):
            given = "" if names[upper] in env else ", its default"
            raise SettingsError(f"{names[lower]}: expected less than {names[upper]} ({getattr(w, upper):g}{given}), "
                                f"got {env[names[lower]].strip()!r}")


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


# Settings of mechanisms that are gone, and what replaced them: `serve` warns when one is set.
REMOVED = {
    "INITSHIFT_WORKERS": "one server process per pod: scale with the Deployment's replicas",
    "INITSHIFT_MAX_PENDING_REVIEWS": "reviews are taken as they come, large ones one at a time",
    "INITSHIFT_LARGE_REVIEW_BYTES": "reviews over 64 KiB are large, taken one at a time",
    "INITSHIFT_MAX_LARGE_REVIEWS": "large reviews are taken one at a time",
    "INITSHIFT_MAX_BODY_BYTES_IN_FLIGHT": "bodies are read one large review at a time",
    "INITSHIFT_MAX_HEADERS": "INITSHIFT_MAX_HEADER_BYTES bounds a request's head",
    "INITSHIFT_MAX_HEADER_LINE_BYTES": "INITSHIFT_MAX_HEADER_BYTES bounds a request's head",
}


# The kubelet's variables for a Service whose name starts with `initshift` (Docker links:
# INITSHIFT_WEBHOOK_SERVICE_HOST, INITSHIFT_PORT_443_TCP_ADDR, ...), set in every container of
# a pod that does not turn them off: not settings, so never called unknown.
_SERVICE_LINK = re.compile(r"INITSHIFT(_[A-Z0-9_]+)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT"
                           r"|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)")


def settings_warnings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One line for each INITSHIFT_* variable set in `environ` that does nothing: a setting
    of a removed mechanism, or a name no setting has (a typo, with the setting it is closest
    to). The long-running commands log them at start-up; a variable does not fail start-up,
    as a Deployment's env is shared between versions."""
    env = os.environ if environ is None else environ
    known = {row[0] for row in settings_rows()}
    lines = []
    for name in sorted(env):
        if not name.startswith(p.ENV_PREFIX) or name in known:
            continue
        if name in REMOVED:
            lines.append(f"{name} is no longer used ({REMOVED[name]}); remove it")
        elif not _SERVICE_LINK.fullmatch(name):
            # Compared without the prefix they share, which would make any two names close;
            # else a setting the name only adds a word to (INITSHIFT_TLS_CERT_FILE).
            short = [k.removeprefix(p.ENV_PREFIX) for k in known]
            close = difflib.get_close_matches(name.removeprefix(p.ENV_PREFIX), short, n=1, cutoff=0.8) or \
                sorted((k for k in short if name.startswith(f"{p.ENV_PREFIX}{k}_")), key=len)[-1:]
            hint = (f"; did you mean {p.ENV_PREFIX}{close[0]}?" if close
                    else " (docs/admission-server.md lists every setting)")
            lines.append(f"{name} is not an initshift setting and does nothing{hint}")
    return lines


def settings_rows(cls: type = Settings) -> list[tuple[str, str, str]]:
    """(variable, default, description) for every setting, sections in order."""
    rows: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cls):
        if "env" not in f.metadata:
            rows.extend(settings_rows(f.default_factory))  # type: ignore[arg-type]
            continue
        doc = f.metadata["doc"]
        if f.metadata.get("choices"):
            doc += f" One of: {', '.join(f.metadata['choices'])}."
        if f.metadata.get("k8s_name"):
            doc += f" A Kubernetes name ({f.metadata['k8s_name']})."
        if f.metadata.get("max"):
            doc += f" At most {f.metadata['max']:,}."
        rows.append((f.metadata["env"], _fmt(_default(f)), doc))
    return rows


def settings_table() -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for env, default, doc in settings_rows():
        lines.append(f"| `{env}` | `{default}` | {doc} |" if default else f"| `{env}` | (empty) | {doc} |")
    return "\n".join(lines)
