"""An in-process double of the Kubernetes API server for tests (aiohttp on 127.0.0.1).

Real HTTP, real JSON, the apiserver's semantics where the tests depend on them:

- a global, increasing resourceVersion; lists carry it, objects carry theirs;
- list with `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`) and simple
  `fieldSelector` (`a.b=v`, `a.b!=v`; on events `source` means `source.component`), across
  namespaces or in one, in the order of their storage keys; `limit`/`continue` pages as
  the apiserver's etcd store pages them (`_list`; e2e `double-lists`), from the first
  page's snapshot (a token older than the retained history or the kept snapshots gets
  410); a list's `resourceVersion` is not modelled (every list is a consistent read);
- watch (`?watch=true&resourceVersion=N`): replays retained history after N, then
  streams ADDED/MODIFIED/DELETED lines; N older than the retained window gets an ERROR
  event with a 410 `Status`; `timeoutSeconds` ends the stream; no N (or "0") starts with
  synthetic ADDED events for what exists; with `allowWatchBookmarks=true`, a BOOKMARK
  (only `metadata.resourceVersion`) every `bookmark_seconds` and on `send_bookmarks()`,
  except on events: the apiserver keeps no watch cache for them (its default
  `--watch-cache-sizes`), so their watches are etcd's and get no bookmarks;
- create (409 AlreadyExists, `generateName`; 500 with a resourceVersion), get, PUT (409
  on a stale metadata.resourceVersion; its name and namespace the URL's, 400; a Lease
  must carry a resourceVersion, 422, and one that does not exist is created: `_put`),
  PATCH with `application/merge-patch+json` (RFC 7386: null
  deletes) or `application/json-patch+json`; strategic merge patch is refused with 415;
  a patch carrying metadata.resourceVersion is conditional (409 when stale); delete (pods
  gracefully, as `delete_pod()`: a running pod is marked with `deletionTimestamp`; with no
  grace left it is marked with grace 0 (MODIFIED), then goes (DELETED) unless a finalizer
  holds it; an object marked with grace 0 goes when an update removes its last finalizer,
  its DELETED event the object as it was; e2e `double-deletion`, `double-watch`); a
  DELETE answers the object for some resources, a `Status` for the others (e2e
  `double-deletes`); its options (`DeleteOptions`: a body's, else the query's) as the
  apiserver takes them, with no garbage collector running (as without
  kube-controller-manager): `propagationPolicy` Orphan (a Job's default) or Foreground
  leaves the collector's finalizer on the object, marked and kept until an update removes
  it, `preconditions` (409), `dryRun=All` (e2e `double-delete-options`); an update may not
  add a finalizer to an object being deleted (422); a namespace is created Active with the
  `kubernetes` finalizer and, deleted, stays Terminating (no namespace controller runs
  either), refusing new objects (403); a new cluster's namespaces exist from the start
  (`namespaces=` names them), one that does not exist takes no new object (404, a Lease's
  creating PUT too), and an object `put()` in one makes it (e2e `double-namespaces`);
- object metadata as the apiserver validates it, on create and every update: label and
  annotation keys are qualified names, label values at most 63 characters of their
  alphabet, annotations at most 256 KiB together (422; a real apiserver refused a
  `generateName` used as a label value, with its trailing "-");
- core/v1 events: the name only a path segment (not `.` or `..`, no `/` or `%`: v1.34.9
  and v1.28.15 take capitals, spaces and 300 characters) and `involvedObject.namespace`
  the event's own namespace (422), as the apiserver validates them (e2e `double-events`);
- pods: updates may change metadata, container images and `spec.activeDeadlineSeconds`
  (only set when unset, or lowered, > 0) and nothing else in spec (422); status is
  written only through `/status` (which may change labels and annotations too, as the
  apiserver's status strategy allows) or `set_container_statuses()`; a no-op update does not
  bump the resourceVersion; pod logs (`/log?container=C&follow=true&tailLines=N`: 400
  "waiting to start" before the container first runs, the last run's of one waiting to be
  restarted, a follow ends when it terminates; each run, by its restartCount, has a log of
  its own, and `previous=true` reads the run `lastState` reports, else 400 "previous
  terminated container ... not found", as the kubelet's validateContainerLogStatus;
  `timestamps=true` starts each line with its time, `sinceTime` (or `sinceSeconds`, not both: 422) keeps those from that
  second on);
  `/portforward?ports=N` over a WebSocket as the kubelet serves it (`v4.channel.k8s.io`);
- a node list as a Table (server-side printing, `Accept: ...;as=Table;...`, with
  `includeObject`), as `kubectl get nodes` reads it;
- Leases decoded and validated as the apiserver does (`_decode_lease`, `_check_lease`; e2e
  `double-leases`); empty labels, annotations, finalizers and ownerReferences are left out of
  what is stored, as the apiserver leaves them out;
- core/v1 and events.k8s.io/v1 events, coordination.k8s.io/v1 leases, nodes, namespaces,
  secrets, serviceaccounts, configmaps, services, limitranges, resourcequotas, apps/v1 deployments,
  mutating/validating webhook configurations, `GET /version`;
- secrets: decoded as the apiserver decodes them (`_decode_secret`: values as Go's base64
  reads them, stored re-encoded, 400 at the byte offset Go names, 422 from a patch;
  `stringData` merged into `data`; `type` defaulted to Opaque) and validated (`_check_secret`:
  data keys, 1 MiB, each type's required keys, `type` and an immutable Secret's data fixed;
  422; e2e `double-secrets`);
- mutating and validating webhook configurations: each `clientConfig.caBundle` decoded as a
  Secret's values are, and each webhook validated (`_check_webhooks`: its name, one of url or
  service, sideEffects, admissionReviewVersions; 422; e2e `double-webhook-configurations`);
- limitranges: validated as the apiserver does on create and update (422): each limit has a
  type, no type twice, no `default`/`defaultRequest` for type Pod, quantities that parse,
  per resource min <= defaultRequest <= default <= max (its messages), maxLimitRequestRatio >= 1;
- SubjectAccessReview creation (`authorization.k8s.io/v1`, never stored), answered from the
  RBAC table `grant()` fills (RBAC denies by default; at least one of user/groups and
  exactly one of resourceAttributes/nonResourceAttributes, else 422);
- pod creation runs the `admission` chain first (async callables pod -> pod, in order, as
  the apiserver calls mutating webhooks), e.g. the real initshift server and a mesh injector.

Test hooks: `fail_next()` (next N matching requests answer a status; 410 on a watch is
an ERROR event), `delay()`, `write_latency` (every write waits a random time in the range
before it commits, as a loaded apiserver does), `outage()` (the server gone: connections
reset; or a network blip: requests and watches stall, then reset), `silence()` (one
client's requests are reset from now on: a process killed without warning), `drop_watches()`,
`compact()` (forget history: older resourceVersions get 410), `set_container_statuses()` (what the kubelet would write),
`end_pod()`/`kill_pod()`, `append_log()`/`end_log()`/`cut_log_follows()`, `pod_ports` (what a port-forward to a
pod's port reaches: a local port), and introspection: `requests` (each with its
arrival and answer time), `patches()`,
`events_for()`, `get()`/`pod()`. `kube_api()` / `api_client()` build clients pointed at it.

Usage::

    async with KubeDouble() as kube:
        kube.put_pod(pod)
        api = kube.kube_api()
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import copy
import json
import random
import re
import string
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

import jsonpatch
from aiohttp import web

__all__ = ["KubeDouble", "RequestRecord", "SYSTEM_NAMESPACES", "running", "terminated", "waiting", "merge_patch",
           "now_rfc3339"]


def now_rfc3339() -> str:
    return _rfc3339(datetime.now(timezone.utc))


def _rfc3339(at: datetime) -> str:
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_rfc3339(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


# --- container status builders (what the kubelet writes) ---------------------------------
def running(name: str, *, ready: bool = True, started_at: str | None = None, restart_count: int = 0,
            image: str = "image") -> dict:
    return {"name": name, "ready": ready, "started": True, "restartCount": restart_count, "image": image,
            "imageID": "", "state": {"running": {"startedAt": started_at or now_rfc3339()}}}


def terminated(name: str, exit_code: int = 0, reason: str | None = None, *, message: str | None = None,
               started_at: str | None = None, finished_at: str | None = None, image: str = "image") -> dict:
    t: dict[str, Any] = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                         "startedAt": started_at or now_rfc3339(), "finishedAt": finished_at or now_rfc3339()}
    if message is not None:
        t["message"] = message
    return {"name": name, "ready": False, "started": False, "restartCount": 0, "image": image, "imageID": "",
            "state": {"terminated": t}}


# What the kubelet (v1.34.9, containerd) reports for a container whose process could not be
# started: exit 128, reason StartError, and the zero time (the Unix epoch) as its start.
NEVER_STARTED = "1970-01-01T00:00:00Z"


def start_error(name: str, message: str = "", *, finished_at: str | None = None, image: str = "image") -> dict:
    """A container the runtime created but could not start (its command absent): the kubelet's
    terminated state, as a real one reports it."""
    out = terminated(name, 128, "StartError", started_at=NEVER_STARTED, finished_at=finished_at, image=image,
                     message=message or 'failed to create containerd task: failed to create shim task: OCI runtime '
                     'create failed: runc create failed: unable to start container process: error during container '
                     'init: exec: "/initshift/bin/waiter/waiter": stat /initshift/bin/waiter/waiter: no such file '
                     'or directory: unknown')
    return out


def waiting(name: str, reason: str = "ContainerCreating", *, image: str = "image") -> dict:
    return {"name": name, "ready": False, "started": False, "restartCount": 0, "image": image, "imageID": "",
            "state": {"waiting": {"reason": reason}}}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch; never mutates its arguments."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- resources -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Resource:
    key: str  # how tests name it: "pods", "leases", "events.k8s.io", ...
    prefix: str  # "/api/v1" or "/apis/<group>/<version>"
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return "v1" if self.prefix == "/api/v1" else self.prefix[len("/apis/"):]

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def qualified(self) -> str:
        """How the apiserver names the resource in its messages: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """How the apiserver names an object's kind in validation and precondition messages:
        `Pod`, `Job.batch`."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


RESOURCES = {r.key: r for r in [
    Resource("pods", "/api/v1", "pods", "Pod"),
    Resource("events", "/api/v1", "events", "Event"),
    Resource("secrets", "/api/v1", "secrets", "Secret"),
    Resource("serviceaccounts", "/api/v1", "serviceaccounts", "ServiceAccount"),
    Resource("configmaps", "/api/v1", "configmaps", "ConfigMap"),
    Resource("services", "/api/v1", "services", "Service"),
    Resource("limitranges", "/api/v1", "limitranges", "LimitRange"),
    Resource("resourcequotas", "/api/v1", "resourcequotas", "ResourceQuota"),
    Resource("deployments", "/apis/apps/v1", "deployments", "Deployment"),
    Resource("jobs", "/apis/batch/v1", "jobs", "Job"),
    Resource("cronjobs", "/apis/batch/v1", "cronjobs", "CronJob"),
    Resource("poddisruptionbudgets", "/apis/policy/v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    Resource("namespaces", "/api/v1", "namespaces", "Namespace", namespaced=False),
    Resource("nodes", "/api/v1", "nodes", "Node", namespaced=False),
    Resource("events.k8s.io", "/apis/events.k8s.io/v1", "events", "Event"),
    Resource("leases", "/apis/coordination.k8s.io/v1", "leases", "Lease"),
    Resource("mutatingwebhookconfigurations", "/apis/admissionregistration.k8s.io/v1",
             "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", namespaced=False),
    Resource("validatingwebhookconfigurations", "/apis/admissionregistration.k8s.io/v1",
             "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", namespaced=False),
    Resource("validatingadmissionpolicies", "/apis/admissionregistration.k8s.io/v1",
             "validatingadmissionpolicies", "ValidatingAdmissionPolicy", namespaced=False),
    Resource("validatingadmissionpolicybindings", "/apis/admissionregistration.k8s.io/v1",
             "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", namespaced=False),
]}
_BY_PATH = {(r.prefix, r.plural): r for r in RESOURCES.values()}

# The apiserver's update rules that differ by resource (its registry's strategies), as
# probed on v1.34.9 and v1.28.15; only what was probed is listed.
_CREATE_ON_UPDATE = {"leases"}  # a PUT of one that does not exist creates it
_CONDITIONAL_UPDATES_ONLY = {"leases"}  # a PUT without metadata.resourceVersion is refused (422)
# A DELETE answers the object deleted for these (and pods), a `Status` of Success for the rest.
_DELETE_ANSWERS_OBJECT = {"serviceaccounts", "services", "resourcequotas", "namespaces"}
# What a DELETE's propagationPolicy leaves on the object for the garbage collector (none:
# Background, deleted at once unless other finalizers hold it); batch/v1 Jobs default to
# Orphan, every other resource served here to Background.
_GC_FINALIZERS = {"Orphan": "orphan", "Foreground": "foregroundDeletion", "Background": None}
_ORPHANED_BY_DEFAULT = {"jobs"}
_OMITTED_WHEN_EMPTY = ("labels", "annotations", "finalizers", "ownerReferences")
SNAPSHOTS = 64  # paged lists whose pages are kept; an older one's continue token gets 410

_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
            500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


class ApiError(Exception):
    """An error answer; `details`: its Status's (name, group, kind), where modelled."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason or _REASONS.get(code, "Unknown")
        self.details = details


def status_body(code: int, message: str, reason: str | None = None, details: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason or _REASONS.get(code, "Unknown"), **({"details": details} if details else {}),
            "code": code}


def _with_finalizers(meta: Mapping, finalizers: list[str]) -> dict:
    """`meta` with these finalizers (none: no key, as the apiserver leaves it out)."""
    kept = {k: v for k, v in meta.items() if k != "finalizers"}
    return {**kept, "finalizers": finalizers} if finalizers else kept


def _details(name: str, group: str, kind: str) -> dict:
    """A Status's details as the apiserver writes them (no group for the core API)."""
    return {"name": name, **({"group": group} if group else {}), "kind": kind}


def _missing(res: Resource, name: str) -> ApiError:
    """The apiserver's 404 for an object that does not exist (a GET, PATCH, PUT or DELETE)."""
    return ApiError(404, f'{res.qualified} "{name}" not found', details=_details(name, res.group, res.plural))


@dataclass
class DeleteOptions:
    """A DELETE's options (its body's DeleteOptions, else its query), as the apiserver reads
    and validates them before it looks the object up (v1.28.15 and v1.34.9). A `dryRun`
    other than `All` is not validated here (its message's format differs by version)."""

    policy: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    dry_run: bool = False
    grace: int | None = None

    @classmethod
    def read(cls, query: Mapping[str, str], body: Any) -> "DeleteOptions":
        given: Mapping[str, Any] = body if isinstance(body, dict) else query  # a body: the query is ignored
        policy, orphan = given.get("propagationPolicy"), given.get("orphanDependents")
        invalid = 'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: '
        details = {"group": "meta.k8s.io", "kind": "DeleteOptions"}
        if policy is not None and policy not in _GC_FINALIZERS:
            raise ApiError(422, f'{invalid}Unsupported value: "{policy}": supported values: "Foreground", '
                                f'"Background", "Orphan", "nil"', details=details)
        if policy is not None and orphan is not None:
            raise ApiError(422, f'{invalid}Invalid value: "{policy}": orphanDependents and deletionPropagation '
                                f"cannot be both set", details=details)
        if orphan is not None:  # the deprecated field: true orphans, false is Background
            policy = "Orphan" if _flag(str(orphan)) else "Background"
        dry = given.get("dryRun")
        dry_run = "All" in (dry if isinstance(dry, list) else [dry])
        grace = given.get("gracePeriodSeconds")
        preconditions = (body.get("preconditions") or {}) if isinstance(body, dict) else {}
        return cls(policy, preconditions.get("uid"), preconditions.get("resourceVersion"), dry_run,
                   None if grace is None else int(grace))

    def check(self, res: Resource, current: dict) -> None:
        """The preconditions against the stored object (409), the UID's first."""
        meta = current["metadata"]
        prefix = f'Operation cannot be fulfilled on {res.qualified_kind} "{meta["name"]}": the '
        details = _details(meta["name"], res.group, res.kind)
        if self.uid is not None and self.uid != meta.get("uid"):
            raise ApiError(409, f"{prefix}UID in the precondition ({self.uid}) does not match the UID in record "
                                f"({meta.get('uid')}). The object might have been deleted and then recreated",
                           details=details)
        if self.resource_version is not None and self.resource_version != meta.get("resourceVersion"):
            raise ApiError(409, f"{prefix}ResourceVersion in the precondition ({self.resource_version}) does not "
                                f"match the ResourceVersion in record ({meta.get('resourceVersion')}). The object "
                                f"might have been modified", details=details)

    def finalizers(self, res: Resource, meta: Mapping) -> list[str]:
        """The object's finalizers once this delete is taken: the garbage collector's one for
        the policy in place of any it had, after the others."""
        policy = self.policy or ("Orphan" if res.key in _ORPHANED_BY_DEFAULT else "Background")
        kept = [f for f in meta.get("finalizers") or [] if f not in _GC_FINALIZERS.values()]
        gc = _GC_FINALIZERS[policy]
        return kept + [gc] if gc else kept


# --- selectors -------------------------------------------------------------------------------
_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [x.strip() for x in parts if x.strip()]


def _log_since_seconds(query: Mapping[str, str], name: str) -> str | None:
    """A log request's `sinceSeconds`, checked as the apiserver checks PodLogOptions, before
    it looks for the pod (seen on v1.34.9): a number (400), positive and not beside
    `sinceTime` (422)."""
    seconds = query.get("sinceSeconds")
    if seconds is None:
        return None
    if not re.fullmatch(r"-?\d+", seconds):
        raise ApiError(400, f'strconv.ParseInt: parsing "{seconds}": invalid syntax')
    if query.get("sinceTime") is not None:
        raise ApiError(422, f'PodLogOptions "{name}" is invalid: []: Forbidden: at most one of `sinceTime` or '
                            f'`sinceSeconds` may be specified', reason="Invalid")
    if int(seconds) < 1:
        raise ApiError(422, f'PodLogOptions "{name}" is invalid: sinceSeconds: Invalid value: {int(seconds)}: must be '
                            f'greater than 0', reason="Invalid")
    return seconds


def label_matcher(selector: str | None) -> Any:
    """A predicate over a labels dict; ApiError(400) for a selector it cannot parse."""
    tests = []
    for req in _split_selector(selector or ""):
        m = _SET_RE.match(req)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            tests.append(lambda lb, k=key, vs=values, neg=op == "notin": (lb.get(k) in vs) != neg
                         if k in lb else neg)
        elif "!=" in req:
            key, value = (x.strip() for x in req.split("!=", 1))
            tests.append(lambda lb, k=key, v=value: lb.get(k) != v)
        elif "=" in req:
            key, value = (x.strip() for x in req.replace("==", "=").split("=", 1))
            tests.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif req.startswith("!"):
            tests.append(lambda lb, k=req[1:].strip(): k not in lb)
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", req):
            tests.append(lambda lb, k=req: k in lb)
        else:
            raise ApiError(400, f"unable to parse requirement: {req!r}")
    return lambda labels: all(t(labels or {}) for t in tests)


# Field labels the apiserver maps to another path (pkg/registry/core/event: `source` is the component).
_FIELD_LABELS = {"events": {"source": "source.component"}}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def field_matcher(selector: str | None, resource: str = "") -> Any:
    tests = []
    for req in _split_selector(selector or ""):
        neg = "!=" in req
        path, _, value = req.replace("!=", "=").replace("==", "=").partition("=")
        if not _:
            raise ApiError(400, f"invalid field selector: {req!r}")
        path = _FIELD_LABELS.get(resource, {}).get(path.strip(), path)
        keys = path.strip().split(".")

        def lookup(obj: Any, keys: list[str] = keys) -> str:
            for k in keys:
                obj = obj.get(k) if isinstance(obj, dict) else None
            return "" if obj is None else str(obj)
        tests.append(lambda o, f=lookup, v=value.strip(), n=neg: (f(o) == v) != n)
    return lambda obj: all(t(obj) for t in tests)


# --- records ---------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    user_agent: str
    accept: str = ""
    status: int = 0
    started: float = 0.0  # time.monotonic() on arrival
    finished: float = 0.0  # when answered (0: never, e.g. cut by an outage)


@dataclass
class _Rule:
    path: str
    status: int
    times: int
    method: str | None
    watch: bool | None
    message: str

    def matches(self, method: str, path: str, is_watch: bool) -> bool:
        return (path == self.path or path.startswith(self.path.rstrip("/") + "/")) \
            and (self.method is None or self.method == method) \
            and (self.watch is None or self.watch == is_watch)


@dataclass
class _Delay:
    path: str
    seconds: float
    times: int | None
    method: str | None


@dataclass
class _Watcher:
    resource: Resource
    namespace: str | None
    labels: Any
    fields: Any
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    bookmarks: bool = False
    user_agent: str = ""


@dataclass
class _Change:
    rv: int
    resource: str
    type: str
    obj: dict
    old: dict | None


def _node_table(listed: dict, include: str) -> dict:
    """A node list as the apiserver prints it for `kubectl get nodes` (server-side printing:
    `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), the columns a v1.34.9 apiserver
    names; `includeObject=None` leaves the objects out, else each row has its metadata."""
    names = ("Name", "Status", "Roles", "Age", "Version", "Internal-IP", "External-IP", "OS-Image", "Kernel-Version",
             "Container-Runtime")
    rows = []
    for node in listed["items"]:
        info = (node.get("status") or {}).get("nodeInfo") or {}
        cells = [node["metadata"]["name"], "Ready", "<none>", "1d", info.get("kubeletVersion", ""), "<none>", "<none>",
                 info.get("osImage", ""), info.get("kernelVersion", ""), info.get("containerRuntimeVersion", "")]
        obj = None if include == "None" else {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                               "metadata": node["metadata"]}
        rows.append({"cells": cells, "object": obj})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": listed["metadata"],
            "columnDefinitions": [{"name": n, "type": "string", "format": "", "description": "", "priority": 0}
                                  for n in names], "rows": rows}


_DROP, _END, _BOOKMARK = "drop", "end", "bookmark"
_UNCACHED = ("events", "events.k8s.io")  # no watch cache in the apiserver: no bookmarks


# What a new cluster holds (the apiserver makes them at start-up).
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class KubeDouble:
    """The API double. `await start()` (or `async with`), then use `.url`."""

    def __init__(self, *, history_limit: int = 1000, version: str = "v1.30.2",
                 namespaces: Iterable[str] = SYSTEM_NAMESPACES) -> None:
        """`namespaces`: those that exist from the start, made as the API makes them (a new
        cluster's by default)."""
        self.history_limit = history_limit
        # Every field the generated VersionInfo model requires.
        self.version = {"major": version.lstrip("v").split(".")[0], "minor": version.split(".")[1],
                        "gitVersion": version, "gitCommit": "0" * 40, "gitTreeState": "clean",
                        "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.22.0", "compiler": "gc",
                        "platform": "linux/amd64"}
        self.requests: list[RequestRecord] = []
        self._objects: dict[str, dict[tuple[str, str], dict]] = {k: {} for k in RESOURCES}
        self._rv = 100
        self._history: list[_Change] = []
        self._compacted = self._rv  # watches from below this resourceVersion get 410
        self._watchers: list[_Watcher] = []
        self._rules: list[_Rule] = []
        self._delays: list[_Delay] = []
        # Each run of a container (its restartCount then) has a log of its own, as each of the
        # kubelet's container instances has: (namespace, pod, container, run) -> (time, line).
        self._logs: dict[tuple[str, str, str, int], list[tuple[str, str]]] = {}
        self._log_cuts = 0  # cut_log_follows() calls so far
        self._log_ended: set[tuple[str, str, str, int]] = set()
        self._log_changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""
        # user -> {(namespace or "*", group, resource[/subresource], verb, name or "*")}
        self.rbac: dict[str, set[tuple[str, str, str, str, str]]] = {}
        self.admission: list[Any] = []  # async (pod, namespace) -> pod, run on every pod create
        self.write_latency: tuple[float, float] | None = None  # (min, max) seconds before a write commits
        self.bookmark_seconds = 60.0  # the apiserver sends a bookmark about once a minute
        self._outage_until = 0.0
        self._outage_blip = False
        # (resource, namespace, resourceVersion) -> the objects a paged list's pages come from
        self._snapshots: dict[tuple[str, str | None, int], list[dict]] = {}
        self._silenced: list[tuple[str, str | None]] = []
        self.pod_ports: dict[tuple[str, str, int], int] = {}  # (namespace, pod, port) -> local port
        for name in namespaces:
            self.make_namespace(name)

    # --- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> "KubeDouble":
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.drop_watches()
        async with self._log_changed:
            self._log_ended.update(self._logs)
            self._log_changed.notify_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "KubeDouble":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def api_client(self, user_agent: str | None = None) -> Any:
        """A kubernetes-asyncio ApiClient pointed at the double (plain HTTP)."""
        from kubernetes_asyncio import client as k8s
        api = k8s.ApiClient(k8s.Configuration(host=self.url))
        if user_agent:
            api.user_agent = user_agent
        return api

    def kube_api(self, user_agent: str | None = None) -> Any:
        """A `webhook.kube.KubeApi` pointed at the double."""
        from webhook.kube._api import KubeApi
        return KubeApi(self.api_client(user_agent))

    # --- test hooks --------------------------------------------------------------------------
    def fail_next(self, path: str, status: int, times: int = 1, *, method: str | None = None,
                  watch: bool | None = None, message: str = "injected failure") -> None:
        """The next `times` requests whose path is `path` (or below it) answer `status`.
        `method` and `watch` (True: watches only, False: no watches) narrow the match."""
        self._rules.append(_Rule(path, status, times, method, watch, message))

    def delay(self, path: str, seconds: float, times: int | None = None, *, method: str | None = None) -> None:
        """Matching requests (path or below) wait `seconds` first; `times=None`: always."""
        self._delays.append(_Delay(path, seconds, times, method))

    def clear_faults(self) -> None:
        self._rules.clear()
        self._delays.clear()

    def outage(self, seconds: float, *, blip: bool = False) -> None:
        """For `seconds`, the apiserver is unreachable. Gone (default): every request and
        open watch is reset at once. `blip` (a network partition): requests and watches
        hang, then are reset when it ends, as TCP connections that stalled."""
        self._outage_until = time.monotonic() + seconds
        self._outage_blip = blip
        for w in self._watchers:
            w.queue.put_nowait(_DROP)

    def silence(self, user_agent: str, method: str | None = None) -> None:
        """From now on, requests from `user_agent` (only `method` ones if given) are reset
        before they reach the store, and its open watches are cut: that client is dead to
        the cluster (SIGKILL, a lost node), or just its writes of one kind are."""
        self._silenced.append((user_agent, method))
        if method is None:
            for w in self._watchers:
                if w.user_agent == user_agent:
                    w.queue.put_nowait(_DROP)

    def _is_silenced(self, request: web.Request) -> bool:
        agent = request.headers.get("User-Agent", "")
        return any(agent == a and m in (None, request.method) for a, m in self._silenced)

    @property
    def in_outage(self) -> bool:
        return time.monotonic() < self._outage_until

    async def _outage_cut(self, request: web.Request) -> None:
        """Reset the connection as the outage wants it (a blip first stalls until it ends)."""
        if self._outage_blip:
            await asyncio.sleep(max(0.0, self._outage_until - time.monotonic()))
        if request.transport is not None:
            request.transport.abort()

    def send_bookmarks(self) -> None:
        """Every open watch that allows bookmarks gets one now."""
        for w in self._watchers:
            if w.bookmarks:
                w.queue.put_nowait(_BOOKMARK)

    def drop_watches(self, graceful: bool = False) -> int:
        """Cut every open watch (the connection is aborted; `graceful`: the stream just
        ends, as on a server-side timeout). Returns how many were open."""
        for w in self._watchers:
            w.queue.put_nowait(_END if graceful else _DROP)
        return len(self._watchers)

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    @property
    def resource_version(self) -> int:
        return self._rv

    def compact(self) -> None:
        """Forget the event history: a watch from an older resourceVersion gets 410."""
        self._history.clear()
        self._compacted = self._rv

    def grant(self, user: str, grants: Any) -> None:
        """Let `user` do what `grants` lists: (namespace or "*", group, resource, verb, name or "*")."""
        self.rbac.setdefault(user, set()).update(grants)

    def revoke(self, user: str, verb: str, resource: str) -> None:
        """Take every grant of `verb` on `resource` away from `user`."""
        self.rbac[user] = {g for g in self.rbac.get(user, set()) if (g[2], g[3]) != (resource, verb)}

    # --- objects ---------------------------------------------------------------------------------
    def put(self, resource: str, obj: dict) -> dict:
        """Create or replace an object as-is (no update rules), emitting ADDED/MODIFIED."""
        res = RESOURCES[resource]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", "") if res.namespaced else "", meta["name"])
        old = self._objects[resource].get(key)
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or _uid())
        meta.setdefault("creationTimestamp", (old or {}).get("metadata", {}).get("creationTimestamp") or now_rfc3339())
        if resource == "pods":
            obj.setdefault("status", {"phase": "Pending"})
        if resource == "namespaces":  # the apiserver labels every namespace with its name
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        elif res.namespaced and ("", key[0]) not in self._objects["namespaces"]:
            self.make_namespace(key[0])  # no object lives outside a namespace
        return self._store(res, key, obj, old)

    def put_pod(self, pod: dict) -> dict:
        return self.put("pods", pod)

    def make_namespace(self, name: str) -> dict:
        """A namespace as the API creates it (Active, the `kubernetes` finalizer)."""
        return self._create(RESOURCES["namespaces"], None, {"metadata": {"name": name}})

    def put_node(self, name: str, kubelet_version: str = "v1.30.2", labels: dict | None = None) -> dict:
        return self.put("nodes", {"metadata": {"name": name, "labels": labels or {}},
                                  "status": {"nodeInfo": {"kubeletVersion": kubelet_version}}})

    def get(self, resource: str, namespace: str | None, name: str) -> dict | None:
        res = RESOURCES[resource]
        obj = self._objects[resource].get((namespace or "" if res.namespaced else "", name))
        return copy.deepcopy(obj) if obj else None

    def pod(self, namespace: str, name: str) -> dict:
        pod = self.get("pods", namespace, name)
        if pod is None:
            raise KeyError(f"no pod {namespace}/{name}")
        return pod

    def items(self, resource: str, namespace: str | None = None) -> list[dict]:
        """The objects in the apiserver's order: by their storage key (`namespace/name`)."""
        return [copy.deepcopy(o) for o in sorted(self._objects[resource].values(), key=_storage_key)
                if namespace is None or (o.get("metadata") or {}).get("namespace", "") == namespace]

    def delete(self, resource: str, namespace: str | None, name: str) -> None:
        """The object gone at once (DELETED), whatever holds it: for tests' own set-up."""
        res = RESOURCES[resource]
        key = (namespace or "" if res.namespaced else "", name)
        old = self._objects[resource].pop(key)
        self._emit(res, "DELETED", self._bump(copy.deepcopy(old)), old)

    def _delete(self, res: Resource, key: tuple[str, str], current: dict, options: DeleteOptions) -> dict:
        """A DELETE of anything but a pod, as the apiserver takes it (without a garbage
        collector, as one with no kube-controller-manager): an object some finalizer holds,
        the garbage collector's for the policy included, is marked (`deletionTimestamp` now,
        grace 0) and answered; a later delete only swaps that collector's finalizer for the
        new policy's. One nothing holds goes, answered with itself or a `Status`. A dry run
        answers the same and changes nothing."""
        meta = current["metadata"]
        finalizers = options.finalizers(res, meta)
        # A namespace stays Terminating until the namespace controller (not run here) has
        # emptied it and removed its spec's finalizers; nothing new is created in it meanwhile.
        terminating = res.key == "namespaces" and bool((current.get("spec") or {}).get("finalizers"))
        if finalizers or terminating:
            mark = {"deletionTimestamp": meta.get("deletionTimestamp") or now_rfc3339(),
                    **({} if terminating else {"deletionGracePeriodSeconds": 0})}
            marked = {**current, "metadata": {**_with_finalizers(meta, finalizers), **mark}}
            if terminating:
                marked["status"] = {**(current.get("status") or {}), "phase": "Terminating"}
            if marked == current or options.dry_run:
                return copy.deepcopy(marked)
            return self._store(res, key, marked, current)
        if not options.dry_run:
            self.delete(res.key, key[0] or None, key[1])
        if res.key in _DELETE_ANSWERS_OBJECT:
            return copy.deepcopy(current)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {**_details(key[1], res.group, res.plural), "uid": meta["uid"]}}

    def merge(self, resource: str, namespace: str | None, name: str, patch: dict) -> dict:
        """A merge patch applied as a PATCH request is (the update rules), without the request."""
        res = RESOURCES[resource]
        key = (namespace or "" if res.namespaced else "", name)
        return self._patch(res, key, self._objects[resource][key], patch, "application/merge-patch+json", None)

    def delete_pod(self, namespace: str, name: str, grace: int | None = None, *, at: datetime | None = None,
                   options: DeleteOptions | None = None) -> dict:
        """Delete a pod as the apiserver does (`DELETE` with `gracePeriodSeconds`; `at`: when it
        is received, default now), as seen on v1.28.15 and v1.34.9. A pod the kubelet runs
        (scheduled, not ended) is only marked: `deletionTimestamp` `at` + `grace` (default its
        `terminationGracePeriodSeconds`, else 30), to the second, and the grace. A later delete
        may only shorten it: the mark moves by the difference, and with kubernetes#122646 never
        before `at` (v1.34.9 marks the kubelet's last delete with its own time, v1.28.15 with
        the time the deletion was asked for; the double assumes it from v1.33, which no test
        here checked). With no grace left (the kubelet's last
        delete, or `grace` 0) it is marked `deletionTimestamp` `at` unless it is earlier
        already, and grace 0 (MODIFIED), then removed (DELETED) unless a finalizer holds it; a
        held one goes when its last finalizer is removed. A DELETE request's `options` give it
        the garbage collector's finalizer for their policy (as `_delete`); a dry run answers
        the same and changes nothing. Returns the pod as the answer shows it."""
        key = (namespace, name)
        current = self._objects["pods"][key]
        meta, spec = current["metadata"], current.get("spec") or {}
        dry = options is not None and options.dry_run
        if options is not None:
            meta = _with_finalizers(meta, options.finalizers(RESOURCES["pods"], meta))
        when = (at or datetime.now(timezone.utc)).replace(microsecond=0)
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        if not spec.get("nodeName") or (current.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            grace = 0  # nothing runs it: no grace period to wait out
        pending, marked = meta.get("deletionGracePeriodSeconds"), meta.get("deletionTimestamp")
        if marked is not None and not pending:
            grace = 0  # marked with no grace left already: only its finalizers hold it
        elif marked is not None:  # only a shorter grace period changes it (and the finalizers)
            if grace >= pending:
                updated = {**current, "metadata": meta}
                return copy.deepcopy(updated) if dry or updated == current else \
                    self._store(RESOURCES["pods"], key, updated, current)
            shortened = _parse_rfc3339(marked) - timedelta(seconds=pending - grace)
            # kubernetes#122646: never before now. v1.34.9 has it, v1.28.15 not; its review
            # (January 2025) puts its merge in v1.33's cycle.
            marked = _rfc3339(max(shortened, when) if self._minor >= 33 else shortened)
        elif grace > 0:
            marked = _rfc3339(when + timedelta(seconds=grace))
        if grace > 0:
            updated = {**current, "metadata": {**meta, "deletionTimestamp": marked,
                                               "deletionGracePeriodSeconds": grace}}
            return copy.deepcopy(updated) if dry else self._store(RESOURCES["pods"], key, updated, current)
        # No grace left: marked first (a MODIFIED event, as the apiserver writes it), then
        # removed unless a finalizer holds it.
        if marked is None or _parse_rfc3339(marked) > when:
            marked = _rfc3339(when)
        updated = {**current, "metadata": {**meta, "deletionTimestamp": marked, "deletionGracePeriodSeconds": 0}}
        if dry:
            return copy.deepcopy(updated)
        answer = copy.deepcopy(current) if updated == current else self._store(RESOURCES["pods"], key, updated, current)
        if not meta.get("finalizers"):
            self.delete("pods", namespace, name)
        return answer

    @property
    def _minor(self) -> int:
        return int(self.version["minor"])

    def set_container_statuses(self, namespace: str, name: str, containers: list[dict] | None = None, *,
                               init: list[dict] | None = None, phase: str | None = None,
                               reason: str | None = None, message: str | None = None,
                               start_time: str | None = None) -> dict:
        """Write the pod's status as the kubelet would: container statuses (replacing
        entries by name), phase, reason/message; sets startTime once. Emits MODIFIED."""
        pod = self.pod(namespace, name)
        status = pod.setdefault("status", {})
        for key, new in (("containerStatuses", containers), ("initContainerStatuses", init)):
            if new is not None:
                merged = {s["name"]: s for s in status.get(key) or []}
                merged.update({s["name"]: copy.deepcopy(s) for s in new})
                status[key] = list(merged.values())
        if phase is not None:
            status["phase"] = phase
        for k, v in (("reason", reason), ("message", message)):
            if v is not None:
                status[k] = v
        status.setdefault("startTime", start_time or now_rfc3339())
        if start_time:
            status["startTime"] = start_time
        try:  # a follow ends when its container terminates
            asyncio.get_running_loop().create_task(self._notify_logs())
        except RuntimeError:  # no loop running: no reader can be following
            pass
        return self._store(RESOURCES["pods"], (namespace, name), pod, self._objects["pods"][(namespace, name)])

    def end_pod(self, namespace: str, name: str, reason: str = "DeadlineExceeded",
                message: str = "Pod was active on the node longer than the specified deadline") -> dict:
        """The kubelet's first word on a deadline or eviction: phase Failed, the containers
        still as they were reported (a real kubelet can publish the phase before the ends of
        the containers it stops: kubernetes#98718, seen on v1.34.9)."""
        return self.set_container_statuses(namespace, name, phase="Failed", reason=reason, message=message)

    def kill_pod(self, namespace: str, name: str, reason: str = "DeadlineExceeded",
                 message: str = "Pod was active on the node longer than the specified deadline") -> dict:
        """End the pod as the kubelet does on a deadline or eviction: phase Failed (`end_pod`),
        then every container that is not terminated killed (exit 137), two updates."""
        pod = self.end_pod(namespace, name, reason, message)
        killed = [terminated(s["name"], 137, "Error") if "terminated" not in s.get("state", {}) else s
                  for s in (pod.get("status") or {}).get("containerStatuses") or []]
        init = [terminated(s["name"], 137, "Error") if "terminated" not in s.get("state", {}) else s
                for s in (pod.get("status") or {}).get("initContainerStatuses") or []]
        return self.set_container_statuses(namespace, name, killed, init=init or None, phase="Failed",
                                           reason=reason, message=message)

    def append_log(self, namespace: str, name: str, container: str, text: str, at: str | None = None,
                   run: int | None = None) -> None:
        """Append to a container's log (a newline is added when missing), timed now, or `at`
        (the kubelet's form: RFC 3339, UTC, nine fraction digits). `run`: which of the
        container's runs printed it, by its restartCount (default: the one its status gives
        now; a line of a run the status does not show yet names it)."""
        key = (namespace, name, container, self._run(namespace, name, container) if run is None else run)
        lines = self._logs.setdefault(key, [])
        if at is None:
            seconds, nanos = divmod(time.time_ns(), 10**9)
            at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{nanos:09d}Z"
        lines.append((at, text if text.endswith("\n") else text + "\n"))
        asyncio.ensure_future(self._notify_logs())

    def cut_log_follows(self) -> None:
        """Every log follow open now breaks (its connection reset: a proxy's idle timeout,
        an apiserver restart); the container runs on."""
        self._log_cuts += 1
        asyncio.ensure_future(self._notify_logs())

    def end_log(self, namespace: str, name: str, container: str) -> None:
        """The container's current run stopped: following readers see the end of the stream."""
        key = (namespace, name, container, self._run(namespace, name, container))
        self._logs.setdefault(key, [])
        self._log_ended.add(key)
        asyncio.ensure_future(self._notify_logs())

    def _run(self, namespace: str, name: str, container: str) -> int:
        """The container's current run: its restartCount (0 before it has a status)."""
        pod = self._objects["pods"].get((namespace, name)) or {}
        return _container_run(pod, container)

    async def _notify_logs(self) -> None:
        async with self._log_changed:
            self._log_changed.notify_all()

    # --- introspection -----------------------------------------------------------------------
    def patches(self, namespace: str | None = None, name: str | None = None) -> list[RequestRecord]:
        """PATCH and PUT requests received for pods (optionally one pod), in order."""
        out = []
        for r in self.requests:
            if r.method not in ("PATCH", "PUT"):
                continue
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)(/status)?", r.path)
            if m and (namespace is None or m.group(1) == namespace) and (name is None or m.group(2) == name):
                out.append(r)
        return out

    def events_for(self, namespace: str, name: str) -> list[dict]:
        """Events (both APIs) about the named object, oldest first."""
        core = [e for e in self.items("events", namespace) if (e.get("involvedObject") or {}).get("name") == name]
        new = [e for e in self.items("events.k8s.io", namespace) if (e.get("regarding") or {}).get("name") == name]
        return sorted(core + new, key=lambda e: int(e["metadata"]["resourceVersion"]))

    # --- internals: storage and watch fan-out ------------------------------------------------
    def _bump(self, obj: dict) -> dict:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        return obj

    def _store(self, res: Resource, key: tuple[str, str], obj: dict, old: dict | None) -> dict:
        meta = obj.setdefault("metadata", {})
        for empty in [k for k in _OMITTED_WHEN_EMPTY if k in meta and not meta[k]]:
            del meta[empty]  # Go's omitempty: the apiserver never returns them empty
        self._bump(obj)
        self._objects[res.key][key] = obj
        self._emit(res, "MODIFIED" if old else "ADDED", obj, old)
        return copy.deepcopy(obj)

    def _emit(self, res: Resource, kind: str, obj: dict, old: dict | None) -> None:
        change = _Change(self._rv, res.key, kind, copy.deepcopy(obj), copy.deepcopy(old) if old else None)
        self._history.append(change)
        if len(self._history) > self.history_limit:
            dropped = self._history[: len(self._history) - self.history_limit]
            del self._history[: len(dropped)]
            self._compacted = dropped[-1].rv
        for w in self._watchers:
            event = self._event_for(w, change)
            if event:
                w.queue.put_nowait(event)

    @staticmethod
    def _visible(w: _Watcher, obj: dict | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if w.namespace and meta.get("namespace") != w.namespace:
            return False
        return w.labels(meta.get("labels")) and w.fields(obj)

    def _event_for(self, w: _Watcher, change: _Change) -> dict | None:
        if change.resource != w.resource.key:
            return None
        now_in, was_in = self._visible(w, change.obj), self._visible(w, change.old)
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.obj} if was_in or now_in else None
        if now_in:
            return {"type": "MODIFIED" if was_in else "ADDED", "object": change.obj}
        if was_in:  # left the selection: the apiserver reports it as deleted
            return {"type": "DELETED", "object": change.obj}
        return None

    # --- HTTP ---------------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        record = RequestRecord(request.method, request.path, dict(request.query), ctype, body,
                               request.headers.get("User-Agent", ""), request.headers.get("Accept", ""),
                               started=time.monotonic())
        self.requests.append(record)
        is_watch = _flag(request.query.get("watch"))
        if self.in_outage:
            await self._outage_cut(request)
            return web.Response(status=503)
        if self._is_silenced(request):
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=503)
        if self.write_latency and request.method in ("POST", "PUT", "PATCH", "DELETE"):
            await asyncio.sleep(random.uniform(*self.write_latency))
            if self.in_outage:  # the server went away while the write was queued
                await self._outage_cut(request)
                return web.Response(status=503)
        for d in list(self._delays):
            if (request.path == d.path or request.path.startswith(d.path.rstrip("/") + "/")) and \
                    (d.method is None or d.method == request.method):
                if d.times is not None:
                    d.times -= 1
                    if d.times <= 0:
                        self._delays.remove(d)
                await asyncio.sleep(d.seconds)
        try:
            for rule in self._rules:
                if rule.times > 0 and rule.matches(request.method, request.path, is_watch):
                    rule.times -= 1
                    if rule.status == 410 and is_watch:
                        record.status = 200
                        return await self._watch_error(request, rule.message)
                    raise ApiError(rule.status, rule.message)
            response = await self._route(request, body, ctype, is_watch, raw)
            record.status = response.status
            record.finished = time.monotonic()
            return response
        except ApiError as e:
            record.status = e.code
            record.finished = time.monotonic()
            return web.json_response(status_body(e.code, e.message, e.reason, e.details), status=e.code)

    async def _route(self, request: web.Request, body: Any, ctype: str, is_watch: bool,
                     raw: bytes) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if path == "/version":
            return web.json_response(self.version)
        if path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
            if request.method != "POST":
                raise ApiError(405, f"{request.method} is not supported on subjectaccessreviews")
            return web.json_response(self._access_review(body), status=201)
        if request.method == "POST" and self.admission and \
                re.fullmatch(r"/api/v1/namespaces/[^/]+/pods", path) and isinstance(body, dict):
            namespace = path.split("/")[4]
            for hook in self.admission:
                body = await hook(copy.deepcopy(body), namespace)
        m = re.fullmatch(r"(/api/v1|/apis/[^/]+/[^/]+)/(.*)", path)
        if not m:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        prefix, segs = m.group(1), m.group(2).split("/")
        namespace = None
        if segs[0] == "namespaces" and len(segs) >= 3:
            namespace, segs = segs[1], segs[2:]
        res = _BY_PATH.get((prefix, segs[0]))
        if res is None or (namespace is not None and not res.namespaced) or len(segs) > 3:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        name = segs[1] if len(segs) > 1 else None
        sub = segs[2] if len(segs) > 2 else None
        method = request.method
        if name is None:
            if method == "GET" and is_watch:
                return await self._watch(request, res, namespace)
            if method == "GET":
                listed = self._list(res, namespace, request.query)
                if "as=Table" in request.headers.get("Accept", "") and res.key == "nodes":
                    listed = _node_table(listed, request.query.get("includeObject", "Metadata"))
                return web.json_response(listed)
            if method == "POST":
                return web.json_response(self._create(res, namespace, body), status=201)
            raise ApiError(405, f"{method} is not supported on a collection")
        key = (namespace or "" if res.namespaced else "", name)
        if res.namespaced and namespace is None:
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        if sub == "log" and res.key == "pods" and method == "GET":
            return await self._log(request, namespace or "", name)
        if sub == "portforward" and res.key == "pods" and method == "GET":
            return await self._port_forward(request, namespace or "", name)
        if sub not in (None, "status"):
            raise ApiError(404, f"the server could not find the requested resource ({path})")
        current = self._objects[res.key].get(key)
        if method == "PUT":
            return self._put(res, namespace, key, current, body, sub)
        options = DeleteOptions.read(request.query, body) if method == "DELETE" else None  # checked first
        if current is None:
            raise _missing(res, name)
        if method == "GET":
            return web.json_response(current)
        if options is not None:
            options.check(res, current)
            if res.key == "pods":
                return web.json_response(self.delete_pod(namespace or "", name, options.grace, options=options))
            return web.json_response(self._delete(res, key, current, options))
        if method == "PATCH":
            return web.json_response(self._patch(res, key, current, body, ctype, sub))
        raise ApiError(405, f"{method} is not supported")

    async def _port_forward(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        """A pod's port over a WebSocket (`v4.channel.k8s.io`), as the apiserver and the kubelet
        give it: 404 for no such pod, 400 without one `ports`; then the port number first on
        both channels, the bytes on channel 0, and on channel 1 the kubelet's error when nothing
        listens there (what `pod_ports` does not map to a local port)."""
        if (namespace, name) not in self._objects["pods"]:
            raise _missing(RESOURCES["pods"], name)
        port = request.query.get("ports", "")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ApiError(400, f"invalid port {port!r}: one port is forwarded per connection")
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        number = int(port).to_bytes(2, "little")
        await ws.send_bytes(b"\x00" + number)
        await ws.send_bytes(b"\x01" + number)
        try:
            target = self.pod_ports.get((namespace, name, int(port)))
            if target is None:
                raise ConnectionRefusedError("connection refused")
            reader, writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError as e:
            await ws.send_bytes(b"\x01" + f"error forwarding port {port} to pod {name}: dial tcp4 127.0.0.1:{port}: "
                                          f"connect: {e.strerror or e}".encode())
            await ws.close()
            return ws

        async def downstream() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(b"\x00" + data)
            await ws.close()
        sending = asyncio.create_task(downstream())
        try:
            async for message in ws:
                if message.type == web.WSMsgType.BINARY and message.data[:1] == b"\x00":
                    writer.write(message.data[1:])
                    await writer.drain()
        finally:
            sending.cancel()
            writer.close()
        return ws

    def _access_review(self, body: Any) -> dict:
        """What the RBAC authorizer answers; the review is returned with its status, not stored."""
        spec = (body or {}).get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict) or not (spec.get("user") or spec.get("groups")):
            raise ApiError(422, "SubjectAccessReview.authorization.k8s.io is invalid: spec.user: Invalid value: \"\": "
                                "at least one of user or group must be specified")
        attrs, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if (attrs is None) == (non_resource is None):
            raise ApiError(422, "SubjectAccessReview.authorization.k8s.io is invalid: spec.resourceAttributes: "
                                "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be "
                                "specified")
        allowed = False
        if attrs is not None:
            resource = str(attrs.get("resource") or "") + (f"/{attrs['subresource']}" if attrs.get("subresource")
                                                           else "")
            ns, name = str(attrs.get("namespace") or ""), str(attrs.get("name") or "")
            # A Role's grant (scope = its namespace) never covers a cluster-wide request (ns "").
            allowed = any(scope in ("*", ns) and grp == str(attrs.get("group") or "") and res == resource
                          and verb == attrs.get("verb") and rn in ("*", name)
                          for scope, grp, res, verb, rn in self.rbac.get(str(spec.get("user") or ""), set()))
        out = copy.deepcopy(body)
        out.update(apiVersion="authorization.k8s.io/v1", kind="SubjectAccessReview")
        out.setdefault("metadata", {}).update(creationTimestamp=None)
        out["status"] = {"allowed": allowed, **({"reason": "RBAC: allowed by the double's table"} if allowed else {})}
        return out

    def _list(self, res: Resource, namespace: str | None, query: Any) -> dict:
        """A list, paged as the apiserver's etcd store pages it (e2e `double-lists`): a page
        ends at `limit` matches; a continue token (reusable) says where the next starts in
        the snapshot of the first page's resourceVersion, and comes whenever an object of
        the collection, matching or not, follows the page (so the last page may be empty);
        `remainingItemCount` only when no selector filters. A list's own resourceVersion
        is not modelled: every list is a consistent read."""
        limit = query.get("limit") or "0"
        if not re.fullmatch(r"-?[0-9]+", limit):
            raise ApiError(400, f'strconv.ParseInt: parsing "{limit}": invalid syntax')
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"), res.key)
        token = query.get("continue")
        if token:
            if query.get("resourceVersion"):
                raise ApiError(400, "specifying resource version is not allowed when using continue")
            rv, after = self._continued(token, res, namespace)
            snapshot = self._snapshots.get((res.key, namespace, rv))
            if snapshot is None or rv < self._compacted:  # etcd compacted the snapshot the pages come from
                raise ApiError(410, "The provided continue parameter is too old to display a consistent list "
                                    "result. You can start a new list without the continue parameter.")
        else:
            rv, after, snapshot = self._rv, "", self.items(res.key, namespace)
        start = bisect.bisect_right([_storage_key(o) for o in snapshot], after) if after else 0
        items: list[dict] = []
        end = len(snapshot)
        for i in range(start, len(snapshot)):
            obj = snapshot[i]
            if labels((obj.get("metadata") or {}).get("labels")) and fields(obj):
                items.append(obj)
                if len(items) == int(limit):
                    end = i + 1
                    break
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if end < len(snapshot):
            self._snapshots[(res.key, namespace, rv)] = snapshot
            while len(self._snapshots) > SNAPSHOTS:
                del self._snapshots[next(iter(self._snapshots))]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": rv, "start": _storage_key(snapshot[end - 1]), "list": [res.key, namespace]}).encode()).decode()
            if not query.get("labelSelector") and not query.get("fieldSelector"):
                meta["remainingItemCount"] = len(snapshot) - end
        # (the snapshot's objects are copies already, and the answer is only serialized)
        return {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta, "items": items}

    @staticmethod
    def _continued(token: str, res: Resource, namespace: str | None) -> tuple[int, str]:
        """(resourceVersion, the storage key the page before ended at) of a continue token."""
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, after, listed = int(decoded["rv"]), str(decoded["start"]), decoded["list"]
        except (ValueError, TypeError, KeyError) as e:
            raise ApiError(400, f"invalid continue token: continue key is not valid: {e}") from None
        if listed != [res.key, namespace]:
            raise ApiError(400, "invalid continue token: continue key is not valid: another collection's")
        return rv, after

    def _create(self, res: Resource, namespace: str | None, body: Any, *, on_update: bool = False) -> dict:
        """POST, or a PUT that creates (`on_update`: its resourceVersion is ignored)."""
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        obj = copy.deepcopy(body)
        if res.key == "leases":
            _decode_lease(obj)
        if res.key == "secrets":
            _decode_secret(obj, _undecodable("Secret"))
        if res.key in _WEBHOOK_CONFIGURATIONS:
            _decode_webhooks(obj, _undecodable(res.kind))
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise ApiError(400, "the namespace of the provided object does not match the namespace "
                                    "sent on the request")
            meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, f"{res.kind}: metadata.name: Required value: name or generateName is required")
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        key = (namespace or "" if res.namespaced else "", meta["name"])
        home = self._objects["namespaces"].get(("", namespace or ""))
        if res.namespaced and home is None:
            # NamespaceLifecycle, before any validation; a create on update (a Lease's PUT) too.
            raise ApiError(404, f'namespaces "{namespace}" not found', "NotFound",
                           details=_details(namespace or "", "", "namespaces"))
        if res.namespaced and home is not None and "deletionTimestamp" in home["metadata"]:
            # NamespaceLifecycle, before any validation.
            raise ApiError(403, f'{res.qualified} "{meta["name"]}" is forbidden: unable to create new content in '
                                f"namespace {namespace} because it is being terminated",
                           details=_details(meta["name"], res.group, res.plural))
        _check_metadata(res.qualified_kind, meta)
        if res.key in ("events", "events.k8s.io"):
            _check_event(obj, namespace or "")
        if res.key == "limitranges":
            _check_limit_range(obj)
        if res.key == "leases":
            _check_lease(obj)
        if res.key == "secrets":
            _check_secret(obj)
        if res.key in _WEBHOOK_CONFIGURATIONS:
            _check_webhooks(res.qualified_kind, obj)
        if _resource_version(meta) and not on_update:  # (etcd's store refuses it, before it looks)
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        if key in self._objects[res.key]:
            raise ApiError(409, f'{res.qualified} "{meta["name"]}" already exists', "AlreadyExists")
        meta.pop("resourceVersion", None)
        meta["uid"] = _uid()
        meta["creationTimestamp"] = now_rfc3339()
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        if res.key == "pods":
            obj["status"] = {"phase": "Pending"}
        if res.key == "namespaces":
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj["spec"] = {"finalizers": ["kubernetes"], **(obj.get("spec") or {})}
            obj["status"] = {"phase": "Active"}
        return self._store(res, key, obj, None)

    def _put(self, res: Resource, namespace: str | None, key: tuple[str, str], current: dict | None, body: Any,
             sub: str | None) -> web.Response:
        """PUT as the apiserver's handler and store take it (e2e `double-leases`): the body
        decoded, its name and namespace those of the URL (400); a Lease that does not exist
        is created (201); else the update, whose resourceVersion a Lease must carry (422)."""
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        body = copy.deepcopy(body)
        if res.key == "leases":
            _decode_lease(body)
        if res.key == "secrets":
            _decode_secret(body, _undecodable("Secret"))
        if res.key in _WEBHOOK_CONFIGURATIONS:
            _decode_webhooks(body, _undecodable(res.kind))
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if not meta.get("name"):
            raise ApiError(400, f"the name of the object ({key[1]} based on URL) was undeterminable: "
                                f"name must be provided")
        if meta["name"] != key[1]:
            raise ApiError(400, f"the name of the object ({meta['name']}) does not match the name on the URL "
                                f"({key[1]})")
        if res.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the "
                                "request")
        rv = str(meta.get("resourceVersion") or "")
        if rv and not rv.isdigit():
            raise ApiError(500, f'strconv.ParseUint: parsing "{rv}": invalid syntax')
        if current is None:
            if res.key in _CREATE_ON_UPDATE and sub is None:
                return web.json_response(self._create(res, namespace, body, on_update=True), status=201)
            raise _missing(res, key[1])
        if not rv and res.key in _CONDITIONAL_UPDATES_ONLY:
            raise ApiError(422, f'{res.qualified} "{key[1]}" is invalid: '
                                f"metadata.resourceVersion: Invalid value: 0: must be specified for an update")
        return web.json_response(self._update(res, key, current, body, sub))

    def _patch(self, res: Resource, key: tuple[str, str], current: dict, body: Any, ctype: str,
               sub: str | None) -> dict:
        if ctype == "application/merge-patch+json":
            if not isinstance(body, dict):
                raise ApiError(400, "a merge patch must be a JSON object")
            updated = merge_patch(current, body)
            precondition = (body.get("metadata") or {}).get("resourceVersion") \
                if isinstance(body.get("metadata"), dict) else None
        elif ctype == "application/json-patch+json":
            try:
                updated = jsonpatch.apply_patch(current, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError) as e:
                raise ApiError(422, f"the JSON patch cannot be applied: {e}") from None
            # As the apiserver: a resourceVersion the patch leaves in the object is a precondition.
            meta = updated.get("metadata") if isinstance(updated, dict) else None
            precondition = meta.get("resourceVersion") if isinstance(meta, dict) else None
        else:
            raise ApiError(415, f"the body of the request was in an unknown format - accepted media types "
                                f"include: application/json-patch+json, application/merge-patch+json ({ctype})")
        # The patched object is decoded: what it cannot be is the patch's fault.
        unpatchable = lambda why: ApiError(  # noqa: E731
            422, f' "" is invalid: patch: Invalid value: {json.dumps(json.dumps(updated, separators=(",", ":")))}: {why}')
        if res.key == "secrets":
            _decode_secret(updated, unpatchable)
        if res.key in _WEBHOOK_CONFIGURATIONS:
            _decode_webhooks(updated, unpatchable)
        if precondition is None:  # unconditional: compare to the current version
            updated.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self._update(res, key, current, updated, sub)

    def _update(self, res: Resource, key: tuple[str, str], current: dict, updated: dict, sub: str | None) -> dict:
        meta = updated.setdefault("metadata", {})
        rv = meta.get("resourceVersion")
        if rv and str(rv) != current["metadata"]["resourceVersion"]:
            raise ApiError(409, f'Operation cannot be fulfilled on {res.qualified} "{key[1]}": the object has been '
                                f"modified; please apply your changes to the latest version and try again")
        for fixed in ("name", "namespace", "uid", "creationTimestamp"):
            if fixed in current["metadata"]:
                meta[fixed] = current["metadata"][fixed]
        updated["apiVersion"], updated["kind"] = current.get("apiVersion"), current.get("kind")
        if res.key == "pods":
            if sub == "status":  # the status strategy keeps spec, deletionTimestamp and ownerReferences
                kept = {k: v for k, v in current["metadata"].items() if k in ("deletionTimestamp", "ownerReferences")}
                meta = {k: v for k, v in meta.items() if k not in ("deletionTimestamp", "ownerReferences")}
                updated = {**current, "metadata": {**meta, **kept}, "status": updated.get("status") or {}}
            else:
                updated["status"] = copy.deepcopy(current.get("status"))
                _check_pod_spec(key[1], current.get("spec") or {}, updated.get("spec") or {})
        elif sub == "status":
            updated = {**current, "status": updated.get("status")}
        elif res.key == "limitranges":
            _check_limit_range(updated)
        elif res.key == "leases":
            _decode_lease(updated)
            _check_lease(updated)
        elif res.key == "secrets":
            _check_secret(updated, current)
        elif res.key in _WEBHOOK_CONFIGURATIONS:
            _check_webhooks(res.qualified_kind, updated)
        _check_metadata(res.qualified_kind, updated["metadata"])
        if current["metadata"].get("deletionTimestamp"):
            had = current["metadata"].get("finalizers") or []
            added = [f for f in updated["metadata"].get("finalizers") or [] if f not in had]
            if added:
                raise ApiError(422, f'{res.qualified_kind} "{key[1]}" is invalid: metadata.finalizers: Forbidden: '
                                    f"no new finalizers can be added if the object is being deleted, found new "
                                    f"finalizers "
                                    f"[]string{{{', '.join(json.dumps(f) for f in added)}}}",
                               details=_details(key[1], res.group, res.kind))
        meta = updated["metadata"] = dict(updated["metadata"])
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        if updated == current:  # a no-op update does not bump the resourceVersion
            return copy.deepcopy(current)
        if current["metadata"].get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers"):
            # Its last finalizer gone: deleted, as it was asked to be. The update is not
            # stored: the DELETED event carries the object as it was, finalizers and all.
            self.delete(res.key, key[0] or None, key[1])
            return copy.deepcopy(updated)
        return self._store(res, key, updated, current)

    # --- watch ----------------------------------------------------------------------------------------
    async def _watch_error(self, request: web.Request, message: str, code: int = 410) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(json.dumps({"type": "ERROR", "object": status_body(code, message)}).encode() + b"\n")
        await resp.write_eof()
        return resp

    async def _watch(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        q = request.query
        w = _Watcher(res, namespace, label_matcher(q.get("labelSelector")),
                     field_matcher(q.get("fieldSelector"), res.key),
                     bookmarks=_flag(q.get("allowWatchBookmarks")) and res.key not in _UNCACHED,
                     user_agent=request.headers.get("User-Agent", ""))
        rv = q.get("resourceVersion") or "0"
        if not rv.isdigit():
            raise ApiError(400, f"invalid resourceVersion {rv!r}")
        since = int(rv)
        if since and since < self._compacted:
            return await self._watch_error(request, f"too old resource version: {since} ({self._compacted})")
        if since:
            backlog = [e for e in (self._event_for(w, c) for c in self._history if c.rv > since) if e]
        else:
            backlog = [{"type": "ADDED", "object": o} for o in self.items(res.key, namespace)
                       if self._visible(w, o)]
        for event in backlog:
            w.queue.put_nowait(event)
        self._watchers.append(w)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds", "").isdigit() else None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            await resp.prepare(request)
            while True:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    break
                wait = left if not w.bookmarks else min(left or self.bookmark_seconds, self.bookmark_seconds)
                try:
                    items = [w.queue.get_nowait() if not w.queue.empty() else
                             await asyncio.wait_for(w.queue.get(), wait)]
                except asyncio.TimeoutError:
                    if left is not None and wait >= left:
                        break
                    items = [_BOOKMARK]
                while not w.queue.empty():  # what queued meanwhile goes in the same write
                    items.append(w.queue.get_nowait())
                lines, stop = [], None
                for item in items:
                    if item in (_END, _DROP):
                        stop = item
                        break
                    if item == _BOOKMARK:  # only the resourceVersion the watch has reached
                        item = {"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version,
                                                               "metadata": {"resourceVersion": str(self._rv)}}}
                    lines.append(json.dumps(item).encode() + b"\n")
                if lines and stop != _DROP:
                    await resp.write(b"".join(lines))
                if stop == _END:
                    break
                if stop == _DROP:
                    if self.in_outage:
                        await self._outage_cut(request)
                    elif request.transport is not None:
                        request.transport.abort()
                    return resp
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._watchers.remove(w)
        return resp

    # --- logs ------------------------------------------------------------------------------------------
    async def _log(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        seconds = _log_since_seconds(request.query, name)
        pod = self._objects["pods"].get((namespace, name))
        if pod is None:
            raise _missing(RESOURCES["pods"], name)
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []] + \
                [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
        container = request.query.get("container")
        if not container:
            if len(names) != 1:
                raise ApiError(400, f"a container name must be specified for pod {name}, choose one of: {names}")
            container = names[0]
        if container not in names:
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        state, run = _container_state(pod, container), _container_run(pod, container)
        ran = "running" in state or "terminated" in state  # the current run has started
        # As the kubelet (validateContainerLogStatus): `previous` is the run its lastState
        # reports, the one before the current run, or, for one waiting to be restarted
        # (CrashLoopBackOff, whose restartCount is still its last run's), that last run.
        previous = _flag(request.query.get("previous"))
        if previous:
            if "terminated" not in _container_state(pod, container, "lastState"):
                raise ApiError(400, f'previous terminated container "{container}" in pod "{name}" not found')
            run -= ran
        # No log before a first start; one waiting to be restarted shows its last run's (seen
        # on v1.34.9).
        elif not ran and "terminated" not in _container_state(pod, container, "lastState"):
            reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
            raise ApiError(400, f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        key = (namespace, name, container, run)
        since = request.query.get("sinceTime")
        if since is not None and not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", since):
            raise ApiError(400, f'parsing time "{since}" as "2006-01-02T15:04:05Z07:00": cannot parse')
        if seconds is not None:
            cutoff = time.time_ns() - int(seconds) * 10**9
            c_seconds, c_nanos = divmod(cutoff, 10**9)
            since_stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(c_seconds)) + f".{c_nanos:09d}Z"
        stamps = _flag(request.query.get("timestamps"))

        def shown() -> list[str]:  # the kubelet's: lines from sinceTime (sinceSeconds ago) on, timed when asked
            return [f"{at} {text}" if stamps else text for at, text in self._logs.get(key, [])
                    if (since is None or at[:19] + "Z" >= since) and (seconds is None or at >= since_stamp)]
        lines = shown()
        tail = request.query.get("tailLines")
        start = max(0, len(lines) - int(tail)) if tail and tail.isdigit() else 0
        if not _flag(request.query.get("follow")):
            return web.Response(text="".join(lines[start:]), content_type="text/plain")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        sent, cuts = start, self._log_cuts
        try:
            while True:
                if self._log_cuts != cuts and request.transport is not None:
                    request.transport.abort()  # nothing after the break reaches this reader
                    return resp
                lines = shown()
                while sent < len(lines):
                    await resp.write(lines[sent].encode())
                    sent += 1
                pod = self._objects["pods"].get((namespace, name))
                # The kubelet ends a follow when the run stops (or the pod is gone).
                if previous or key in self._log_ended or pod is None or _container_run(pod, container) > run \
                        or "terminated" in _container_state(pod, container):
                    break
                async with self._log_changed:
                    await self._log_changed.wait()
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp


def _resource_version(meta: dict) -> int:
    """metadata.resourceVersion as the store reads it: 0 when unset (or not a number, on create)."""
    rv = str(meta.get("resourceVersion") or "")
    return int(rv) if rv.isdigit() else 0


_MICRO_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})[.,](\d{6})(Z|[+-]\d{2}:\d{2})")
_LEASE_FIELDS = {"holderIdentity": str, "leaseDurationSeconds": int, "acquireTime": datetime,
                 "renewTime": datetime, "leaseTransitions": int}


def _decode_lease(obj: dict) -> None:
    """A Lease's spec as the apiserver decodes it (400 when it cannot): its fields of their
    types (int32, MicroTime: six fraction digits, then `Z` or an offset, stored in UTC),
    null and unknown fields dropped (e2e `double-leases`)."""
    spec = obj.get("spec")
    if spec is None:
        return

    def refuse(why: str) -> ApiError:
        return ApiError(400, f'Lease in version "v1" cannot be handled as a Lease: {why}')

    if not isinstance(spec, dict):
        raise refuse("json: cannot unmarshal into Go struct field Lease.spec of type v1.LeaseSpec")
    decoded = {}
    for name, value in spec.items():
        kind = _LEASE_FIELDS.get(name)
        if kind is None or value is None:
            continue
        if kind is int and (type(value) is not int or not -2**31 <= value < 2**31):
            raise refuse(f"json: cannot unmarshal {value!r} into Go struct field LeaseSpec.spec.{name} of type int32")
        if kind is str and not isinstance(value, str):
            raise refuse(f"json: cannot unmarshal {value!r} into Go struct field LeaseSpec.spec.{name} of type string")
        if kind is datetime:
            m = _MICRO_TIME.fullmatch(value) if isinstance(value, str) else None
            if m is None:
                raise refuse(f'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00"')
            at = datetime.fromisoformat(f"{m[1]}.{m[2]}{'+00:00' if m[3] == 'Z' else m[3]}")
            value = at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        decoded[name] = value
    obj["spec"] = decoded


def _check_lease(obj: dict) -> None:
    """What the apiserver's Lease validation refuses (422)."""
    spec, name = obj.get("spec") or {}, obj["metadata"]["name"]
    for field_name, least, what in (("leaseDurationSeconds", 1, "greater than 0"),
                                    ("leaseTransitions", 0, "greater than or equal to 0")):
        if spec.get(field_name) is not None and spec[field_name] < least:
            raise ApiError(422, f'Lease.coordination.k8s.io "{name}" is invalid: spec.{field_name}: Invalid value: '
                                f"{spec[field_name]}: must be {what}")


def _storage_key(obj: dict) -> str:
    """Where etcd keeps an object, below its resource's prefix: lists come in this order."""
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def _flag(value: str | None) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it (clients send "True")."""
    return (value or "").lower() in ("1", "t", "true")


def _container_status(pod: dict, container: str) -> dict:
    """The container's status in the pod (an init container's too); {} before it has one."""
    status = pod.get("status") or {}
    return next((s for s in [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]
                 if s.get("name") == container), {})


def _container_state(pod: dict, container: str, which: str = "state") -> dict:
    return _container_status(pod, container).get(which) or {}


def _container_run(pod: dict, container: str) -> int:
    """The container's current run, its restartCount (0 before it has a status)."""
    return int(_container_status(pod, container).get("restartCount") or 0)


def _uid() -> str:
    return "".join(random.choices("0123456789abcdef", k=8)) + "-0000-4000-8000-" + \
        "".join(random.choices("0123456789abcdef", k=12))


_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ANNOTATIONS_LIMIT = 256 * 1024  # bytes of keys and values together (TotalAnnotationSizeLimitB)


def _qualified_name_errors(key: str) -> str | None:
    """What the apiserver says of a label or annotation key that is not a qualified name
    (an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters)."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, " \
               "'-' or '.', and must start and end with an alphanumeric character"
    if not name or len(name) > 63:
        return "name part must be no more than 63 characters" if name else "name part must be non-empty"
    if not _QUALIFIED_NAME.match(name):
        return "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with " \
               "an alphanumeric character"
    return None


def _check_metadata(kind: str, meta: dict) -> None:
    """The apiserver's object metadata validation, the part a client can get wrong: label
    and annotation keys are qualified names, label values at most 63 characters of their
    alphabet, annotations at most 256 KiB together (422 otherwise)."""
    name = meta.get("name") or meta.get("generateName") or ""
    annotations = meta.get("annotations") or {}
    for key, value in annotations.items():
        if not isinstance(value, str):
            raise ApiError(400, f"metadata.annotations[{key}]: a string is expected, got {type(value).__name__}")
        problem = _qualified_name_errors(key.lower())
        if problem:
            raise ApiError(422, f'{kind} "{name}" is invalid: metadata.annotations: Invalid value: "{key}": {problem}')
    size = sum(len(k) + len(v) for k, v in annotations.items())
    if size > ANNOTATIONS_LIMIT:
        raise ApiError(422, f'{kind} "{name}" is invalid: metadata.annotations: Too long: may not be more than '
                            f"{ANNOTATIONS_LIMIT} bytes")
    labels = meta.get("labels") or {}
    for key, value in labels.items() if isinstance(labels, dict) else []:
        problem = _qualified_name_errors(str(key))
        if problem:
            raise ApiError(422, f'{kind} "{name}" is invalid: metadata.labels: Invalid value: "{key}": {problem}')
        if isinstance(value, str) and len(value) > 63:
            raise ApiError(422, f'{kind} "{name}" is invalid: metadata.labels: Invalid value: "{value}": must be no '
                                f"more than 63 characters")
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise ApiError(422, f'{kind} "{name}" is invalid: metadata.labels: Invalid value: "{value}": a valid '
                                f"label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                                f"'.', and must start and end with an alphanumeric character")


def _check_event(event: dict, namespace: str) -> None:
    """What the apiserver's Event validation refuses (the parts a client can get wrong)."""
    name = event["metadata"]["name"]
    wrong = f"may not be '{name}'" if name in (".", "..") else \
        next((f"may not contain '{c}'" for c in "/%" if c in name), None)  # (ValidatePathSegmentName)
    if wrong:
        raise ApiError(422, f'Event "{name}" is invalid: metadata.name: Invalid value: "{name}": {wrong}')
    # (events.k8s.io/v1's `regarding` is the same field: the apiserver validates both as one type)
    involved = (event.get("involvedObject") or event.get("regarding") or {}).get("namespace") or ""
    # An empty involvedObject.namespace is accepted only in "default" (old clients).
    if involved != namespace and not (involved == "" and namespace in ("", "default")):
        raise ApiError(422, f'Event "{name}" is invalid: involvedObject.namespace: Invalid value: "{involved}": '
                            f"does not match event.namespace")


def _check_pod_spec(name: str, old: dict, new: dict) -> None:
    """The apiserver's pod update rule, the part that matters here: only images,
    activeDeadlineSeconds (set when unset or lowered, > 0) and added tolerations change."""
    ads_old, ads_new = old.get("activeDeadlineSeconds"), new.get("activeDeadlineSeconds")
    if ads_new != ads_old:
        if ads_new is None or not isinstance(ads_new, int) or isinstance(ads_new, bool) or ads_new <= 0:
            raise ApiError(422, f'Pod "{name}" is invalid: spec.activeDeadlineSeconds: Invalid value: {ads_new!r}: '
                                f"must be a positive integer that is unset or lowered")
        if ads_old is not None and ads_new > ads_old:
            raise ApiError(422, f'Pod "{name}" is invalid: spec.activeDeadlineSeconds: Invalid value: {ads_new}: '
                                f"must be less than or equal to the previous value")

    def strip(spec: dict) -> dict:
        s = copy.deepcopy(spec)
        s.pop("activeDeadlineSeconds", None)
        s.pop("tolerations", None)
        for key in ("containers", "initContainers"):
            for c in s.get(key) or []:
                c.pop("image", None)
        return s
    if strip(old) != strip(new):
        raise ApiError(422, f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other '
                            f"than `spec.containers[*].image`, `spec.initContainers[*].image`, "
                            f"`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                            f"tolerations)")


# ValidateLimitRange's order checks, in its order: (lower, upper, the field named, the value
# it prints (as v1.34.9 prints it), the message).
_LIMIT_ORDER = (("min", "max", "min", "min", "min value {} is greater than max value {}"),
                ("min", "defaultRequest", "defaultRequest", "defaultRequest",
                 "min value {} is greater than default request value {}"),
                ("defaultRequest", "max", "defaultRequest", "defaultRequest",
                 "default request value {} is greater than max value {}"),
                ("defaultRequest", "default", "defaultRequest", "defaultRequest",
                 "default request value {} is greater than default limit value {}"),
                ("min", "default", "default", "min", "min value {} is greater than default value {}"),
                ("default", "max", "default", "max", "default value {} is greater than max value {}"))
_QUALIFIED_NAME_RULE = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                   "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                   "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def _default_limit_range(obj: dict) -> None:
    """SetDefaults_LimitRangeItem, which the apiserver applies before it validates and
    stores: a Container item's `default` from `max`, `defaultRequest` from `default`, then
    from `min`."""
    for limit in (obj.get("spec") or {}).get("limits") or []:
        if limit.get("type") != "Container":
            continue
        for target, sources in (("default", ("max",)), ("defaultRequest", ("default", "min"))):
            merged = dict(limit.get(target) or {})
            for source in sources:
                for resource, value in (limit.get(source) or {}).items():
                    merged.setdefault(resource, value)
            if merged:
                limit[target] = merged


def _check_limit_range(obj: dict) -> None:
    """The apiserver's LimitRange defaulting and validation (ValidateLimitRange), the parts a
    client can get wrong: 422 with every error, worded as v1.34.9 words them (checked
    against it by hand; tests/admission/test_views.py pins the words)."""
    from webhook.rewrite._quantity import QuantityError, parse

    _default_limit_range(obj)
    name = (obj.get("metadata") or {}).get("name") or ""
    errors: list[str] = []

    def invalid(path: str, why: str) -> None:
        errors.append(f"spec.limits{path}: {why}")
    seen: set[str] = set()
    for i, limit in enumerate(((obj.get("spec") or {}).get("limits") or [])):
        kind = limit.get("type") or ""
        if not kind:
            invalid(f"[{i}].type", 'Invalid value: "": name part must be non-empty')
            invalid(f"[{i}].type", f'Invalid value: "": {_QUALIFIED_NAME_RULE}')
        elif kind in seen:
            invalid(f"[{i}].type", f'Duplicate value: "{kind}"')
        seen.add(kind)
        if kind == "Pod":
            for key in ("default", "defaultRequest"):
                if limit.get(key):
                    invalid(f"[{i}].{key}", "Forbidden: may not be specified when `type` is 'Pod'")
        amounts: dict[str, dict[str, int]] = {}
        for key in ("max", "min", "default", "defaultRequest", "maxLimitRequestRatio"):
            for resource, value in (limit.get(key) or {}).items():
                try:
                    amounts.setdefault(resource, {})[key] = parse(value, resource)
                except QuantityError:
                    invalid(f"[{i}].{key}[{resource}]", f'Invalid value: "{value}": quantities must match '
                                                        f"the regular expression")
        for resource, have in sorted(amounts.items()):
            for low, high, named, shown, message in _LIMIT_ORDER:
                if low in have and high in have and have[low] > have[high]:
                    invalid(f"[{i}].{named}[{resource}]", f'Invalid value: "{limit[shown][resource]}": '
                            + message.format(limit[low][resource], limit[high][resource]))
            ratio = limit.get("maxLimitRequestRatio", {}).get(resource)
            if ratio is not None and parse(ratio, "cpu") < 1000:
                invalid(f"[{i}].maxLimitRequestRatio[{resource}]",
                        f'Invalid value: "{ratio}": ratio {ratio} is less than 1')
            elif ratio is not None and "min" in have and "max" in have and have["min"] > 0 \
                    and parse(ratio, "cpu") * have["min"] > have["max"] * 1000:
                invalid(f"[{i}].maxLimitRequestRatio[{resource}]", f'Invalid value: "{ratio}": ratio {ratio} is '
                                                                   f'greater than max/min = {have["max"] / have["min"]:f}')
    if errors:
        raise _invalid("LimitRange", name, errors)


def _invalid(kind: str, name: str, errors: list[str]) -> ApiError:
    """The apiserver's 422 for a validation's field errors: one alone, several in brackets."""
    return ApiError(422, f'{kind} "{name}" is invalid: ' + (errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"))


# A Secret's data as the apiserver decodes it: encoding/json reads a []byte with Go's
# base64.StdEncoding (padding required, line ends skipped, trailing bits ignored).
_BASE64 = {c: i for i, c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_SECRET_MAX_BYTES = 1024 * 1024  # core.MaxSecretSize: the values' decoded bytes together
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
# ValidateSecret's keys a type requires (basic-auth: username or password, apart).
_SECRET_KEYS = {"kubernetes.io/tls": ("tls.crt", "tls.key"), "kubernetes.io/dockerconfigjson": (".dockerconfigjson",),
                "kubernetes.io/dockercfg": (".dockercfg",), "kubernetes.io/ssh-auth": ("ssh-privatekey",)}


def _go_base64(text: str) -> bytes:
    """`text` decoded as Go's base64.StdEncoding decodes it (its decodeQuantum, one 4-character
    quantum at a time); ValueError(offset) where Go reports "illegal base64 data at input
    byte N" (e2e `double-secrets` compares the offsets)."""
    src, si, out = text.encode(), 0, bytearray()
    while True:
        quantum: list[int] = []
        while len(quantum) < 4:
            if si == len(src):
                if not quantum:
                    return bytes(out)
                raise ValueError(si - len(quantum))  # padding is required
            c = src[si]
            si += 1
            if c in _BASE64:
                quantum.append(_BASE64[c])
                continue
            if c in b"\r\n":
                continue
            if c != ord("=") or len(quantum) < 2:
                raise ValueError(si - 1)
            if len(quantum) == 2:  # "==" is due: the second, past line ends
                while si < len(src) and src[si] in b"\r\n":
                    si += 1
                if si == len(src):
                    raise ValueError(len(src))
                if src[si] != ord("="):
                    raise ValueError(si - 1)
                si += 1
            while si < len(src) and src[si] in b"\r\n":
                si += 1
            if si < len(src):  # something after the padding
                raise ValueError(si)
            break
        value = 0
        for sextet in quantum + [0] * (4 - len(quantum)):
            value = value << 6 | sextet
        out += value.to_bytes(3, "big")[:len(quantum) - 1]
        if len(quantum) < 4:
            return bytes(out)


def _decoded(value: str, refuse: Any) -> bytes:
    """A []byte field's JSON string as the apiserver decodes it; `refuse(why)` when it cannot."""
    try:
        return _go_base64(value)
    except ValueError as e:
        raise refuse(f"illegal base64 data at input byte {e.args[0]}") from None


def _undecodable(kind: str) -> Any:
    """The 400 of a create's or PUT's body the apiserver cannot decode."""
    return lambda why: ApiError(400, f'{kind} in version "v1" cannot be handled as a {kind}: {why}')


def _decode_secret(obj: dict, refuse: Any) -> None:
    """A Secret as the apiserver decodes it and stores it: `data` base64 (`refuse(why)` when a
    value is not), stored as the decoded bytes encode again; `stringData` merged into it
    and not kept; `type` "Opaque" when unset or empty."""
    decoded: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        decoded[key] = _decoded(value, refuse) if isinstance(value, str) else b""
    for key, value in (obj.pop("stringData", None) or {}).items():
        decoded[key] = str(value).encode()
    obj.pop("data", None)
    if decoded:
        obj["data"] = {key: base64.b64encode(value).decode() for key, value in decoded.items()}
    obj["type"] = obj.get("type") or "Opaque"


def _config_key_errors(key: str) -> list[str]:
    """validation.IsConfigMapKey: what is wrong with a Secret's or ConfigMap's data key."""
    errors = ["must be no more than 253 characters"] if len(key) > 253 else []
    if not _CONFIG_KEY.fullmatch(key):
        errors.append("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
                      "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')")
    if key in (".", ".."):
        errors.append(f"must not be '{key}'")
    elif key.startswith(".."):
        errors.append("must not start with '..'")
    return errors


_WEBHOOK_CONFIGURATIONS = {"mutatingwebhookconfigurations", "validatingwebhookconfigurations"}
_WEBHOOK_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _decode_webhooks(obj: dict, refuse: Any) -> None:
    """A webhook configuration's `clientConfig.caBundle`s as the apiserver decodes them
    ([]byte: Go's base64, `refuse(why)` when one is not) and stores them (re-encoded)."""
    for hook in obj.get("webhooks") or []:
        config = hook.get("clientConfig") if isinstance(hook, dict) else None
        if isinstance(config, dict) and isinstance(config.get("caBundle"), str):
            bundle = _decoded(config["caBundle"], refuse)
            config["caBundle"] = base64.b64encode(bundle).decode()
            if not bundle:
                del config["caBundle"]


def _check_webhooks(kind: str, obj: dict) -> None:
    """ValidateMutatingWebhookConfiguration (and its validating twin) for admissionregistration
    v1, the parts a client can get wrong, worded as v1.34.9 words them (e2e
    `double-webhook-configurations`): each webhook's name (a unique domain of three
    segments or more), one of url or service, sideEffects and admissionReviewVersions (422)."""
    errors: list[str] = []
    seen: set[str] = set()
    for i, hook in enumerate(obj.get("webhooks") or []):
        at, name = f"webhooks[{i}]", str(hook.get("name") or "")
        if not _WEBHOOK_NAME.fullmatch(name) or len(name) > 253:
            errors.append(f'{at}.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower '
                          f"case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                          f"character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                          f"(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
        elif name.count(".") < 2:
            errors.append(f'{at}.name: Invalid value: "{name}": should be a domain with at least three segments '
                          f"separated by dots")
        elif name in seen:
            errors.append(f'{at}.name: Duplicate value: "{name}"')
        seen.add(name)
        config = hook.get("clientConfig") or {}
        if ("url" in config) == ("service" in config):
            errors.append(f"{at}.clientConfig: Required value: exactly one of url or service is required")
        if hook.get("sideEffects") is None:
            errors.append(f"{at}.sideEffects: Required value: must specify one of None, NoneOnDryRun")
        elif hook["sideEffects"] not in ("None", "NoneOnDryRun"):
            errors.append(f'{at}.sideEffects: Unsupported value: "{hook["sideEffects"]}": supported values: "None", '
                          f'"NoneOnDryRun"')
        if not hook.get("admissionReviewVersions"):
            errors.append(f"{at}.admissionReviewVersions: Required value: must specify one of v1, v1beta1")
    if errors:
        raise _invalid(kind, obj["metadata"]["name"], errors)


def _check_secret(obj: dict, current: dict | None = None) -> None:
    """ValidateSecret (on update ValidateSecretUpdate first: `type` and an `immutable`
    Secret's data never change) as v1.34.9 words it (e2e `double-secrets`): 422 with every
    error."""
    data, kind = obj.get("data") or {}, obj.get("type")
    errors: list[str] = []
    if current is not None:
        if kind != current.get("type"):
            errors.append(f'type: Invalid value: "{kind}": field is immutable')
        if current.get("immutable"):
            if not obj.get("immutable"):
                errors.append("immutable: Forbidden: field is immutable when `immutable` is set")
            if data != (current.get("data") or {}):
                errors.append("data: Forbidden: field is immutable when `immutable` is set")
    errors += [f'data[{key}]: Invalid value: "{key}": {why}' for key in data for why in _config_key_errors(key)]
    if sum(len(base64.b64decode(value)) for value in data.values()) > _SECRET_MAX_BYTES:
        errors.append(f"data: Too long: may not be more than {_SECRET_MAX_BYTES} bytes")
    required = ("username", "password") if kind == "kubernetes.io/basic-auth" and not {"username", "password"} & set(data) \
        else _SECRET_KEYS.get(str(kind), ())
    errors += [f"data[{key}]: Required value" for key in required if key not in data]
    if kind in ("kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg"):
        key = _SECRET_KEYS[kind][0]
        why = None
        try:  # (a syntax error in Python's words, not Go's)
            config = json.loads(base64.b64decode(data[key])) if key in data else None
        except ValueError as e:
            why = str(e)
        else:  # Go's json.Unmarshal into a map takes an object or null
            if config is not None and not isinstance(config, dict):
                json_type = {list: "array", str: "string", bool: "bool"}.get(type(config), "number")
                why = f"json: cannot unmarshal {json_type} into Go value of type map[string]interface {{}}"
        if why:
            errors.append(f'data[{key}]: Invalid value: "<secret contents redacted>": {why}')
    if kind == "kubernetes.io/service-account-token" and \
            not ((obj.get("metadata") or {}).get("annotations") or {}).get("kubernetes.io/service-account.name"):
        errors.append("metadata.annotations[kubernetes.io/service-account.name]: Required value")
    if errors:
        raise _invalid("Secret", obj["metadata"]["name"], errors)
