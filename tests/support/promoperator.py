"""The prometheus-operator CRD shapes deploy/ uses, as strict JSON Schemas.

Transcribed from the upstream CRDs (monitoring.coreos.com/v1 ServiceMonitor, PodMonitor,
PrometheusRule: their openAPIV3Schema), limited to the fields initshift renders and
closed with `additionalProperties: false`, so a typo or a field in the wrong place fails
here as it would fail on `kubectl apply` against the CRD. The CRDs are not on PyPI and
kubernetes-validate knows only the built-in kinds.
"""

from __future__ import annotations

import jsonschema

GROUP_VERSION = "monitoring.coreos.com/v1"
# Upstream `Duration` (model.ParseDuration): units y, w, d, h, m, s, ms.
DURATION = {"type": "string",
            "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
    "name": {"type": "string", "minLength": 1}, "namespace": {"type": "string"},
    "labels": _STRING_MAP, "annotations": _STRING_MAP}}
_LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": _STRING_MAP,
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "additionalProperties": False, "properties": {
            "key": {"type": "string"}, "operator": {"type": "string"},
            "values": {"type": "array", "items": {"type": "string"}}}}}}}
_NAMESPACE_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}
# Upstream RelabelConfig (relabelings and metricRelabelings).
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "modulus": {"type": "integer", "minimum": 0}, "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                        "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                        "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]}}}
_ENDPOINT = {"type": "object", "additionalProperties": False, "properties": {
    "port": {"type": "string"}, "path": {"type": "string"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": DURATION, "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _RELABEL}}}


def _object(kind: str, spec: dict) -> dict:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
            "properties": {"apiVersion": {"const": GROUP_VERSION}, "kind": {"const": kind}, "metadata": _META,
                           "spec": spec}}


SCHEMAS = {
    "ServiceMonitor": _object("ServiceMonitor", {
        "type": "object", "required": ["selector"], "additionalProperties": False, "properties": {
            "selector": _LABEL_SELECTOR, "namespaceSelector": _NAMESPACE_SELECTOR, "jobLabel": {"type": "string"},
            "endpoints": {"type": "array", "items": _ENDPOINT}}}),
    "PodMonitor": _object("PodMonitor", {
        "type": "object", "required": ["selector"], "additionalProperties": False, "properties": {
            "selector": _LABEL_SELECTOR, "namespaceSelector": _NAMESPACE_SELECTOR, "jobLabel": {"type": "string"},
            "podMetricsEndpoints": {"type": "array", "items": _ENDPOINT}}}),
    "PrometheusRule": _object("PrometheusRule", {
        "type": "object", "additionalProperties": False, "properties": {
            "groups": {"type": "array", "items": {
                "type": "object", "required": ["name"], "additionalProperties": False, "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": DURATION,
                    "rules": {"type": "array", "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False,
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string"}, "record": {"type": "string"},
                            # int-or-string upstream
                            "expr": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
                            "for": DURATION, "keep_firing_for": DURATION,
                            "labels": _STRING_MAP, "annotations": _STRING_MAP}}}}}}}}),
}


def validate(obj: dict) -> None:
    """Raise jsonschema.ValidationError when `obj` does not fit its CRD."""
    jsonschema.validate(obj, SCHEMAS[obj["kind"]])
