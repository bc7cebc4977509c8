"""`python -m tests.support.k8s control-plane [VERSION]`: etcd + kube-apiserver until Ctrl-C.

Prints the admin kubeconfig's path; everything is removed when it stops."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from . import ClusterError, control_plane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.k8s")
    sub = parser.add_subparsers(dest="command", required=True)
    cp = sub.add_parser("control-plane", help="etcd + kube-apiserver until interrupted")
    cp.add_argument("version", nargs="?", default="1.34", help="1.34, 1.28 or a full v1.x.y (default 1.34)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with control_plane(args.version, log=lambda m: print(m, file=sys.stderr)) as plane:
            print(f"export KUBECONFIG={plane.kubeconfig}", flush=True)
            stop.wait()
    except ClusterError as exc:
        print(f"control-plane: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
