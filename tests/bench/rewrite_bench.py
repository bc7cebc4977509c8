"""`make bench-rewrite`: what the rewrite and its JSONPatch cost as a pod grows, printed,
never asserted (tests/rewrite/test_linear.py asserts the growth, by counting).

For n steps and n mains beside an Istio proxy (the shape that once grew as steps x mains),
and for a Job's pod of n mains: the pod's JSON size in and out, the result, and the wall
time of `rewrite` + `make_patch`, best of 3. Pods past etcd's 1.5 MiB object limit are
admitted unchanged (`too-large`) once the rewrite has measured them.
"""

from __future__ import annotations

import time

from tests.bench._machine import Steal, describe
from tests.rewrite.test_linear import mains_of_a_job, steps_by_mains
from waiter import protocol as p
from webhook import jsontext
from webhook.admission._patch import make_patch
from webhook.rewrite._rewrite import rewrite
from webhook.settings import RewriteSettings, Settings

SIZES = (500, 1000, 2000, 4000, 8000, 12000)
WAITER = Settings(feature_gate=True, rewrite=RewriteSettings(mode=p.MODE_WAITER))


def _best(pod: dict, runs: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        result = rewrite(pod, WAITER)
        make_patch(pod, result.pod)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    print(describe())
    steal = Steal()
    print(f"{'shape':24} {'n':>6} {'pod in':>10} {'pod out':>10} {'result':>10} {'rewrite+patch':>14}")
    for label, make in (("n steps x n mains", steps_by_mains), ("a Job's n mains", mains_of_a_job)):
        for n in SIZES:
            pod = make(n)
            seconds, result = _best(pod)
            size_in, size_out = len(jsontext.dumps(pod)), len(jsontext.dumps(result.pod))
            print(f"{label:24} {n:>6} {size_in:>10,} {size_out:>10,} {result.reason:>10} {seconds * 1000:>11.1f} ms")
    print(steal)


if __name__ == "__main__":
    main()
