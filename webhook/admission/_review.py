"""AdmissionReview in and out: parse and validate a raw body, build the answer.

Pure functions, no I/O. The server reads the body itself and hands the bytes here, so
FastAPI's own validation (and its 422) never sees a review. Every rejection is a
`BadReview` whose message is one line fit for an HTTP 400 body.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .. import jsontext
from ..errors import InitshiftError

API_V1 = "admission.k8s.io/v1"
API_V1BETA1 = "admission.k8s.io/v1beta1"
_API_VERSIONS = (API_V1, API_V1BETA1)
KIND = "AdmissionReview"
# Namespaces mutated under no configuration at all (the webhook's own is added at run time).
ALWAYS_PROTECTED = ("kube-system",)


def protected(namespace: str, own_namespace: str) -> str | None:
    """Why a pod in `namespace` is never mutated, for its warning (the webhook's own
    namespace, INITSHIFT_NAMESPACE, is `own_namespace`); None for any other namespace."""
    if namespace in ALWAYS_PROTECTED or namespace == own_namespace:
        return f"initshift: namespace {namespace!r} is never mutated"
    return None


class BadReview(InitshiftError, ValueError):
    """The body is not an AdmissionReview the server can answer; message is one line."""


@dataclass(frozen=True)
class Review:
    """The fields of an AdmissionRequest the server acts on."""

    api_version: str
    uid: str
    group: str
    version: str
    kind: str
    resource: str
    sub_resource: str
    operation: str
    namespace: str
    name: str
    dry_run: bool
    obj: Any = field(repr=False)

    @property
    def is_pod_create(self) -> bool:
        return (self.group, self.version, self.kind, self.operation) == ("", "v1", "Pod", "CREATE") \
            and self.resource in ("", "pods") and not self.sub_resource

    def _meta(self, key: str) -> str:
        meta = self.obj.get("metadata") if isinstance(self.obj, dict) else None
        value = meta.get(key) if isinstance(meta, dict) else None
        return value if isinstance(value, str) else ""

    @property
    def pod_namespace(self) -> str:
        """The request's namespace, else the pod's (a CREATE's pod often has none)."""
        return self.namespace or self._meta("namespace")

    @property
    def display_name(self) -> str:
        """The pod's name, or its generateName prefix (names are often assigned later)."""
        return self.name or self._meta("name") or self._meta("generateName")

    def without_pod(self) -> "Review":
        """The review with only the metadata its log line reads of the pod."""
        meta = {key: self._meta(key) for key in ("namespace", "name", "generateName")}
        return replace(self, obj={"metadata": meta})


# A JSON escape of a UTF-16 surrogate (`\ud800`-`\udfff`): legal JSON syntax, but alone it is
# no Unicode character (the apiserver, Go's encoding/json, never writes one). Searching the
# raw bytes is cheap; only a body that has one pays for the exact check.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _reject_constant(name: str) -> Any:
    raise BadReview(f"malformed JSON: {name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; one too large for a float (1e400) is
    refused like the NaN and Infinity constants: no answer could carry it as JSON."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise BadReview(f"malformed JSON: {_one_line(text, 40)} is out of range")
    return value


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    return dict(pairs)


# Built once: json.loads with options builds a decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)
_YIELDING = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite, object_pairs_hook=_pairs)


def check_content_type(content_type: bytes | None) -> None:
    media = (content_type or b"").split(b";", 1)[0].strip().lower().decode("latin-1")
    if media != "application/json":
        raise BadReview(f"content type must be application/json, got {media or 'none'!r}")


def _str(obj: Mapping, key: str, where: str, *, required: bool = False) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise BadReview(f"{where}.{key} is missing")
        return ""
    if not isinstance(value, str):
        raise BadReview(f"{where}.{key} must be a string")
    if required and not value:
        raise BadReview(f"{where}.{key} is empty")
    return value


def _dict(obj: Mapping, key: str, where: str) -> dict:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadReview(f"{where}.{key} must be an object")
    return value


def parse_review(body: bytes, *, yielding: bool = False) -> Review:
    """Decode and validate an AdmissionReview body; raise BadReview with the reason.

    `yielding` (a large review, on a thread of its own): each JSON object is built by a
    Python function, where the interpreter may hand the GIL to the event loop; the
    standard library's parser alone holds it for the whole document (45 ms for 4 MB)."""
    if not body:
        raise BadReview("empty body")
    try:
        # UTF-8 only (RFC 8259 for JSON between systems; what the apiserver sends):
        # json.loads would also guess UTF-16 and UTF-32 from bytes.
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadReview(f"the body is not UTF-8: {_one_line(e)}") from None
    try:
        doc = (_YIELDING if yielding else _DECODER).decode(text)
    except BadReview:
        raise
    except RecursionError:
        raise BadReview("malformed JSON: nested too deeply") from None
    except ValueError as e:
        raise BadReview(f"malformed JSON: {_one_line(e)}") from None
    if not isinstance(doc, dict):
        raise BadReview("the body must be a JSON object (an AdmissionReview)")
    if _SURROGATE_ESCAPE.search(body):
        _check_unicode(doc)
    api_version = doc.get("apiVersion")
    if api_version is None:
        raise BadReview(f"not an AdmissionReview: apiVersion is missing (expected {' or '.join(_API_VERSIONS)})")
    if api_version not in _API_VERSIONS:
        raise BadReview(f"apiVersion must be one of {', '.join(_API_VERSIONS)}, got {_one_line(repr(api_version), 80)}")
    if doc.get("kind") is None:
        raise BadReview(f"not an AdmissionReview: kind is missing (expected {KIND})")
    if doc.get("kind") != KIND:
        raise BadReview(f"kind must be {KIND}, got {_one_line(repr(doc.get('kind')), 80)}")
    request = doc.get("request")
    if request is None:
        raise BadReview("request is missing")
    if not isinstance(request, dict):
        raise BadReview("request must be an object")
    uid = _str(request, "uid", "request", required=True)
    kind = _dict(request, "kind", "request")
    resource = _dict(request, "resource", "request")
    operation = _str(request, "operation", "request", required=True)
    dry_run = False if request.get("dryRun") is None else request["dryRun"]
    if not isinstance(dry_run, bool):
        raise BadReview("request.dryRun must be a boolean")
    obj = request.get("object")
    review = Review(
        api_version=api_version, uid=uid,
        group=_str(kind, "group", "request.kind"), version=_str(kind, "version", "request.kind"),
        kind=_str(kind, "kind", "request.kind", required=True),
        resource=_str(resource, "resource", "request.resource"),
        sub_resource=_str(request, "subResource", "request"),
        operation=operation,
        namespace=_str(request, "namespace", "request"), name=_str(request, "name", "request"),
        dry_run=dry_run, obj=obj,
    )
    if review.is_pod_create:
        if not isinstance(obj, dict):
            raise BadReview("request.object must be a Pod object for a Pod CREATE")
        meta = _dict(obj, "metadata", "request.object")
        for key in ("namespace", "name", "generateName"):
            _str(meta, key, "request.object.metadata")
    return review


def _check_unicode(doc: Any) -> None:
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadReview("malformed JSON: a string holds a lone UTF-16 surrogate escape (not Unicode text)") from None


def request_uid(body: bytes) -> str:
    """Best-effort uid of a body that failed validation, for the log line only."""
    try:
        uid = json.loads(body)["request"]["uid"]
    except Exception:  # noqa: BLE001 - anything malformed simply has no uid
        return ""
    return uid if isinstance(uid, str) else ""


def response(review: Review, *, patch: list[dict] | None = None, warnings: list[str] | tuple[str, ...] = (),
             denied: str | None = None, code: int = 403) -> dict:
    """The AdmissionReview answer, in the apiVersion the request used."""
    resp: dict[str, Any] = {"uid": review.uid, "allowed": denied is None}
    if denied is not None:
        resp["status"] = {"code": code, "message": denied}
    elif patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(jsontext.dumps(patch)).decode()
    if warnings:
        resp["warnings"] = [_one_line(w, 512) for w in warnings]
    return {"apiVersion": review.api_version, "kind": KIND, "response": resp}
