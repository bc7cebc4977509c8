"""Does the cluster run native sidecars? Detection for the `auto` strategy.

SidecarContainers is beta and on by default from Kubernetes 1.29 (GA in 1.33); 1.28 has
it only behind an alpha gate, which cannot be seen from outside, so 1.28 counts as
unsupported (INITSHIFT_NATIVE_SIDECARS=true overrides). Both ends must support it: the
apiserver keeps `restartPolicy` on init containers, each kubelet runs them as sidecars.
The lowest kubelet decides (Istio's own auto mode requires every kubelet to support it);
when nodes cannot be listed (RBAC), the apiserver alone decides. Anything unknown means
None, and `auto` falls back to waiter. webhook.kube.read_versions reads the versions.

`NativeSupport` holds the answer for the server: `current()` honours the setting
(`true`/`false` override detection), `run()` refreshes it periodically, and the strategy
in force is logged and exposed as metrics (and in /readyz by the server).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from prometheus_client import Gauge

from waiter import protocol as p

from .. import metrics
from ..kube import ClusterVersions, KubeApi, KubeError, read_versions
from ..rewrite import resolve_support
from ..settings import Settings

log = logging.getLogger("initshift.cluster")

_MIN_VERSION = (1, 29)  # SidecarContainers beta, on by default
_START_TIMEOUT_SECONDS = 5.0  # start-up detection must not hold the server back for long

_SUPPORTED = Gauge("initshift_native_sidecars_supported",
                   "Whether the cluster runs native sidecars: 1 yes, 0 no, -1 unknown.", registry=metrics.REGISTRY)
_ACTIVE = Gauge("initshift_active_strategy", "1 for the strategy pods get by default, 0 for the others.",
                ["strategy"], registry=metrics.REGISTRY)


@dataclass(frozen=True)
class Verdict:
    supported: bool | None
    why: str


def _v(version: tuple[int, int]) -> str:
    return f"v{version[0]}.{version[1]}"


def decide(seen: ClusterVersions) -> Verdict:
    """Native sidecars work when the apiserver and every kubelet are at least 1.29."""
    if seen.apiserver is None:
        return Verdict(None, f"apiserver version unknown ({seen.error or 'not read'})")
    api, need = f"apiserver {_v(seen.apiserver)}", _v(_MIN_VERSION)
    if seen.apiserver < _MIN_VERSION:
        return Verdict(False, f"{api} is older than {need}")
    if seen.kubelets is None:
        return Verdict(True, f"{api}; kubelet versions not read ({seen.nodes_error or 'unknown'}), "
                             f"so the apiserver alone decides")
    if not seen.kubelets:
        return Verdict(True, f"{api}; no nodes yet")
    if None in seen.kubelets:
        return Verdict(None, f"{api}; a node reports no readable kubelet version")
    lowest = min(v for v in seen.kubelets if v is not None)
    where = f"lowest kubelet {_v(lowest)} of {len(seen.kubelets)} node(s)"
    return Verdict(False, f"{api}, {where} is older than {need}") if lowest < _MIN_VERSION \
        else Verdict(True, f"{api}, {where}")


def default_strategy(settings: Settings, supported: bool | None) -> str:
    """The strategy a build pod (run to completion) without `initshift.io/mode` gets; under
    `auto` a long-running pod gets native where a build pod gets hybrid."""
    mode = settings.rewrite.mode
    if _disabled_why(settings):
        return p.MODE_DISABLED
    if mode == p.MODE_AUTO:
        return p.MODE_HYBRID if resolve_support(settings.rewrite.native_sidecars, supported) else p.MODE_WAITER
    return mode


def _disabled_why(settings: Settings) -> str:
    """Why no pod is rewritten by default, for the start-up line (a server started by hand
    without the gate said only "disabled"); empty when pods are."""
    if not settings.feature_gate:
        return f" ({p.FEATURE_GATE_ENV} is not true: every pod is admitted unchanged)"
    if settings.rewrite.mode == p.MODE_DISABLED:
        return f" ({p.ENV_PREFIX}MODE=disabled: only a pod's own {p.ANNOTATION_MODE} has it rewritten)"
    return ""


class NativeSupport:
    """The server's answer to "native sidecars?", kept fresh.

    With INITSHIFT_NATIVE_SIDECARS=true/false no API call is ever made. With `auto` the
    first detection runs at start-up; a failed refresh keeps the last answer (versions
    change only on upgrades), and before any answer the result is None (waiter).
    `owned`: the API client was made for detection alone, and close() closes it.
    """

    def __init__(self, settings: Settings, api: KubeApi | None = None, *, unknown_why: str = "not detected yet",
                 owned: bool = False) -> None:
        self.settings, self.setting = settings, settings.rewrite.native_sidecars
        auto = self.setting == "auto"
        self.detected = Verdict(None, unknown_why if auto else f"set to {self.setting} by {p.ENV_PREFIX}NATIVE_SIDECARS")
        self.api = api if auto else None
        self._owned, self._nodes_warned = owned, False
        self._publish(quiet=self.api is not None)  # the first refresh will say it

    async def close(self) -> None:
        if self._owned and self.api is not None:
            await self.api.close()
            self.api = None

    def current(self) -> bool | None:
        return resolve_support(self.setting, self.detected.supported)

    def strategy(self) -> str:
        return default_strategy(self.settings, self.current())

    async def refresh(self) -> Verdict:
        """Look again (auto only); returns the decision now in force."""
        if self.api is None:
            return self.detected
        seen = await read_versions(self.api)
        new = decide(seen)
        if seen.nodes_error and seen.apiserver is not None and not self._nodes_warned:
            log.warning("native sidecars: %s; deciding from the apiserver alone", seen.nodes_error)
            self._nodes_warned = True
        if new.supported is None and self.detected.supported is not None:
            log.warning("native sidecars: detection failed (%s); keeping the last answer", new.why)
        elif new != self.detected:
            self.detected = new
            self._publish()
        return self.detected

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every INITSHIFT_NATIVE_REFRESH_SECONDS; retry sooner while unknown."""
        period = max(1.0, float(self.settings.rewrite.native_refresh_seconds))
        retry = 1.0
        while self.api is not None and not stop.is_set():
            wait = period if self.detected.supported is not None else min(retry, period)
            retry = min(retry * 2, period)
            try:
                await asyncio.wait_for(stop.wait(), wait)
                return
            except asyncio.TimeoutError:
                await self.refresh()

    def _publish(self, quiet: bool = False) -> None:
        supported, strategy = self.current(), self.strategy()
        _SUPPORTED.set(-1 if supported is None else int(supported))
        for name in (p.MODE_WAITER, p.MODE_NATIVE, p.MODE_HYBRID, p.MODE_DISABLED):
            _ACTIVE.labels(name).set(1 if name == strategy else 0)
        if not quiet:
            log.info("native sidecars: %s (%s); default strategy %s%s",
                     {True: "supported", False: "not supported", None: "unknown"}[supported], self.detected.why,
                     strategy, _disabled_why(self.settings), extra={"native_sidecars": self.setting, "strategy": strategy})


async def detect_native_support(settings: Settings, api: KubeApi | None = None, *,
                                no_api: str | None = None) -> NativeSupport:
    """The NativeSupport `initshift serve` uses: detection at start-up when `auto`.

    `api` is reused when the server already has one; otherwise one is built from the
    in-cluster config or kubeconfig, and a failure to build it leaves support unknown.
    `no_api`: why the caller could not build one, and has said so: no second attempt, no
    second line.
    """
    if settings.rewrite.native_sidecars != "auto":
        return NativeSupport(settings)
    owned = api is None
    if api is None and no_api is not None:
        return NativeSupport(settings, unknown_why=f"no API access: {no_api}")
    if api is None:
        try:
            api = await KubeApi.from_config()
        except KubeError as e:
            log.warning("native sidecars: no API access (%s); auto falls back to waiter", e)
            return NativeSupport(settings, unknown_why=f"no API access: {e}")
    support = NativeSupport(settings, api, owned=owned)
    try:
        await asyncio.wait_for(support.refresh(), _START_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        log.warning("native sidecars: no answer from the apiserver within %ss; waiter until it answers",
                    _START_TIMEOUT_SECONDS)
    return support
