"""`python -m tests.support.k8s control-plane|cluster [VERSION] [--image TAR ...]`: etcd +
kube-apiserver alone, or a whole single-node cluster (with these images imported), until
Ctrl-C or SIGTERM. Prints the admin kubeconfig's path; everything is removed when it stops."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from pathlib import Path

from . import ClusterError, cluster, control_plane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.k8s")
    sub = parser.add_subparsers(dest="command", required=True)
    cp = sub.add_parser("control-plane", help="etcd + kube-apiserver until interrupted")
    cp.add_argument("version", nargs="?", default="1.34", help="1.34, 1.28 or a full v1.x.y (default 1.34)")
    whole = sub.add_parser("cluster", help="a single-node cluster until interrupted (root)")
    whole.add_argument("version", nargs="?", default="1.34", help="1.34, 1.28 or a full v1.x.y (default 1.34)")
    whole.add_argument("--image", action="append", default=[], type=Path, help="a docker-archive tar to import")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        say = lambda m: print(m, file=sys.stderr)  # noqa: E731
        running = control_plane(args.version, log=say) if args.command == "control-plane" else \
            cluster(args.version, images=args.image, log=say)
        with running as plane:
            print(f"export KUBECONFIG={plane.kubeconfig}", flush=True)
            stop.wait()
    except ClusterError as exc:
        print(f"control-plane: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
