"""Every name shared by the webhook, the waiter and the watcher.

This module is the one home of these strings: the webhook imports it to emit pods,
the waiter reads the flags it defines, the watcher reads the annotations. Standard
library only (it is frozen into the waiter), and no logic beyond path helpers.
"""

from __future__ import annotations

# --- API group, labels and annotations -------------------------------------------------
GROUP = "initshift.io"

LABEL_NAMESPACE_ENABLED = f"{GROUP}/enabled"  # namespace opt-in, "true"
LABEL_MANAGED = f"{GROUP}/managed"  # written: the strategy applied

ANNOTATION_MODE = f"{GROUP}/mode"
ANNOTATION_KEEP_INIT = f"{GROUP}/keep-init"
ANNOTATION_SIDECARS = f"{GROUP}/sidecars"
ANNOTATION_STEPS = f"{GROUP}/steps"  # written: JSON list of step names, in order
ANNOTATION_MAINS = f"{GROUP}/mains"  # written: JSON list of the original regular containers
ANNOTATION_READY = f"{GROUP}/ready"  # written by the watcher: "true"
ANNOTATION_OUTCOME = f"{GROUP}/outcome"  # written by the watcher: JSON
ANNOTATION_START_ORDER = f"{GROUP}/start-order"
ANNOTATION_READY_PREFIX = f"{GROUP}/ready-"  # + container name: per-container ready (start-order)
# written: why a pod with init containers was left as it is (the reason slug of the warning)
ANNOTATION_NOT_REWRITTEN = f"{GROUP}/not-rewritten"
# written (hybrid): JSON {container: startupProbe}: the startupProbes initshift removed from
# native sidecars whose readiness step 0 waits for itself, as they were, to put back if that
# stops holding on re-invocation
ANNOTATION_STARTUP_PROBES_REMOVED = f"{GROUP}/startup-probes-removed"
# written (waiter, hybrid): JSON {container: postStart}: the same for a mesh proxy's postStart hook
# that only waits for its readiness (Linkerd's linkerd-await, Istio's `pilot-agent wait`)
ANNOTATION_POST_START_REMOVED = f"{GROUP}/post-start-removed"
# written (waiter, hybrid; native where it asks the mesh for a native proxy): JSON {resource:
# quantity}: the effective request of the pod as admitted; a re-invoked review weighs the
# sidecars injected since against it
ANNOTATION_BUDGET = f"{GROUP}/budget"

MODE_DISABLED = "disabled"
MODE_WAITER = "waiter"
MODE_NATIVE = "native"
MODE_HYBRID = "hybrid"  # native sidecars + waiter-run steps
MODE_AUTO = "auto"
MODES = (MODE_DISABLED, MODE_WAITER, MODE_NATIVE, MODE_HYBRID, MODE_AUTO)
MANAGED_START_ORDER = "start-order"  # LABEL_MANAGED value of pods given a start order

READY_TRUE = "true"

# --- Environment ------------------------------------------------------------------------
FEATURE_GATE_ENV = "SUPPORT_INJECTED_SIDECARS"
ENV_PREFIX = "INITSHIFT_"

# A static pod's mirror (the kubelet runs the pod from its manifest; this object only shows it).
MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"
# The container kubectl's `logs`, `exec`, `attach` and `cp` take without `-c` (else the
# first of `containers`; KEP-2227).
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"

# --- Mesh markers -----------------------------------------------------------------------
ISTIO_STATUS_ANNOTATION = "sidecar.istio.io/status"
ISTIO_INJECT_ANNOTATION = "sidecar.istio.io/inject"
ISTIO_INJECT_LABEL = "sidecar.istio.io/inject"
ISTIO_NATIVE_ANNOTATION = "sidecar.istio.io/nativeSidecar"
# The pod's port of pilot-agent's status server, which serves /quitquitquit ("0": none).
ISTIO_STATUS_PORT_ANNOTATION = "status.sidecar.istio.io/port"
# The pod's own ProxyConfig (YAML), over the mesh's; its `statusPort` moves that server too.
ISTIO_PROXY_CONFIG_ANNOTATION = "proxy.istio.io/config"
ISTIO_PROXY_CONFIG_ENV = "PROXY_CONFIG"  # the proxy's ProxyConfig (JSON) as Istio's injector merged it
LINKERD_INJECT_ANNOTATION = "linkerd.io/inject"
# Linkerd's native-sidecar switch under each name its releases read: config.linkerd.io from
# 2.20 (native is then the default), config.beta from 2.19, config.alpha from 2.15 (deprecated
# in 2.19, still read there).
LINKERD_NATIVE_ANNOTATIONS = ("config.linkerd.io/proxy-enable-native-sidecar",
                              "config.beta.linkerd.io/proxy-enable-native-sidecar",
                              "config.alpha.linkerd.io/proxy-enable-native-sidecar")
LINKERD_STATUS_ANNOTATION = "linkerd.io/proxy-version"
# Linkerd's proxy serves its /shutdown only where this is "true" (its injector writes "false"
# unless the workload's annotation says "enabled": the default since Linkerd 2.16).
LINKERD_SHUTDOWN_ENV = "LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED"
LINKERD_SHUTDOWN_ANNOTATION = "config.linkerd.io/proxy-admin-shutdown"
# Where Linkerd's proxy serves its admin server (`/ready`, `/shutdown`), as its injector
# writes it ("0.0.0.0:4191"; `config.linkerd.io/admin-port` moves it).
LINKERD_ADMIN_ADDR_ENV = "LINKERD2_PROXY_ADMIN_LISTEN_ADDR"
# On a namespace: Istio injects every pod where it is labelled so (unless the pod says
# `sidecar.istio.io/inject: "false"`), Linkerd where it is annotated `linkerd.io/inject`.
ISTIO_NAMESPACE_LABEL = "istio-injection"
ISTIO_REVISION_LABEL = "istio.io/rev"
# What a namespace says about injection: the only labels and annotations read of it.
NAMESPACE_MESH_LABELS = (ISTIO_NAMESPACE_LABEL, ISTIO_REVISION_LABEL)
NAMESPACE_MESH_ANNOTATIONS = (LINKERD_INJECT_ANNOTATION,)

ISTIO_PROXY = "istio-proxy"
LINKERD_PROXY = "linkerd-proxy"
DEFAULT_SIDECAR_NAMES = (ISTIO_PROXY, LINKERD_PROXY)
DEFAULT_MESH_INIT_NAMES = ("istio-init", "istio-validation", "linkerd-init", "linkerd-network-validator")
DEFAULT_QUIT_ENDPOINTS = {
    ISTIO_PROXY: "http://127.0.0.1:15020/quitquitquit",
    LINKERD_PROXY: "http://127.0.0.1:4191/shutdown",
}

# --- Pod layout written by the rewrite ------------------------------------------------------
INIT_CONTAINER_NAME = "initshift-init"

IMAGE_WAITER_DIR = "/opt/initshift/waiter"  # the frozen bundle inside the initshift image
WAITER_DIR_NAME = "waiter"  # the bundle's folder name (dist/waiter, DEST/waiter)
WAITER_EXE_NAME = "waiter"  # the executable inside the bundle
# The frozen bundle holds two copies of the executable: WAITER_EXE_NAME, whose ELF interpreter
# is the bundled loader at its pod path (WAITER_PATH's folder), and WAITER_INIT_EXE_NAME, whose
# interpreter is the bundled loader at IMAGE_WAITER_DIR, for `init` inside the initshift image.
WAITER_INIT_EXE_NAME = "waiter-init"
WAITER_LOADER_NAME = "ld.so"  # the bundled glibc loader, under one name on every architecture
IMAGE_UID = 65532  # the non-root UID of the initshift image

BIN_VOLUME = "initshift-bin"
BIN_MOUNT = "/initshift/bin"
WAITER_PATH = f"{BIN_MOUNT}/{WAITER_DIR_NAME}/{WAITER_EXE_NAME}"
# What the injected init container runs (in the initshift image) to copy the bundle.
INIT_COMMAND = (f"{IMAGE_WAITER_DIR}/{WAITER_INIT_EXE_NAME}", "init", BIN_MOUNT)
# Hybrid copies the bundle in the postStart hook of a first regular container instead: the
# kubelet starts the next container only once that hook has returned, and the proxy stays
# the last init container (one fewer ~1 s pod-cache relist before the steps start). The
# container's own process copies too, then waits for the hook to end and exits 0 (`waiter
# hold`, waiter/hold.py: a kubelet restarted during the container's start runs no hook).
COPY_CONTAINER_NAME = "initshift-copy"
COPY_HOOK_FLAG = "--hook"  # `waiter init --hook DEST`: copy, then record the hook (COPY_DONE_FILE)
COPY_DONE_FILE = ".initshift-copied"  # in BIN_MOUNT: "PID STARTTIME" of the hook that copied
COPY_HOOK_COMMAND = (f"{IMAGE_WAITER_DIR}/{WAITER_INIT_EXE_NAME}", "init", COPY_HOOK_FLAG, BIN_MOUNT)
COPY_HOLD_COMMAND = (f"{IMAGE_WAITER_DIR}/{WAITER_INIT_EXE_NAME}", "hold", BIN_MOUNT)

RUN_VOLUME_PREFIX = "initshift-run-"  # + index in execution order
RUN_MOUNT_ROOT = "/initshift/run"  # + "/" + index

# The mains' shared directory: each main, once finished, writes its record there under its
# own container name; the one that then finds every main's record quits the sidecars.
MAINS_VOLUME = "initshift-mains"
MAINS_MOUNT = "/initshift/mains"

READY_VOLUME = "initshift-ready"
READY_MOUNT = "/initshift/ready"
READY_FILE_NAME = "ready"
READY_FILE = f"{READY_MOUNT}/{READY_FILE_NAME}"

MARKER_VOLUME = "initshift-markers"  # start-order: startup markers shared by all containers
MARKER_MOUNT = "/initshift/markers"
# start-order: downward-API files of the per-container ready annotations (exec-probe fallback)
CONTAINER_READY_VOLUME = "initshift-container-ready"
CONTAINER_READY_MOUNT = "/initshift/container-ready"

COMPLETION_FILE_NAME = "done"  # JSON record of a finished (or skipped) step
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# The kubelet keeps 4 KiB per container, but its status manager then cuts every message to
# 12 KiB / (init + regular containers): 1 KiB keeps a record whole in pods of up to 12.
TERMINATION_MESSAGE_LIMIT = 1024


def run_volume(index: int) -> str:
    return f"{RUN_VOLUME_PREFIX}{index}"


def run_mount(index: int) -> str:
    return f"{RUN_MOUNT_ROOT}/{index}"


def completion_path(index: int) -> str:
    return f"{run_mount(index)}/{COMPLETION_FILE_NAME}"


def marker_path(container: str) -> str:
    return f"{MARKER_MOUNT}/{container}"


def container_ready_path(container: str) -> str:
    return f"{CONTAINER_READY_MOUNT}/{container}"


# --- Waiter command line ----------------------------------------------------------------
CMD_INIT = "init"
CMD_HOLD = "hold"
CMD_RUN = "run"
CMD_START_AFTER = "start-after"
ARGV_SEPARATOR = "--"

FLAG_NAME = "--name"  # the container's name, for messages and records
FLAG_WAIT = "--wait"  # completion file of the previous step
FLAG_POST = "--post"  # this container's own completion file
FLAG_READY_FILE = "--ready-file"  # downward-API file of ANNOTATION_READY
FLAG_PROBE = "--probe"  # loopback readiness probe: http(s)://127.0.0.1:P/path or tcp://127.0.0.1:P
FLAG_TIMEOUT = "--timeout"  # seconds the child may run
FLAG_QUIT = "--quit"  # sidecar quit endpoint, POSTed by the last main to finish
FLAG_MAINS_DIR = "--mains-dir"  # the mains' shared directory (MAINS_MOUNT)
FLAG_MAINS = "--mains"  # how many mains write their record there (the last finisher quits)
FLAG_TERMINATION_LOG = "--termination-log"
FLAG_RETRY = "--retry"  # restartPolicy OnFailure: re-run own failed record, wait through failures
FLAG_SKIP_FAILS = "--skip-fails"  # a skipped step exits with the failed step's code (else 0)
FLAG_ARGV_MAP = "--argv-map"  # JSON {"os/arch[/variant]": [argv...]}, chosen at run time
FLAG_MARKER = "--marker"  # start-order: startup marker file this container writes
FLAG_AFTER_MARKER = "--after-marker"  # start-order: marker file of an earlier container
FLAG_MAX_WAIT = "--max-wait"  # start-order: give up waiting after N seconds

# The waiter's own stderr lines: PREFIX + optional "[container]" + ": " + message
# (waiter/log.py); `initshift logs` hides them unless --waiter.
WAITER_LOG_PREFIX = "waiter"
FLAG_AFTER_READY_FILE = "--after-ready-file"  # start-order: downward-API file of ANNOTATION_READY_PREFIX+name
FLAG_LOG_INTERVAL = "--log-interval"  # start-order, hidden: seconds between "still waiting" lines

# Step 0's ready gate polls its loopback probes (and the ready file where inotify is missing)
# on a backoff: the first re-check after GATE_POLL_FIRST seconds, each next one GATE_POLL_GROWTH
# times later, up to GATE_POLL_MAX, so a proxy turning ready is seen within ~GATE_POLL_MAX
# while it matters; a sidecar that takes long is then polled at GATE_POLL_SHARE of the time
# already waited (at most GATE_POLL_CEILING), so the probes' CPU falls off instead of
# running at the fast rate for as long as the pod waits.
GATE_POLL_FIRST = 0.002
GATE_POLL_GROWTH = 1.5
GATE_POLL_MAX = 0.02
GATE_POLL_SHARE = 0.005
GATE_POLL_CEILING = 1.0

# Completion record reasons (also the termination message's "reason").
REASON_COMPLETED = "Completed"
REASON_ERROR = "Error"
REASON_SKIPPED = "Skipped"
REASON_STOPPED = "Stopped"  # a terminating signal (the pod going away) before the command started
REASON_TIMED_OUT = "TimedOut"
REASON_WAITER_ERROR = "WaiterError"  # the waiter itself failed (bad flags, exec error)

# Keys of the completion record (JSON), which is also the termination message.
RECORD_NAME = "name"
RECORD_EXIT_CODE = "exitCode"
RECORD_REASON = "reason"
RECORD_STARTED_AT = "startedAt"  # RFC 3339 UTC with microseconds; the child's start, wait excluded
RECORD_FINISHED_AT = "finishedAt"
RECORD_MESSAGE = "message"  # why a step failed or was skipped
RECORD_FAILED_STEP = "failedStep"  # skipped records: the step whose failure caused the skip

# Exit codes of the waiter's own failures (a skipped step exits 0, or with FLAG_SKIP_FAILS the
# failed step's code: waiter/entrypointer.py's skip).
EXIT_TIMED_OUT = 124
EXIT_USAGE = 125  # bad flags, unusable files, no argv for this platform, internal error
EXIT_CANNOT_EXEC = 126  # found but not executable: permission denied, exec format error
EXIT_NOT_FOUND = 127  # command not found
EXIT_SIGNAL_BASE = 128  # + signal number

# Environment variables the freezer sets and the waiter scrubs before exec'ing the child.
FREEZER_ENV_EXACT = ("LD_LIBRARY_PATH_ORIG",)
FREEZER_ENV_PREFIXES = ("_PYI_", "_MEIPASS", "STATICX_")
