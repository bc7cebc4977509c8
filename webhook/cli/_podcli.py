"""What `initshift status` and `initshift logs` share: the connection flags, one-line
errors for the API's answers, following one pod through a watch, and colour.

The API calls themselves are in webhook/kube.py (`KubeApi`); this module only turns
them into what a person at a terminal needs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import AsyncIterator, Awaitable, Callable, TextIO

from .. import k8snames
from ..kube import KubeApi, KubeError, StreamCut
from ..settings import name_problem
from ..watcher import NotManaged, layout
from ._common import EXIT_ERROR, EXIT_OK, CliError, add_kubeconfig_args, name_arg, say_logged

# What a command does once it has a client, the namespace and the pod it was asked about.
_PodCommand = Callable[[KubeApi, str, dict, argparse.Namespace], Awaitable[None]]

_WATCH_SECONDS = 240  # one watch request; it is renewed from the last resourceVersion
RESUME_PAUSE_SECONDS = 1.0  # before a watch or a followed log that broke is opened again
TICK_SECONDS = 1.0  # a watch on a terminal redraws running durations and ages this often
CLEAR = "\x1b[H\x1b[J"  # cursor home, clear the screen below


def pod_ref(text: str) -> str:
    """POD (an argparse type): NAME, pod/NAME, job/NAME or cronjob/NAME, as kubectl writes a
    resource; another form is a usage error (exit 2), said before the kubeconfig is read."""
    kind, slash, name = text.partition("/")
    if not text:
        raise argparse.ArgumentTypeError("an empty name")
    if "/" in name:  # kubectl's rule
        raise argparse.ArgumentTypeError(f"{text}: a resource/name may not have more than one slash")
    if slash and not kind:
        raise argparse.ArgumentTypeError(f"{text}: no kind before the /")
    if slash and not name:
        raise argparse.ArgumentTypeError(f"{text}: no name after the /")
    if slash and kind.lower() not in (*_POD_TYPES, *_JOB_TYPES, *_CRONJOB_TYPES):
        raise argparse.ArgumentTypeError(f"{text}: a pod's name (or pod/NAME), job/NAME or cronjob/NAME, "
                                         f"not {kind}/")
    # The name goes into the request's path: `..` or `a?b` would ask for another object
    # (`..` read the namespace as the pod), as kubectl refuses them.
    problem = name_problem(name if slash else text, k8snames.DNS_SUBDOMAIN)
    if problem:
        raise argparse.ArgumentTypeError(f"{text}: {problem}" if slash else problem)
    return text


def add_connection_args(ap: argparse.ArgumentParser, *, optional: str = "") -> None:
    """POD and the flags that find it; `optional`: what leaving POD out does."""
    ap.add_argument("pod", metavar="POD", nargs="?" if optional else None, type=pod_ref,
                    help="the pod's name (or pod/NAME), job/NAME: the Job's newest pod, or "
                         "cronjob/NAME: that of the CronJob's newest Job" + (f"; {optional}" if optional else ""))
    # Held to the namespace rule as every -n is: `-n ..` listed the pods of every namespace.
    ap.add_argument("-n", "--namespace", type=name_arg(k8snames.DNS_LABEL),
                    help="the pod's namespace (default: the kubeconfig context's, or default)")
    add_kubeconfig_args(ap)


async def connect(args: argparse.Namespace) -> tuple[KubeApi, str]:
    """(api, namespace) from the connection flags."""
    try:
        api = await KubeApi.from_config(args.kubeconfig, args.context)
    except KubeError as e:
        raise CliError(e.message) from None
    api.user_agent = "initshift-cli"
    return api, args.namespace or api.namespace


def unreached(e: KubeError) -> CliError | None:
    """An apiserver not reached, or not taking the credentials, said the same whatever was asked."""
    if e.status == 401:
        return CliError(f"the API server did not accept your credentials ({e.message}); check the kubeconfig")
    if e.status == 0:
        return CliError(f"cannot reach the Kubernetes API: {e.message}")
    return None


def api_error(e: KubeError, namespace: str, name: str, what: str = "read pod") -> CliError:
    """The apiserver's answer as a line a person can act on; `what` ends with the kind of
    `name` ("read pod", "list the jobs of cronjob"). Only the apiserver's own 404 means the
    object is missing: another server's 404 page is said as it came (a wrong server URL)."""
    if e.not_found:
        return CliError(f"{what.rsplit(' ', 1)[-1]} {name} not found in namespace {namespace}")
    if e.status == 403:
        return CliError(f"no permission to {what} {namespace}/{name}: {e.message}")
    return unreached(e) or CliError(f"cannot {what} {namespace}/{name}: {e}")


async def get_pod(api: KubeApi, namespace: str, name: str) -> dict:
    """The pod; CliError when it is missing, forbidden, or not something initshift can show."""
    try:
        return _showable(await api.get_pod(namespace, name))
    except KubeError as e:
        raise api_error(e, namespace, name) from None


def _showable(pod: dict) -> dict:
    """The pod; CliError when initshift cannot show it."""
    try:
        layout(pod)
    except NotManaged as e:
        raise CliError(str(e)) from None
    return pod


_POD_TYPES = ("pod", "pods", "po")
_JOB_TYPES = ("job", "jobs", "job.batch", "jobs.batch")
_CRONJOB_TYPES = ("cronjob", "cronjobs", "cj", "cronjob.batch", "cronjobs.batch")


_ATTEMPT_POLL_SECONDS = 2.0  # -w/-f job/NAME: how often to look for the Job's first or next pod


def job_of(ref: str, pod: dict) -> str | None:
    """The Job whose pods `ref` names, `pod` being the one `find_pod` found: NAME of
    `job/NAME`, the Job of the CronJob's run for `cronjob/NAME`; None where it names a pod."""
    kind, _, name = ref.rpartition("/")
    if kind.lower() in _JOB_TYPES and name:
        return name
    if kind.lower() in _CRONJOB_TYPES:
        return (pod["metadata"].get("labels") or {}).get("job-name")
    return None


def _age(pod: dict) -> tuple[str, str]:
    """What orders a Job's pods and a CronJob's Jobs: creation, then name (two created in the same second)."""
    return str(pod["metadata"].get("creationTimestamp") or ""), pod["metadata"]["name"]


async def _job_pods(api: KubeApi, namespace: str, job: str) -> list[dict]:
    try:  # `job-name`: every Kubernetes version labels a Job's pods so (1.27+ also batch.kubernetes.io/job-name)
        pods, _ = await api.list_pods(namespace, label_selector=f"job-name={job}")
    except KubeError as e:
        raise api_error(e, namespace, job, "list the pods of job") from None
    return pods


async def _runs(api: KubeApi, namespace: str, cronjob: str) -> list[dict]:
    """The CronJob's Jobs (by their owner reference) that its history limits still keep."""
    try:
        jobs = await api.list_jobs(namespace)
    except KubeError as e:
        raise api_error(e, namespace, cronjob, "list the jobs of cronjob") from None
    return [job for job in jobs if any(o.get("kind") == "CronJob" and o.get("name") == cronjob
                                         for o in job["metadata"].get("ownerReferences") or [])]


async def _newest_run(api: KubeApi, namespace: str, cronjob: str, err: TextIO, wait: bool = False) -> str:
    """The name of the CronJob's newest Job (its last scheduled or manual run still kept:
    the CronJob's history limits say how many), said on `err` when it has several. `wait`
    (-f, -w): a CronJob without one is waited for until its schedule (or a manual
    `kubectl create job --from`) makes one."""
    runs, waited = await _runs(api, namespace, cronjob), False
    if not runs and wait:
        runs = await _first_run(api, namespace, cronjob, err)
        waited = bool(runs)
    if not runs:
        raise await _absent_or(api.get_cronjob, namespace, cronjob, "cronjob",
                               f"cronjob {cronjob} has no jobs in namespace {namespace}")
    newest = max(runs, key=_age)["metadata"]["name"]
    if waited:
        print(f"cronjob/{cronjob}: job/{newest}", file=err)
    elif len(runs) > 1:
        print(f"Found {len(runs)} jobs, using job/{newest} (the newest)", file=err)
    return newest


async def _first_run(api: KubeApi, namespace: str, cronjob: str, err: TextIO) -> list[dict]:
    """The runs of a CronJob that has none, once its first has come, said on `err` with its
    schedule while waited for; none where the CronJob cannot be read or is absent (find_pod
    then says why). A CronJob deleted meanwhile is a CliError."""
    try:
        obj = await api.get_cronjob(namespace, cronjob)
    except KubeError:
        return []
    if obj is None:
        return []
    spec = obj.get("spec") or {}
    print(f"cronjob/{cronjob}: {'suspended, ' if spec.get('suspend') is True else ''}no run yet; waiting for its "
          f"next (schedule {spec.get('schedule')!r})", file=err)
    while not (runs := await _runs(api, namespace, cronjob)):
        await asyncio.sleep(_ATTEMPT_POLL_SECONDS)
        try:
            if await api.get_cronjob(namespace, cronjob) is None:
                raise CliError(f"cronjob {namespace}/{cronjob} was deleted")
        except KubeError as e:
            raise api_error(e, namespace, cronjob, "read cronjob") from None
    return runs


async def _absent_or(get: Callable[[str, str], Awaitable[dict | None]], namespace: str, name: str, kind: str,
                     empty: str) -> CliError:
    """Why a Job (CronJob) shows nothing: it does not exist (a mistyped name, which kubectl
    says as `jobs.batch "NAME" not found`), else `empty`. Read only then, so `get` on it is
    not needed otherwise; without it (403) the object is taken to exist."""
    try:
        found = await get(namespace, name)
    except KubeError as e:
        if e.status != 403:
            return api_error(e, namespace, name, f"read {kind}")
        found = {}
    return CliError(empty if found is not None else f"{kind} {name} not found in namespace {namespace}")


async def find_pod(api: KubeApi, namespace: str, ref: str, err: TextIO, *, wait: bool = False) -> dict:
    """The pod `ref` names: `NAME` or `pod/NAME`; `job/NAME`, the Job's newest pod (a Job
    that retried has several; the newest is the attempt that runs or ran last), said on
    `err` when there is more than one, as `kubectl logs job/NAME` does; `cronjob/NAME`,
    that of the CronJob's newest Job. `wait` (-f, -w): a Job that has no pod yet and is not
    finished (just created, or suspended) is waited for, as `kubectl logs -f job/NAME`
    waits for a pod, and a CronJob's first run, both said so on `err`; without it, that is
    an error at once."""
    kind, _, name = ref.rpartition("/")  # a form `pod_ref` let through
    if not kind or kind.lower() in _POD_TYPES:
        return await get_pod(api, namespace, name)
    if kind.lower() in _CRONJOB_TYPES:
        name = await _newest_run(api, namespace, name, err, wait)
    pods = await _job_pods(api, namespace, name)
    if not pods and wait and (first := await _first_pod(api, namespace, name, err)) is not None:
        return first
    if not pods:
        raise await _absent_or(api.get_job, namespace, name, "job", f"job {name} has no pods in namespace {namespace}")
    newest = max(pods, key=_age)
    if len(pods) > 1:
        print(f"Found {len(pods)} pods, using pod/{newest['metadata']['name']} (the newest)", file=err)
    return await get_pod(api, namespace, newest["metadata"]["name"])


async def _first_pod(api: KubeApi, namespace: str, job: str, err: TextIO) -> dict | None:
    """The first pod of a Job that has none yet, once the Job controller has made it; None
    where the Job cannot be read, is absent or finished (find_pod then says why)."""
    try:
        obj = await api.get_job(namespace, job)
    except KubeError:
        return None
    if obj is None or _end(obj) is not None:
        return None
    suspended = (obj.get("spec") or {}).get("suspend") is True
    print(f"job/{job}: {'suspended, ' if suspended else ''}no pod yet; waiting for the Job controller to "
          f"create one", file=err)
    return await next_attempt(api, namespace, job, None, err)


class PodDeleted(CliError):
    """The pod followed was deleted."""


def _end(job: dict) -> dict | None:
    """The Job's terminal condition (Complete or Failed): it starts no more pods."""
    return next((c for c in (job.get("status") or {}).get("conditions") or []
                 if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"), None)


def _said(end: dict) -> str:
    """A Job's terminal condition in a line: `Failed (BackoffLimitExceeded: Job has reached
    the specified backoff limit)`, or its type alone."""
    why = ": ".join(filter(None, (end.get("reason"), end.get("message"))))
    return f"{end['type']} ({why})" if why else str(end["type"])


async def next_attempt(api: KubeApi, namespace: str, job: str, after: dict | None, err: TextIO) -> dict | None:
    """The Job's next pod after `after` (one that ended: a retry, or the next completion),
    or its first (`after` None), once the Job controller has made it; None once the Job is
    finished (after a pod, its end said on `err`: the pods alone do not say that the Job
    gave up, or that a pod is its last), or where it cannot be read (said on `err`: the
    pod's own view was complete).
    The controller waits between attempts (10 s, doubling), so this looks every
    _ATTEMPT_POLL_SECONDS."""
    while True:
        newer = [pod for pod in await _job_pods(api, namespace, job) if after is None or _age(pod) > _age(after)]
        if newer:
            # As listed: read again, one deleted meanwhile would end the command before
            # its deletion is seen and the Job asked what follows.
            pod = min(newer, key=_age)
            print(f"job/{job}: {'next ' if after is not None else ''}pod/{pod['metadata']['name']}", file=err)
            return _showable(pod)
        try:
            obj = await api.get_job(namespace, job)
        except KubeError as e:
            print(f"job/{job}: cannot follow its next pod: {api_error(e, namespace, job, 'read job')}", file=err)
            return None
        if obj is None:
            raise CliError(f"job {namespace}/{job} was deleted")
        if (end := _end(obj)) is not None:
            if after is not None:
                print(f"job/{job}: {_said(end)}", file=err)
            return None
        await asyncio.sleep(_ATTEMPT_POLL_SECONDS)


async def _follow_pod(api: KubeApi, namespace: str, name: str, pod: dict) -> AsyncIterator[dict]:
    """Yield each new version of the pod after `pod`, until it is deleted (CliError).

    One watch on `metadata.name`, renewed from the last resourceVersion when the server
    ends it or it breaks (a proxy's idle timeout, an apiserver restart); a 410 (history
    compacted) re-reads the pod and watches from there.
    """
    version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
    while True:
        try:
            async for kind, obj in api.watch_pods(namespace, field_selector=f"metadata.name={name}",
                                                  resource_version=version or None,
                                                  timeout_seconds=_WATCH_SECONDS):
                if kind == "BOOKMARK":
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    continue
                if kind == "DELETED":
                    raise PodDeleted(f"pod {namespace}/{name} was deleted")
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                yield obj
        except StreamCut:
            await asyncio.sleep(RESUME_PAUSE_SECONDS)
        except KubeError as e:
            if not e.gone:
                raise api_error(e, namespace, name, "watch pod") from None
            pod = await get_pod(api, namespace, name)
            version = str(pod["metadata"].get("resourceVersion") or "")
            yield pod


class PodTracker:
    """The latest version of one pod, kept current by a background watch.

    `async with PodTracker(...) as t:` then `await t.wait(predicate)` or
    `await t.changed(after)`; a deleted pod or an API error raises CliError there.
    """

    def __init__(self, api: KubeApi, namespace: str, name: str, pod: dict) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.pod = pod
        self.version = 0  # bumped on every new version of the pod
        self._error: CliError | None = None
        self._cond = asyncio.Condition()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "PodTracker":
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            async for pod in _follow_pod(self.api, self.namespace, self.name, self.pod):
                async with self._cond:
                    self.pod, self.version = pod, self.version + 1
                    self._cond.notify_all()
        except CliError as e:
            async with self._cond:
                self._error = e
                self._cond.notify_all()

    async def wait(self, predicate: Callable[[dict], bool], timeout: float | None = None) -> dict:
        """The pod once `predicate(pod)` holds; asyncio.TimeoutError after `timeout` seconds."""
        async def until() -> dict:
            async with self._cond:
                await self._cond.wait_for(lambda: self._error is not None or predicate(self.pod))
                if self._error is not None and not predicate(self.pod):
                    raise self._error
                return self.pod
        return await asyncio.wait_for(until(), timeout)

    async def changed(self, after: int, timeout: float | None = None) -> bool:
        """Wait for a version newer than `after`; False when `timeout` ran out first."""
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: self._error is not None or self.version > after),
                                       timeout)
            except asyncio.TimeoutError:
                return False
            if self._error is not None:
                raise self._error
            return True


def use_colour(stream: TextIO) -> bool:
    """ANSI colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, code: str, on: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if on and code else text


async def run_on_pod(prog: str, parser: argparse.ArgumentParser, argv: list[str], body: _PodCommand,
                     err: TextIO, following: Callable[[argparse.Namespace], bool] = lambda args: False) -> int:
    """Parse, connect, read the pod and run `body`; every CliError is one line on `err`.
    `following`: whether the arguments follow the pod (a Job's first pod is waited for)."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the usage
        return int(e.code or 0)
    try:
        api, namespace = await connect(args)
        async with api:
            pod = await find_pod(api, namespace, args.pod, err, wait=following(args))
            await body(api, namespace, pod, args)
    except CliError as e:
        print(f"{prog}: {e}", file=err)
        return e.code
    return EXIT_OK


def run_main(run: Callable[[list[str]], Awaitable[int]], argv: list[str]) -> int:
    """`run` on an event loop; Ctrl-C (130) is answered for every command in _main._guarded."""
    say_logged()
    return asyncio.run(run(argv))
