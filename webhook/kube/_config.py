"""Where the API server and the credentials come from: kubectl's rules, in one place.

client-go (and so kubectl) decides in this order:

1. `--kubeconfig FILE`: that file only; a missing file is an error.
2. else `$KUBECONFIG`: every file of the list (`:`-separated), merged; missing files are
   skipped. For each named cluster, user and context, and for `current-context`, the
   first file that sets it wins. Relative paths are relative to the file that holds them.
3. else `~/.kube/config`.
4. Only when 1-3 give an empty configuration (no file, or files without clusters, users
   and contexts): the pod's service account (`KUBERNETES_SERVICE_HOST`/`_PORT` and the
   token file), as client-go's `DeferredLoadingClientConfig` does.

The namespace follows the same source: the context's (else `default`) for a kubeconfig,
`$POD_NAMESPACE` or the service account's namespace file in a pod. Every failure is one
`KubeConfigError` line naming the file or variable at fault; the library's own log lines
never reach a terminal (a NullHandler; `initshift serve` still logs them as JSON).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from ..errors import InitshiftError, os_reason

# The library logs (e.g. "Config not found") on its own logger; without any handler
# Python's last-resort handler would print them, unprefixed, before our one-line error.
logging.getLogger("kubernetes_asyncio").addHandler(logging.NullHandler())

_SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_HOME_CONFIG = Path("~/.kube/config")
_NAMED = ("clusters", "users", "contexts")
# Fields that name files, per section, resolved against the kubeconfig's directory.
_FILE_FIELDS = {"cluster": ("certificate-authority",), "user": ("client-certificate", "client-key", "tokenFile")}
# The fields of each entry (and of a user's `exec`) that are read here or by the library, with
# the type kubectl's Go structs give them: kubectl refuses to load a kubeconfig with another
# type anywhere ("cannot unmarshal"), so do we, in words, instead of failing mid-connection.
_FIELD_TYPES: dict[str, dict[str, type]] = {
    "cluster": {"server": str, "certificate-authority": str, "certificate-authority-data": str,
                "tls-server-name": str, "proxy-url": str, "insecure-skip-tls-verify": bool},
    "user": {"token": str, "tokenFile": str, "client-certificate": str, "client-key": str,
             "client-certificate-data": str, "client-key-data": str, "username": str, "password": str,
             "exec": dict, "auth-provider": dict},
    "context": {"cluster": str, "user": str, "namespace": str},
    "exec": {"command": str, "apiVersion": str, "args": list, "env": list, "installHint": str},
}
_TYPE_NAMES = {str: "a string", bool: "true or false", dict: "a mapping", list: "a list",
               int: "a number", float: "a number"}


class KubeConfigError(InitshiftError):
    """No usable configuration: one line saying which source and why (`KubeApi.from_config`
    hands it on as a `KubeError` with status 0, like an unreachable server)."""


@dataclass(frozen=True)
class _Choice:
    kubeconfig: str | None = None
    context: str | None = None


# The command line's --kubeconfig/--context for the whole process (`use_config`): a server
# reaches the API from several places (certificates, detection, watcher, pull secrets).
_chosen = _Choice()


def use_config(kubeconfig: str | None, context: str | None) -> None:
    """Make `--kubeconfig`/`--context` the default of every later `KubeApi.from_config()`."""
    global _chosen
    _chosen = _Choice(kubeconfig, context)


def chosen(kubeconfig: str | None, context: str | None) -> tuple[str | None, str | None]:
    """The explicit arguments, else the process's `use_config` choice."""
    return kubeconfig or _chosen.kubeconfig, context or _chosen.context


@dataclass
class _Source:
    """The resolved configuration: a merged kubeconfig, or the pod's service account."""

    kind: str  # "kubeconfig" or "in-cluster"
    files: list[str] = field(default_factory=list)  # the kubeconfig files read, in order
    config: dict[str, Any] = field(default_factory=dict)  # merged kubeconfig (kind == "kubeconfig")
    context: str | None = None  # the context in use (kind == "kubeconfig")
    namespace: str = "default"

    def describe(self) -> str:
        if self.kind == "in-cluster":
            return "in-cluster service account"
        return f"kubeconfig {os.pathsep.join(self.files)}, context {self.context}"


# What a kubeconfig that is not a regular file held (`--kubeconfig <(kubectl config view
# --raw)`'s pipe), by its device and inode (another pipe may come under the same
# /dev/fd/N): it reads once, and `serve` builds more than one client from it.
_PIPED: dict[tuple[int, int], str] = {}


def _read(path: Path) -> dict[str, Any]:
    try:
        st = path.stat()
        key = None if stat.S_ISREG(st.st_mode) else (st.st_dev, st.st_ino)
        text = _PIPED.get(key) if key else None
        if text is None:
            text = path.read_bytes().decode()  # UTF-8, as kubectl reads it, whatever the locale
            if key:
                _PIPED[key] = text
        data = yaml.safe_load(text)
    except OSError as e:  # a directory, no permission: kubectl's "error loading config file" too
        raise KubeConfigError(f"kubeconfig {path}: {os_reason(e)}") from None
    except UnicodeDecodeError as e:
        raise KubeConfigError(f"kubeconfig {path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} "
                              f"at offset {e.start})") from None
    except yaml.YAMLError as e:
        raise KubeConfigError(f"kubeconfig {path}: not YAML ({str(e).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise KubeConfigError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping)")
    return data


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _check_types(where: str, fields: Mapping[str, Any], section: str) -> None:
    """Each known field of `fields` has the type kubectl expects (null is its zero value)."""
    for key, want in _FIELD_TYPES[section].items():
        value = fields.get(key)
        if value is not None and not isinstance(value, want):
            raise KubeConfigError(f"{where}: {key} is {_type_name(value)}, not {_TYPE_NAMES[want]}")
    if isinstance(fields.get("exec"), dict):
        _check_types(f"{where}: exec", fields["exec"], "exec")


def _check_entry(path: Path, section: str, entry: dict[str, Any]) -> None:
    """A named entry's body is a mapping (or absent) whose fields have kubectl's types."""
    where = f"kubeconfig {path}: {section} {entry['name']!r}"
    body = entry.get(section)
    if body is None:
        return
    if not isinstance(body, dict):
        raise KubeConfigError(f"{where} is {_type_name(body)}, not a mapping")
    _check_types(where, body, section)


def _absolute(entry: dict[str, Any], section: str, base: Path) -> dict[str, Any]:
    """A copy of a named entry with its relative file paths made absolute."""
    body = entry.get(section)
    if not isinstance(body, dict):
        return entry
    body = dict(body)
    for key in _FILE_FIELDS.get(section, ()):
        value = body.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            body[key] = str(base / os.path.expanduser(value))
    if section == "user" and isinstance(body.get("exec"), dict):
        command = body["exec"].get("command")
        # client-go resolves an exec command only when it is a relative path, not a bare name.
        if isinstance(command, str) and os.sep in command and not os.path.isabs(command):
            body["exec"] = {**body["exec"], "command": str(base / command)}
    return {**entry, section: body}


def merge(files: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """kubectl's merge: the first file that names an entry (or sets current-context) wins."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": []}
    for path, data in files:
        base = path.parent
        for key in _NAMED:
            entries = data.get(key) or []
            if not isinstance(entries, list):
                raise KubeConfigError(f"kubeconfig {path}: {key} is not a list")
            section = key[:-1]
            seen = {e.get("name") for e in merged[key]}
            for entry in entries:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    raise KubeConfigError(f"kubeconfig {path}: an entry of {key} has no name")
                _check_entry(path, section, entry)
                if entry["name"] not in seen:
                    merged[key].append(_absolute(entry, section, base))
                    seen.add(entry["name"])
        if data.get("current-context") and "current-context" not in merged:
            merged["current-context"] = data["current-context"]
    return merged


def _kubeconfig_files(explicit: str | None, environ: Mapping[str, str], home: Path | None = None) -> list[Path]:
    """The files kubectl would read, in precedence order (steps 1-3)."""
    if explicit:
        return [Path(os.path.expanduser(explicit))]
    listed = environ.get("KUBECONFIG", "")
    if listed:
        paths = [Path(os.path.expanduser(p)) for p in listed.split(os.pathsep) if p]
        return list(dict.fromkeys(paths))
    return [home / ".kube" / "config" if home is not None else Path(os.path.expanduser(str(_HOME_CONFIG)))]


def _in_cluster_possible(environ: Mapping[str, str], sa_dir: Path) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and bool(environ.get("KUBERNETES_SERVICE_PORT")) and \
        (sa_dir / "token").is_file()


def resolve(kubeconfig: str | None = None, context: str | None = None, *,
            environ: Mapping[str, str] | None = None, home: Path | None = None,
            sa_dir: Path = _SERVICE_ACCOUNT_DIR) -> _Source:
    """Which configuration kubectl would use (see the module docstring)."""
    env = os.environ if environ is None else environ
    paths = _kubeconfig_files(kubeconfig, env, home)
    if kubeconfig and not paths[0].exists():
        raise KubeConfigError(f"kubeconfig {paths[0]}: no such file")
    # Whatever exists is read, as kubectl reads it: a pipe (`--kubeconfig <(kubectl config
    # view --raw)`) or /dev/null as well as a file; a directory is an error, said by _read.
    found = [(p, _read(p)) for p in paths if p.exists()]
    merged = merge(found)
    if any(merged[key] for key in _NAMED) or context:
        name = context or merged.get("current-context")
        where = os.pathsep.join(str(p) for p, _ in found) or os.pathsep.join(str(p) for p in paths)
        # Which contexts there are, said where one is missing: what `kubectl config
        # get-contexts` would be run for next.
        names = ", ".join(repr(c["name"]) for c in merged["contexts"]) or "none"
        if not name:
            raise KubeConfigError(f"kubeconfig {where}: no current-context (pass --context; its contexts: {names})")
        ctx = _named(merged["contexts"], name)
        if ctx is None:
            raise KubeConfigError(f"kubeconfig {where}: context {name!r} not found (its contexts: {names})")
        body = ctx.get("context") or {}
        _check_context(merged, f"kubeconfig {where}: context {name!r}", body)
        namespace = str(body.get("namespace") or "default")
        return _Source("kubeconfig", [str(p) for p, _ in found], merged, name, namespace)
    if _in_cluster_possible(env, sa_dir):
        return _Source("in-cluster", namespace=_pod_namespace(env, sa_dir))
    raise KubeConfigError(_nothing_usable(paths, found, env, sa_dir))


def _named(entries: list[dict[str, Any]], name: object) -> dict[str, Any] | None:
    """The entry of a kubeconfig section (`contexts`, `clusters`, `users`) called `name`."""
    return next((e for e in entries if e["name"] == name), None) if name else None


def _check_context(merged: dict[str, Any], where: str, context: Mapping[str, Any]) -> None:
    """The context's cluster (with a server URL) and user exist, as client-go confirms before
    it connects; a server without a scheme is taken as https, as client-go takes it."""
    cluster = _named(merged["clusters"], context.get("cluster"))
    if cluster is None:
        raise KubeConfigError(f"{where}: cluster {context.get('cluster')!r} not found")
    user = context.get("user")
    if user and _named(merged["users"], user) is None:
        raise KubeConfigError(f"{where}: user {user!r} not found")
    body = cluster.get("cluster") or {}
    server = body.get("server") if isinstance(body, dict) else None
    if not isinstance(server, str) or not server.strip():
        raise KubeConfigError(f"{where}: cluster {cluster['name']!r} has no server")
    url = server if "://" in server else f"https://{server}"
    try:
        parts = urlsplit(url)
        # .port raises ValueError for a port that is not a number
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and " " not in url and (parts.port or 0) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise KubeConfigError(f"{where}: server {server!r} of cluster {cluster['name']!r} is not a URL "
                              f"(https://HOST[:PORT])")
    if url != server:
        cluster["cluster"] = {**body, "server": url}


def _nothing_usable(paths: list[Path], found: list[tuple[Path, dict[str, Any]]], env: Mapping[str, str],
                    sa_dir: Path) -> str:
    """Why no configuration was found, naming what exists and what does not."""
    looked = os.pathsep.join(str(p) for p in paths)
    if found:
        what = f"kubeconfig {looked}: no clusters, users or contexts"
    elif env.get("KUBECONFIG"):
        what = f"KUBECONFIG names {looked}, which does not exist" if len(paths) == 1 else \
            f"KUBECONFIG names {looked}, none of which exists"
    else:
        what = f"no kubeconfig found ({looked} does not exist)"
    if env.get("KUBERNETES_SERVICE_HOST"):
        return f"{what}, and no service account token ({sa_dir / 'token'})"
    fix = "pass --kubeconfig or fix KUBECONFIG" if env.get("KUBECONFIG") else "pass --kubeconfig or set KUBECONFIG"
    return f"{what}; {fix}"


def _pod_namespace(environ: Mapping[str, str], sa_dir: Path) -> str:
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return (sa_dir / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


async def client_configuration(source: _Source, *, environ: Mapping[str, str] | None = None,
                               sa_dir: Path = _SERVICE_ACCOUNT_DIR) -> k8s.Configuration:
    """The client Configuration for a resolved source; library errors become one line."""
    cfg = k8s.Configuration()
    missing = _missing_plugin(_user_of(source)) if source.kind == "kubeconfig" else None
    if missing:
        raise KubeConfigError(f"{source.describe()}: {missing}")
    try:
        if source.kind == "in-cluster":
            env = dict(os.environ if environ is None else environ)
            InClusterConfigLoader(str(sa_dir / "token"), str(sa_dir / "ca.crt"), environ=env).load_and_set(cfg)
        else:
            await k8s_config.load_kube_config_from_dict(_with_user(source), context=source.context,
                                                        client_configuration=cfg)
    except OSError as e:  # a tokenFile, an exec plugin, a certificate file
        raise KubeConfigError(f"{source.describe()}: {_os_error(e, _user_of(source))}") from None
    except (k8s_config.ConfigException, ValueError, KeyError, TypeError) as e:
        raise KubeConfigError(f"{source.describe()}: {_one_line(e)}") from None
    return cfg


_ANONYMOUS = "initshift-anonymous"  # the user given to a context that names none


def _with_user(source: _Source) -> dict[str, Any]:
    """The merged kubeconfig with a user for the library, which fails on a context without
    one ("argument of type 'NoneType' is not iterable") or on a user entry without a body,
    where kubectl connects anonymously: both get an empty user, so no client credentials."""
    config = source.config
    users = [u if isinstance(u.get("user"), dict) else {**u, "user": {}} for u in config["users"]]
    contexts = config["contexts"]
    ctx = _named(contexts, source.context)
    body = (ctx or {}).get("context") or {}
    if not body.get("user"):
        name = _ANONYMOUS
        while _named(users, name) is not None:  # not one of the kubeconfig's own
            name += "-"
        users.append({"name": name, "user": {}})
        contexts = [{**c, "context": {**body, "user": name}} if c is ctx else c for c in contexts]
    return {**config, "users": users, "contexts": contexts}


def _user_of(source: _Source) -> Mapping[str, Any]:
    """The body of the context's user ({} for none, or in a pod)."""
    ctx = _named(source.config.get("contexts", []), source.context)
    user = _named(source.config.get("users", []), ((ctx or {}).get("context") or {}).get("user"))
    return (user or {}).get("user") or {}


def _not_installed(plugin: Mapping[str, Any]) -> str:
    """kubectl's words for an exec plugin that is not installed, with the kubeconfig's hint."""
    hint = " ".join(str(plugin.get("installHint") or "").split())  # kubectl prints it after a blank line
    return f"exec plugin: executable {plugin['command']} not found" + (f"; {hint}" if hint else "")


def _missing_plugin(user: Mapping[str, Any]) -> str | None:
    """Why the user's exec plugin is not there to run, None if it is (or there is none): said
    before the library runs it, which logs the OSError as `[Errno 2] ...` (and under uvloop
    names no file)."""
    plugin = user.get("exec")
    command = plugin.get("command") if isinstance(plugin, dict) else None
    if not command:
        return None
    if os.sep in command:  # a path: run as it is, as client-go runs it
        found = os.path.exists(command)
    else:  # a name: looked up on the PATH the plugin's own env may set
        path = next((e.get("value") for e in plugin.get("env") or []
                     if isinstance(e, dict) and e.get("name") == "PATH"), None)
        found = shutil.which(command, path=path or os.environ.get("PATH", os.defpath)) is not None
    return None if found else _not_installed(plugin)


def _os_error(e: OSError, user: Mapping[str, Any]) -> str:
    """A file or program of the user's that failed, said as kubectl says it, not Python's
    `[Errno 2] No such file or directory: 'FILE'`."""
    plugin = user.get("exec") or {}
    if e.filename is not None and e.filename == plugin.get("command"):
        if isinstance(e, FileNotFoundError):
            return _not_installed(plugin)
        return f"exec plugin: executable {e.filename}: {os_reason(e)}"
    token_file = user.get("tokenFile")
    if e.filename is not None and token_file and os.path.normpath(str(e.filename)) == os.path.normpath(token_file):
        return f"tokenFile {token_file}: {os_reason(e)}"
    return f"{e.filename}: {os_reason(e)}" if e.filename is not None else os_reason(e)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]
