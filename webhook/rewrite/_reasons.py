"""Why the rewrite did what it did to a pod: one slug per decision.

The same slug is the `reason` of a RewriteResult, the `reason` label of
`initshift_pods_total`, the `reason` field of the admission log line, and, for a pod left
as it was, the value of the `initshift.io/not-rewritten` annotation (docs/strategies.md,
"Decisions visible on the pod"). A StrEnum: each member is its slug, so it compares equal
to the string and writes as it.
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # A strategy ran.
    REWRITTEN = "rewritten"
    ANNOTATED = "annotated"  # native: the mesh asked to inject its proxy natively, nothing moved
    REFRESHED = "refreshed"  # re-invocation of a rewritten pod
    UNCHANGED = "unchanged"  # it ran and had nothing to change

    # Left as it is: the pod needs nothing, or initshift was told to leave it.
    INVALID = "invalid"
    FEATURE_GATE_OFF = "feature-gate-off"
    INVALID_MODE = "invalid-mode"
    DISABLED = "disabled"
    WINDOWS = "windows"
    MIRROR_POD = "mirror-pod"  # a static pod's mirror: the kubelet runs its manifest, not this object
    HOST_NETWORK = "host-network"  # waiter, hybrid: the pod's loopback is the node's
    NATIVE_UNSUPPORTED = "native-unsupported"
    NO_INIT_CONTAINERS = "no-init-containers"
    NO_SIDECAR = "no-sidecar"
    NO_MAINS = "no-mains"
    ALREADY_NATIVE = "already-native"
    RESTART_POLICY = "restart-policy"

    # Cannot be rewritten (a RewriteError): admitted unchanged with the error, or denied.
    RESOURCES = "resources"
    RESERVED = "reserved"
    UNRESOLVED_ENTRYPOINT = "unresolved-entrypoint"
    INVALID_START_ORDER = "invalid-start-order"
    TOO_LARGE = "too-large"


# Skips that hold whatever the pod asks for, a declared start order included.
FINAL = frozenset({Reason.INVALID, Reason.FEATURE_GATE_OFF, Reason.INVALID_MODE, Reason.DISABLED, Reason.WINDOWS,
                   Reason.MIRROR_POD})
# Skips whose pods are not touched at all: initshift was told to leave them alone, or the
# object is not what runs (a change to a mirror pod would only make it lie about its pod).
UNTOUCHED = frozenset({Reason.FEATURE_GATE_OFF, Reason.DISABLED, Reason.MIRROR_POD})
