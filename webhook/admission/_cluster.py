"""Does the cluster run native sidecars? Detection for the `auto` strategy.

SidecarContainers is beta and on by default from Kubernetes 1.29 (GA in 1.33); 1.28 has
it only behind an alpha gate, which cannot be seen from outside, so 1.28 counts as
unsupported (INITSHIFT_NATIVE_SIDECARS=true overrides). Both ends must support it: the
apiserver keeps `restartPolicy` on init containers, each kubelet runs them as sidecars.
The apiserver's version comes from GET /version; the kubelets' from the nodes'
`status.nodeInfo.kubeletVersion`, and the lowest one decides (Istio's own auto mode
requires every kubelet to support it). When nodes cannot be listed (RBAC), the
apiserver alone decides. Anything unknown means None, and `auto` falls back to waiter.

`NativeSupport` holds the answer for the server: `current()` honours the setting
(`true`/`false` override detection), `run()` refreshes it periodically, and the active
strategy is logged and exposed as metrics (and in /readyz by the server).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

from prometheus_client import Gauge

from waiter import protocol as p

from .. import metrics
from ..rewrite import resolve_support as resolve
from ..errors import InitshiftError

if TYPE_CHECKING:
    from ..kube import KubeApi
    from ..settings import Settings

log = logging.getLogger("initshift.cluster")

_MIN_VERSION = (1, 29)  # SidecarContainers beta, on by default
_SETTING_AUTO = "auto"
_START_TIMEOUT_SECONDS = 5.0  # start-up detection must not hold the server back for long
_STRATEGY_DISABLED = p.MODE_DISABLED

Version = tuple[int, int]

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\D.*)?$")
_NUMBER = re.compile(r"^(\d+)\+?$")  # /version's major and minor ("29+" on some providers)

_SUPPORTED = Gauge("initshift_native_sidecars_supported",
                  "Whether the cluster runs native sidecars: 1 yes, 0 no, -1 unknown.", registry=metrics.REGISTRY)
_ACTIVE = Gauge("initshift_active_strategy", "1 for the strategy pods get by default, 0 for the others.",
               ["strategy"], registry=metrics.REGISTRY)


def parse_version(text: object) -> Version | None:
    """(major, minor) of "v1.29.3-eks-abc", "1.30", "v1.28.0+k3s1"; None if it is not one."""
    if not isinstance(text, str):
        return None
    m = _VERSION.match(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def apiserver_version(body: object) -> Version | None:
    """The apiserver's version from a GET /version body: gitVersion, else major/minor."""
    if not isinstance(body, Mapping):
        return None
    version = parse_version(body.get("gitVersion"))
    if version is not None:
        return version
    major, minor = (_NUMBER.match(str(body.get(k, "")).strip()) for k in ("major", "minor"))
    return (int(major.group(1)), int(minor.group(1))) if major and minor else None


def fmt(version: Version | None) -> str:
    return f"v{version[0]}.{version[1]}" if version else "unknown"


@dataclass(frozen=True)
class Observation:
    """What detection saw. `kubelets` is None when the nodes could not be read."""

    apiserver: Version | None
    kubelets: tuple[Version | None, ...] | None = None
    nodes_error: str | None = None  # why the nodes could not be read
    error: str | None = None  # why the apiserver version could not be read


@dataclass(frozen=True)
class _Verdict:
    supported: bool | None
    why: str


def decide(obs: Observation) -> _Verdict:
    """Native sidecars work when the apiserver and every kubelet are at least 1.29."""
    need = fmt(_MIN_VERSION)
    if obs.apiserver is None:
        return _Verdict(None, f"apiserver version unknown ({obs.error or 'not read'})")
    if obs.apiserver < _MIN_VERSION:
        return _Verdict(False, f"apiserver {fmt(obs.apiserver)} is older than {need}")
    if obs.kubelets is None:
        return _Verdict(True, f"apiserver {fmt(obs.apiserver)}; kubelet versions not read "
                              f"({obs.nodes_error or 'unknown'}), so the apiserver alone decides")
    if not obs.kubelets:
        return _Verdict(True, f"apiserver {fmt(obs.apiserver)}; no nodes yet")
    if any(v is None for v in obs.kubelets):
        return _Verdict(None, f"apiserver {fmt(obs.apiserver)}; a node reports no readable kubelet version")
    lowest = min(v for v in obs.kubelets if v is not None)
    where = f"lowest kubelet {fmt(lowest)} of {len(obs.kubelets)} node(s)"
    if lowest < _MIN_VERSION:
        return _Verdict(False, f"apiserver {fmt(obs.apiserver)}, {where} is older than {need}")
    return _Verdict(True, f"apiserver {fmt(obs.apiserver)}, {where}")


def default_strategy(settings: "Settings", supported: bool | None) -> str:
    """The strategy a build pod (run to completion) without `initshift.io/mode` gets; under
    `auto` a long-running pod gets native where a build pod gets hybrid."""
    mode = settings.rewrite.mode
    if not settings.feature_gate or mode == p.MODE_DISABLED:
        return _STRATEGY_DISABLED
    if mode == p.MODE_AUTO:
        return p.MODE_HYBRID if resolve(settings.rewrite.native_sidecars, supported) else p.MODE_WAITER
    return mode


# --- reading the cluster -------------------------------------------------------------------

class NodesForbidden(InitshiftError):
    """RBAC does not allow listing nodes."""


class _Fetcher(Protocol):
    async def version(self) -> Mapping: ...

    async def nodes(self) -> Sequence[Mapping]:
        """Every node; raises NodesForbidden on 403."""
        ...


class KubeFetcher:
    """The two reads through webhook.kube.KubeApi (auth, one error type)."""

    PAGE = 500

    def __init__(self, api: "KubeApi") -> None:
        self.api = api

    async def version(self) -> Mapping:
        return await self.api.request("GET", "/version") or {}

    async def nodes(self) -> Sequence[Mapping]:
        from ..kube import KubeError

        items: list[Mapping] = []
        token: str | None = None
        while True:
            try:
                body = await self.api.request("GET", "/api/v1/nodes", query={"limit": self.PAGE, "continue": token})
            except KubeError as e:
                if e.status == 403:
                    raise NodesForbidden(str(e)) from None
                raise
            items += (body or {}).get("items") or []
            token = ((body or {}).get("metadata") or {}).get("continue") or None
            if not token:
                return items


def kubelet_version(node: Mapping) -> Version | None:
    return parse_version(((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion"))


async def observe(fetcher: _Fetcher) -> Observation:
    """One look at the cluster; never raises."""
    try:
        apiserver = apiserver_version(await fetcher.version())
    except Exception as e:  # noqa: BLE001 - any failure means "unknown"
        return Observation(None, error=f"GET /version: {e}")
    if apiserver is None:
        return Observation(None, error="GET /version has no usable version")
    try:
        nodes = await fetcher.nodes()
    except NodesForbidden as e:
        return Observation(apiserver, None, nodes_error=f"listing nodes is forbidden: {e}")
    except Exception as e:  # noqa: BLE001
        return Observation(apiserver, None, nodes_error=f"listing nodes failed: {e}")
    return Observation(apiserver, tuple(kubelet_version(n) for n in nodes))


class NativeSupport:
    """The server's answer to "native sidecars?", kept fresh.

    With INITSHIFT_NATIVE_SIDECARS=true/false no API call is ever made. With `auto` the
    first detection runs at start-up; a failed refresh keeps the last answer (versions
    change only on upgrades), and before any answer the result is None (waiter).
    """

    def __init__(self, settings: "Settings", fetcher: _Fetcher | None = None, *,
                 unknown_why: str = "not detected yet", api: "KubeApi | None" = None) -> None:
        self.settings = settings
        self.setting = settings.rewrite.native_sidecars
        self.fetcher = fetcher
        forced = f"set to {self.setting} by {p.ENV_PREFIX}NATIVE_SIDECARS"
        self.detected = _Verdict(None, unknown_why if self._detects else forced)
        self._api = api  # closed by close(): built by start() for detection alone
        self._nodes_warned = False
        self._publish(quiet=self._detects and fetcher is not None)  # the first refresh will say it

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    @property
    def _detects(self) -> bool:
        return self.setting == _SETTING_AUTO

    def current(self) -> bool | None:
        return resolve(self.setting, self.detected.supported)

    def strategy(self) -> str:
        return default_strategy(self.settings, self.current())

    async def refresh(self) -> _Verdict:
        """Look again (auto only); returns the decision now in force."""
        if not self._detects or self.fetcher is None:
            return self.detected
        obs = await observe(self.fetcher)
        new = decide(obs)
        if obs.kubelets is None and obs.nodes_error and obs.apiserver is not None and not self._nodes_warned:
            log.warning("native sidecars: %s; deciding from the apiserver alone", obs.nodes_error)
            self._nodes_warned = True
        if new.supported is None and self.detected.supported is not None:
            log.warning("native sidecars: detection failed (%s); keeping the last answer", new.why)
            return self.detected
        if new != self.detected:
            self.detected = new
            self._publish()
        return self.detected

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every INITSHIFT_NATIVE_REFRESH_SECONDS; retry sooner while unknown."""
        if not self._detects or self.fetcher is None:
            return
        period = max(1.0, float(self.settings.rewrite.native_refresh_seconds))
        retry = 1.0
        while not stop.is_set():
            wait = period if self.detected.supported is not None else min(retry, period)
            retry = min(retry * 2, period)
            try:
                await asyncio.wait_for(stop.wait(), wait)
                return
            except asyncio.TimeoutError:
                pass
            await self.refresh()

    def _publish(self, quiet: bool = False) -> None:
        supported, strategy = self.current(), self.strategy()
        _SUPPORTED.set(-1 if supported is None else int(supported))
        for name in (p.MODE_WAITER, p.MODE_NATIVE, p.MODE_HYBRID, _STRATEGY_DISABLED):
            _ACTIVE.labels(name).set(1 if name == strategy else 0)
        if quiet:
            return
        log.info("native sidecars: %s (%s); default strategy %s",
                 {True: "supported", False: "not supported", None: "unknown"}[supported], self.detected.why,
                 strategy, extra={"native_sidecars": self.setting, "strategy": strategy})


async def detect_native_support(settings: "Settings", api: "KubeApi | None" = None) -> NativeSupport:
    """The NativeSupport `initshift serve` uses: detection at start-up when `auto`.

    `api` is reused when the server already has one; otherwise one is built from the
    in-cluster config or kubeconfig, and a failure to build it leaves support unknown.
    """
    if settings.rewrite.native_sidecars != _SETTING_AUTO:
        return NativeSupport(settings)
    owned = None
    if api is None:
        from ..kube import KubeApi, KubeError

        try:
            api = owned = await KubeApi.from_config()
        except KubeError as e:
            log.warning("native sidecars: no API access (%s); auto falls back to waiter", e)
            return NativeSupport(settings, unknown_why=f"no API access: {e}")
    support = NativeSupport(settings, KubeFetcher(api), api=owned)
    try:
        await asyncio.wait_for(support.refresh(), _START_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        log.warning("native sidecars: no answer from the apiserver within %ss; waiter until it answers",
                    _START_TIMEOUT_SECONDS)
    return support
