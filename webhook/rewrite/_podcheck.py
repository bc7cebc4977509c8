"""Pod rules the apiserver enforces that the OpenAPI schema does not express.

Used by the rewrite as a last guard (a pod the apiserver would reject is never emitted)
and by the tests on every pod the rewrite produces.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Mapping

from .. import jsontext
from ..k8snames import DNS_LABEL, DNS_SUBDOMAIN, is_name
from ._quantity import QuantityError, parse
from ._resources import SHAREABLE

_KEY_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_ANNOTATION_REF = re.compile(r"^metadata\.annotations\['(.*)'\]$")
# etcd refuses a value over 1.5 MiB (--max-request-bytes): the stored object (protobuf, then
# a few bytes of etcd framing) must fit, and its JSON is never smaller. The apiserver refuses
# annotations over 256 KiB in total (keys and values: apimachinery TotalAnnotationSizeLimitB).
MAX_OBJECT_BYTES = 1536 * 1024
MAX_ANNOTATION_BYTES = 256 * 1024


def is_annotation_key(key: str) -> bool:
    """A qualified name ([prefix/]name), which annotation keys and the downward API's
    `metadata.annotations['key']` must be (the latter checked on the lowercased key)."""
    prefix, _, name = key.rpartition("/")
    if prefix and not is_name(prefix, DNS_SUBDOMAIN):
        return False
    return len(name) <= 63 and bool(_KEY_NAME.match(name))


def _downward_api_problems(volume: Mapping) -> list[str]:
    out = []
    api = volume.get("downwardAPI")
    items = api.get("items") if isinstance(api, dict) else None
    for item in items if isinstance(items, list) else []:
        ref = item.get("fieldRef") if isinstance(item, dict) else None
        m = _ANNOTATION_REF.match(str(ref.get("fieldPath", ""))) if isinstance(ref, dict) else None
        if m and not is_annotation_key(m.group(1).lower()):
            out.append(f"volume {volume.get('name')!r}: {m.group(1)!r} is not a valid annotation key")
    return out


def _container_problems(c: Mapping, volumes: set[str], where: str) -> list[str]:
    out: list[str] = []
    name = c.get("name")
    paths: set[str] = set()
    for m in c.get("volumeMounts") or []:
        if m.get("name") not in volumes:
            out.append(f"{where} {name!r} mounts unknown volume {m.get('name')!r}")
        path = m.get("mountPath")
        if path in paths:
            out.append(f"{where} {name!r} mounts {path!r} twice")
        paths.add(path)
    res = c.get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    try:
        for r, value in requests.items():
            req = parse(value, r)
            if req < 0:
                out.append(f"{where} {name!r} requests a negative {r}")
            if r in limits:
                limit = parse(limits[r], r)
                if req > limit:
                    out.append(f"{where} {name!r} requests more {r} than its limit")
                if r not in SHAREABLE and req != limit:
                    out.append(f"{where} {name!r}: {r} must have its request equal to its limit")
        for r, value in limits.items():
            if r not in requests:  # the others were read above
                parse(value, r)
    except QuantityError as e:
        out.append(f"{where} {name!r}: {e}")
    return out


def annotation_bytes(pod: Mapping) -> int:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    # surrogatepass: a lone surrogate (JSON "\udfff", never sent by an apiserver) is
    # counted, not an exception.
    return sum(len(k.encode("utf-8", "surrogatepass")) + len(str(v).encode("utf-8", "surrogatepass"))
               for k, v in annotations.items())


def object_bytes(pod: Mapping) -> int:
    """The pod's compact JSON size, non-ASCII text counted as \\u escapes (as the standard
    library writes it). jsontext writes the same bytes ten times faster when they are all
    printable ASCII (control characters are escaped alike; a float with an exponent below -4
    is written a byte or two shorter, 1e-7 for 1e-07); other text is measured again."""
    text = jsontext.dumps(pod)
    if text.isascii() and b"\x7f" not in text:
        return len(text)
    return len(json.dumps(pod, separators=(",", ":")).encode())


def size_problems(pod: Mapping) -> list[str]:
    """Storage limits the pod crosses (the rewrite's additions, or the input already)."""
    out = []
    try:
        size = object_bytes(pod)
    except RecursionError:  # a pod the shape check refused for its depth
        return ["it nests too deeply to be stored"]
    if size > MAX_OBJECT_BYTES:
        out.append(f"it would be {size} bytes, over the {MAX_OBJECT_BYTES}-byte object limit of etcd")
    notes = annotation_bytes(pod)
    if notes > MAX_ANNOTATION_BYTES:
        out.append(f"its annotations would be {notes} bytes, over the apiserver's {MAX_ANNOTATION_BYTES}-byte limit")
    return out


@functools.lru_cache(maxsize=4096)
def _is_dns_label(name: str) -> bool:
    """RFC 1123; the same few names recur in every pod of a kind, each is matched once."""
    return is_name(name, DNS_LABEL)


def _name_problems(name: object, what: str, seen: set, twice: str) -> list[str]:
    """A volume's or container's name: a DNS label (RFC 1123), unique among its kind.
    `twice`: the message for a repeated name, `{!r}` standing for it (formatted only then)."""
    out = []
    if not isinstance(name, str) or not _is_dns_label(name):
        out.append(f"{what} name {name!r} is not a DNS label")
    if name in seen:
        out.append(twice.format(name))
    seen.add(name)
    return out


def pod_problems(pod: Mapping) -> list[str]:
    spec = pod.get("spec") or {}
    out: list[str] = []
    volumes: set[str] = set()
    for v in spec.get("volumes") or []:
        out += _name_problems(v.get("name"), "volume", volumes, "volume {!r} is defined twice")
        if "downwardAPI" in v:
            out += _downward_api_problems(v)
    inits = spec.get("initContainers") or []
    regular = spec.get("containers") or []
    if not regular:
        out.append("the pod has no containers")
    names: set[str] = set()
    for where, group in (("init container", inits), ("container", regular),
                         ("ephemeral container", spec.get("ephemeralContainers") or [])):
        for c in group:
            out += _name_problems(c.get("name"), where, names, "container name {!r} is used twice")
            out += _container_problems(c, volumes, where)
    for c in inits:
        if c.get("restartPolicy") not in (None, "Always"):
            out.append(f"init container {c.get('name')!r} has restartPolicy {c.get('restartPolicy')!r}")
        if c.get("restartPolicy") != "Always":
            for f in ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe"):
                if f in c:
                    out.append(f"init container {c.get('name')!r} may not set {f}")
    host_ports: set[tuple] = set()
    for c in regular:
        if "restartPolicy" in c:
            out.append(f"container {c.get('name')!r} may not set restartPolicy")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                key = (port.get("hostIP", ""), port["hostPort"], port.get("protocol", "TCP"))
                if key in host_ports:
                    out.append(f"hostPort {port['hostPort']} is used by two containers")
                host_ports.add(key)
    return out
