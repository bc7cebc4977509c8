"""The one narrow module through which initshift talks to the Kubernetes API.

Everything goes through `KubeApi`, a small async class on kubernetes-asyncio's
`ApiClient` that speaks plain dicts (the JSON the apiserver sends, camelCase keys) so the
logic above it stays plain functions over pod dicts. Requests use `call_api` with
`_preload_content=False`: auth (tokens, exec plugins, client certificates) is still
applied by the client, but no model classes are built and every error becomes one
`KubeError` with the apiserver's own message.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any, AsyncIterator
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from ..errors import InitshiftError, connect_reason

_MERGE_PATCH = "application/merge-patch+json"
JSON = "application/json"
_AUTH = ["BearerToken"]
# A watch ends on the server after this many seconds at most, so a silently dead
# connection is noticed; the client gives it this much extra before giving up.
_WATCH_SLACK_SECONDS = 30.0
_REQUEST_TIMEOUT_SECONDS = 30.0
ADMISSION = "apis/admissionregistration.k8s.io/v1"
VAP_PATH = f"/{ADMISSION}/validatingadmissionpolicies"
VAPB_PATH = f"/{ADMISSION}/validatingadmissionpolicybindings"
_LEASES = "apis/coordination.k8s.io/v1"


async def _lines(resp: aiohttp.ClientResponse, what: str) -> AsyncIterator[bytes]:
    """A streamed response line by line; a broken stream becomes a KubeError."""
    while True:
        try:
            line = await resp.content.readline()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise StreamCut(0, f"{what} interrupted: {_transport_error(e)}") from None
        if not line:
            return
        yield line


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "unknown status"


def _transport_error(e: BaseException) -> str:
    """Why a request got no answer, in words: aiohttp's own text repeats the address three
    times and names its exception class."""
    if isinstance(e, aiohttp.ClientConnectorCertificateError):
        cert = e.certificate_error
        why = getattr(cert, "verify_message", None) or getattr(cert, "reason", None) or str(cert)
        return f"the certificate of {e.host}:{e.port} is not trusted ({why}): check the kubeconfig's cluster CA"
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"cannot connect to {e.host}:{e.port}: {connect_reason(e.os_error)}"
    if isinstance(e, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return "timed out waiting for an answer"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _seg(name: str) -> str:
    """A name or namespace as one segment of a request path. As client-go's
    (IsValidPathSegmentName), one that would name another path is refused before any request
    (empty, `.`, `..`, holding `/` or `%`: the apiserver routes on the decoded path); the rest
    is percent-encoded, so a `?` or `#` stays part of the name."""
    if name in ("", ".", "..") or "/" in name or "%" in name:
        raise KubeError(400, f"{name!r} is not a name the API takes in a request path", "Invalid")
    return quote(name, safe="")


def object_path(plural: str, namespace: str | None, name: str | None = None, api: str = "api/v1") -> str:
    """The path of a collection (`name` None) or of one object. `namespace` None: a
    cluster-scoped kind, or every namespace's collection ("" too, as client-go's NamespaceAll);
    an object of a namespaced kind needs its namespace."""
    every = namespace is None or (namespace == "" and name is None)
    base = f"/{api}/{plural}" if every else f"/{api}/namespaces/{_seg(namespace)}/{plural}"  # type: ignore[arg-type]
    return f"{base}/{_seg(name)}" if name is not None else base


class KubeError(InitshiftError):
    """An API call failed. `status` is the HTTP status, 0 when the server was unreachable
    (400 also for a name refused before sending, as the apiserver would refuse it)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        # "404 NotFound: pods \"x\" not found"; "404: ..." from a server that sent no Status
        super().__init__(f"{' '.join(filter(None, (str(status), reason)))}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def not_found(self) -> bool:
        """The apiserver's own 404 (a Status, reason NotFound): the object does not exist. A 404
        page from something else (a server URL missing a proxy's path) is an error, not this."""
        return self.status == 404 and self.reason == "NotFound"


class StreamCut(KubeError):
    """A streamed answer (a watch, a followed log) broke after it started."""


def _status_error(status: int, text: str) -> KubeError:
    """A KubeError from a response body, a `Status` object when the apiserver sent one."""
    try:
        body = json.loads(text)
    except ValueError:
        # Not the apiserver's Status (a proxy's or load balancer's page): its text, on one line.
        line = " ".join(text.split())
        return KubeError(status, (line[:300] + "..." if len(line) > 300 else line)
                         or f"{_phrase(status)} (an empty body)")
    if isinstance(body, dict):  # a reason only from a Status: `not_found` goes by it
        reason = str(body.get("reason") or "") if body.get("kind") == "Status" else ""
        return KubeError(status, str(body.get("message") or text[:500]), reason)
    return KubeError(status, text[:500])


class KubeApi:
    """Async, dict-based access to the few API calls initshift makes.

    Build one with `from_config()` (in-cluster or kubeconfig), `for_host()` (an explicit
    URL, e.g. a test double) or from an existing `ApiClient`. Close it with `close()`
    or use it as an async context manager.
    """

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self.client = api_client
        self.namespace = "default"  # the configuration's namespace (from_config sets it)
        # Each call (not a watch or a follow) gives up after this many seconds: a caller that
        # must keep a deadline (a Lease holder, the watcher's workers) lowers it.
        self.request_timeout = _REQUEST_TIMEOUT_SECONDS

    # --- construction ---------------------------------------------------------------
    @classmethod
    async def from_config(cls, kubeconfig: str | None = None, context: str | None = None) -> "KubeApi":
        """kubectl's choice of configuration (`_config.resolve`): `--kubeconfig`, `$KUBECONFIG`,
        `~/.kube/config`, else the pod's service account (the process's `use_config` choice
        when no argument is given). `namespace` is the one it implies."""
        from ._config import KubeConfigError, chosen, client_configuration, resolve

        try:
            source = resolve(*chosen(kubeconfig, context))
            cfg = await client_configuration(source)
        except KubeConfigError as e:
            raise KubeError(0, str(e)) from None
        api = cls(k8s.ApiClient(cfg))
        api.namespace = source.namespace
        return api

    @classmethod
    def for_host(cls, url: str, *, token: str | None = None, verify: bool | str = True) -> "KubeApi":
        """An explicit API URL; `verify` is True, False or a CA bundle path."""
        cfg = k8s.Configuration(host=url.rstrip("/"))
        if token:
            cfg.api_key = {"BearerToken": token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        if isinstance(verify, str):
            cfg.ssl_ca_cert = verify
        else:
            cfg.verify_ssl = verify
        return cls(k8s.ApiClient(cfg))

    async def close(self) -> None:
        await self.client.close()

    async def __aenter__(self) -> "KubeApi":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def user_agent(self) -> str:
        return self.client.user_agent

    @user_agent.setter
    def user_agent(self, value: str) -> None:
        self.client.user_agent = value

    # --- raw request ------------------------------------------------------------------
    async def _open(self, method: str, path: str, *, query: dict[str, Any] | None = None,
                    body: Any = None, content_type: str = JSON,
                    timeout: float | aiohttp.ClientTimeout | None = None,
                    accept: str = JSON) -> aiohttp.ClientResponse:
        timeout = self.request_timeout if timeout is None else timeout
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        try:
            resp = await self.client.call_api(
                path, method, query_params=params,
                header_params={"Accept": accept, "Content-Type": content_type},
                body=body, auth_settings=_AUTH, _preload_content=False, _request_timeout=timeout)
        except ApiException as e:  # raised before sending (bad parameters)
            raise KubeError(e.status or 0, str(e.reason)) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise KubeError(0, f"{method} {path}: {_transport_error(e)}") from None
        if not 200 <= resp.status <= 299:
            try:
                text = await resp.text()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                text = ""
            finally:
                resp.release()
            raise _status_error(resp.status, text)
        return resp

    async def request(self, method: str, path: str, *, query: dict[str, Any] | None = None,
                      body: Any = None, content_type: str = JSON, accept: str = JSON) -> Any:
        """One call; returns the decoded JSON body. Other modules may use it for calls
        not wrapped below, but prefer adding a small method here."""
        resp = await self._open(method, path, query=query, body=body, content_type=content_type, accept=accept)
        try:
            data = await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise KubeError(0, f"{method} {path}: {_transport_error(e)}") from None
        finally:
            resp.release()
        try:
            return json.loads(data) if data else None
        except ValueError:
            raise KubeError(resp.status, f"{method} {path}: response is not JSON") from None

    async def _get_or_none(self, path: str) -> dict | None:
        """GET; None when the object does not exist."""
        try:
            return await self.request("GET", path)
        except KubeError as e:
            if e.not_found:
                return None
            raise

    # --- pods ---------------------------------------------------------------------------
    async def list_pages(self, plural: str, namespace: str | None = None, *, label_selector: str | None = None,
                         field_selector: str | None = None,
                         limit: int = 500) -> AsyncIterator[tuple[list[dict], str]]:
        """A core/v1 collection (`pods`, `events`) page by page (`limit`/`continue`), so a
        caller can keep what it needs of each page before the next arrives. Yields (items,
        resourceVersion of the list); a continue token that expired is a 410 KubeError."""
        token: str | None = None
        while True:
            body = await self.request("GET", object_path(plural, namespace), query={
                "labelSelector": label_selector, "fieldSelector": field_selector,
                "limit": str(limit) if limit else None, "continue": token})
            meta = body.get("metadata") or {}
            yield list(body.get("items") or []), str(meta.get("resourceVersion", ""))
            token = meta.get("continue") or None
            if not token:
                return

    async def list_pods(self, namespace: str | None = None, *,
                        label_selector: str | None = None) -> tuple[list[dict], str]:
        """(pods, list resourceVersion). `namespace=None` lists every namespace."""
        body = await self.request("GET", object_path("pods", namespace), query={"labelSelector": label_selector})
        return list(body.get("items") or []), str(body.get("metadata", {}).get("resourceVersion", ""))

    async def watch_pods(self, namespace: str | None = None, *, label_selector: str | None = None,
                         resource_version: str | None = None, timeout_seconds: int = 300,
                         field_selector: str | None = None) -> AsyncIterator[tuple[str, dict]]:
        """Yield (type, object) for ADDED/MODIFIED/DELETED/BOOKMARK events until the server
        ends the stream. An ERROR event raises KubeError (410 Gone: re-list).
        `field_selector="metadata.name=NAME"` watches one pod."""
        async for item in self.watch("pods", namespace, label_selector=label_selector,
                                     resource_version=resource_version, timeout_seconds=timeout_seconds,
                                     field_selector=field_selector):
            yield item

    async def watch(self, plural: str, namespace: str | None = None, *, label_selector: str | None = None,
                    resource_version: str | None = None, timeout_seconds: int = 300,
                    field_selector: str | None = None) -> AsyncIterator[tuple[str, dict]]:
        """Watch a core/v1 collection (`pods`, `events`) with bookmarks; see `watch_pods`."""
        query = {"watch": "true", "labelSelector": label_selector, "resourceVersion": resource_version,
                 "fieldSelector": field_selector,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(int(timeout_seconds))}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=_REQUEST_TIMEOUT_SECONDS,
                                        sock_read=timeout_seconds + _WATCH_SLACK_SECONDS)
        resp = await self._open("GET", object_path(plural, namespace), query=query, timeout=timeout)
        try:
            async for line in _lines(resp, "watch"):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                except (ValueError, KeyError, TypeError):
                    raise KubeError(0, f"malformed watch event: {line[:200]!r}") from None
                if kind == "ERROR":
                    raise KubeError(int(obj.get("code") or 0), str(obj.get("message") or obj),
                                    str(obj.get("reason") or ""))
                yield kind, obj
        finally:
            resp.close()

    async def get_pod(self, namespace: str, name: str) -> dict:
        return await self.request("GET", object_path("pods", namespace, name))

    async def pod_log(self, namespace: str, name: str, container: str, *, follow: bool = False,
                      tail_lines: int | None = None, timestamps: bool = False,
                      since_time: str | None = None, since_seconds: int | None = None,
                      previous: bool = False) -> AsyncIterator[str]:
        """Yield one container's log line by line (newline kept; a last partial line as is).
        `follow`: until the container stops; a stream that breaks before is a StreamCut.
        `timestamps`: each line starts with the kubelet's RFC 3339 time of it and a space;
        `since_time` (RFC 3339, whole seconds) or `since_seconds` (by the kubelet's clock; the
        apiserver takes one of them, not both): the lines from then on. `previous`: the run
        before the current one, which the kubelet keeps for one it ran again. A container that
        has not started yet is a 400 KubeError from the apiserver ("... is waiting to start"),
        and so is `previous` for one without an earlier run ("previous terminated container ...
        not found")."""
        query = {"container": container, "follow": "true" if follow else None,
                 "tailLines": str(tail_lines) if tail_lines is not None else None,
                 "timestamps": "true" if timestamps else None, "sinceTime": since_time,
                 "sinceSeconds": str(since_seconds) if since_seconds is not None else None,
                 "previous": "true" if previous else None}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=_REQUEST_TIMEOUT_SECONDS,
                                        sock_read=None if follow else _REQUEST_TIMEOUT_SECONDS)
        resp = await self._open("GET", object_path("pods", namespace, name) + "/log", query=query,
                                timeout=timeout, accept="*/*")
        try:
            async for line in _lines(resp, "log stream"):
                yield line.decode("utf-8", errors="replace")
        finally:
            resp.close()

    async def patch_pod(self, namespace: str, name: str, patch: dict) -> dict:
        """JSON merge patch (RFC 7386). A `metadata.resourceVersion` in the patch makes it
        conditional: the apiserver answers 409 when the pod changed since."""
        return await self.request("PATCH", object_path("pods", namespace, name),
                                  body=patch, content_type=_MERGE_PATCH)

    # --- events -------------------------------------------------------------------------
    async def create_event(self, namespace: str, event: dict) -> dict:
        """A core/v1 Event (what `kubectl describe` shows). An Event with a fixed
        `metadata.name` that exists already is a 409 (AlreadyExists) KubeError."""
        return await self.request("POST", object_path("events", namespace), body=event)

    # --- leases -------------------------------------------------------------------------
    async def get_lease(self, namespace: str, name: str) -> dict | None:
        """The Lease, or None when it does not exist."""
        return await self._get_or_none(object_path("leases", namespace, name, api=_LEASES))

    async def create_lease(self, namespace: str, lease: dict) -> dict:
        return await self.request("POST", object_path("leases", namespace, api=_LEASES), body=lease)

    async def replace_lease(self, namespace: str, name: str, lease: dict) -> dict:
        """PUT; the lease's metadata.resourceVersion makes it fail with 409 when stale."""
        return await self.request("PUT", object_path("leases", namespace, name, api=_LEASES), body=lease)

    # --- what `initshift check` reads and creates (the user's credentials, never the server's) ---
    async def get_version(self) -> dict:
        """The apiserver's `GET /version` (gitVersion, major, minor...)."""
        return await self.request("GET", "/version")

    async def create_pod(self, namespace: str, pod: dict) -> dict:
        return await self.request("POST", object_path("pods", namespace), body=pod)

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete the pod; one that is already gone is not an error."""
        try:
            await self.request("DELETE", object_path("pods", namespace, name))
        except KubeError as e:
            if not e.not_found:
                raise

    async def get_webhook_config(self, name: str) -> dict | None:
        """A MutatingWebhookConfiguration, or None when it does not exist."""
        return await self._get_or_none(object_path("mutatingwebhookconfigurations", None, name, api=ADMISSION))

    async def list_webhook_configs(self) -> list[dict]:
        """Every MutatingWebhookConfiguration (the mesh injectors are among them)."""
        return list((await self.request("GET", object_path("mutatingwebhookconfigurations", None, api=ADMISSION)))
                    .get("items") or [])

    async def list_admission_policies(self) -> tuple[list[dict], list[dict]] | None:
        """Every ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding; None where the
        apiserver does not serve admissionregistration.k8s.io/v1's (before Kubernetes 1.30)."""
        try:
            policies = await self.request("GET", VAP_PATH)
            bindings = await self.request("GET", VAPB_PATH)
        except KubeError as e:
            if e.not_found:
                return None
            raise
        return list((policies or {}).get("items") or []), list((bindings or {}).get("items") or [])

    async def get_namespace(self, name: str) -> dict | None:
        return await self._get_or_none(object_path("namespaces", None, name))

    async def list_namespaces(self) -> list[dict]:
        return list((await self.request("GET", "/api/v1/namespaces")).get("items") or [])

    async def get_service(self, namespace: str, name: str) -> dict | None:
        return await self._get_or_none(object_path("services", namespace, name))

    async def get_deployment(self, namespace: str, name: str) -> dict | None:
        return await self._get_or_none(object_path("deployments", namespace, name, api="apis/apps/v1"))

    async def get_job(self, namespace: str, name: str) -> dict | None:
        return await self._get_or_none(object_path("jobs", namespace, name, api="apis/batch/v1"))

    async def get_cronjob(self, namespace: str, name: str) -> dict | None:
        return await self._get_or_none(object_path("cronjobs", namespace, name, api="apis/batch/v1"))

    async def list_jobs(self, namespace: str) -> list[dict]:
        body = await self.request("GET", object_path("jobs", namespace, api="apis/batch/v1"))
        return list((body or {}).get("items") or [])

    async def list_pod_disruption_budgets(self, namespace: str) -> list[dict]:
        body = await self.request("GET", object_path("poddisruptionbudgets", namespace, api="apis/policy/v1"))
        return list((body or {}).get("items") or [])

    async def get_configmap(self, namespace: str, name: str) -> dict | None:
        return await self._get_or_none(object_path("configmaps", namespace, name))

    async def list_services(self, namespace: str) -> list[dict]:
        body = await self.request("GET", object_path("services", namespace))
        return list((body or {}).get("items") or [])

    async def get_secret(self, namespace: str, name: str) -> dict | None:
        return await self._get_or_none(object_path("secrets", namespace, name))

    async def get_service_account(self, namespace: str, name: str) -> dict | None:
        return await self._get_or_none(object_path("serviceaccounts", namespace, name))

    async def review_access(self, user: str, groups: list[str], attributes: dict) -> tuple[bool, str]:
        """(allowed, the authorizer's reason) for `user` doing what `attributes` (a
        SubjectAccessReview's resourceAttributes) describe."""
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}}
        status = (await self.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                     body=body)).get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or status.get("evaluationError") or "")
