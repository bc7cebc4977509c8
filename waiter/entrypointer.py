"""`waiter run`: wait for the previous step (and the ready gate), run the command, post the
result, quit the sidecars when last. Modelled on Tekton's Entrypointer: the pieces (wait,
gate, runner, post, quit) live in their own modules; this one only orders them."""

from __future__ import annotations

import os
import signal

from . import log, post, runner
from . import protocol as p
from .errors import UsageError, WaiterError
from .env import child_environment
from .flags import USAGE, RunOptions, parse_run, post_path_of
from .gate import Gate
from .quit import quit_sidecars, record_main
from .record import Record, now, read_record, rfc3339, skip_message
from .signals import TERMINATING, SignalBox
from .wait import DirWatch

__all__ = ["USAGE", "Entrypointer", "main"]  # USAGE: printed by waiter/cli.py for `run --help`


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class Entrypointer:
    def __init__(self, opts: RunOptions, box: SignalBox) -> None:
        self.opts = opts
        self.box = box
        self.stop_signal = 0

    # --- pieces -------------------------------------------------------------------------
    def interrupted(self) -> bool:
        """A terminating signal before the child exists ends the wait (the pod is going away)."""
        for sig in self.box.take():
            if sig in TERMINATING and not self.stop_signal:
                self.stop_signal = sig
        return bool(self.stop_signal)

    def _record(self, code: int, reason: str, message: str = "", failed_step: str = "",
                started: float | None = None, finished: float | None = None) -> Record:
        finished = now() if finished is None else finished
        started = finished if started is None else started
        return Record(self.opts.name, code, reason, rfc3339(started), rfc3339(finished),
                      message, failed_step)

    def wait_predecessor(self) -> Record | None:
        """The previous step's record once it is final for us; None when interrupted."""
        path = self.opts.wait
        said = ""
        with DirWatch([os.path.dirname(path) or "."], [os.path.basename(path)]) as watch:
            while not self.interrupted():
                try:
                    rec = read_record(path)
                except ValueError as exc:
                    rec = Record("", p.EXIT_USAGE, p.REASON_WAITER_ERROR, "", "",
                                 f"unreadable record {path}: {exc}")
                    if rec.message != said:  # the skip's own message only names the code
                        said = rec.message
                        log.say(said)
                # With --retry a failed predecessor is retried by the kubelet: keep waiting.
                if rec is not None and (rec.ok or not self.opts.retry):
                    return rec
                watch.wait(None, self.box)
        return None

    def skip(self, prev: Record) -> Record:
        """The record of a step that does not run. It exits 0 (under init containers a step
        after a failed one never starts and has no exit code, and the Job controller's
        `podFailurePolicy` matches every non-zero code of the container it names: a rule
        for the main would take the failing step's code as the main's), or with
        FLAG_SKIP_FAILS the failed step's code: the webhook sets it where a controller reads
        the containers' codes for its verdict (kpack takes a `completion` that exited 0 for
        a built image). The pod ends Failed either way: the failing step's own container
        carries its code; the record says which."""
        failed = prev.failed_step or prev.name or os.path.dirname(self.opts.wait)
        code = prev.exit_code if prev.exit_code > 0 else 1
        message = skip_message(failed, prev.reason, prev.message, code)
        return self._record(code if self.opts.skip_fails else 0, p.REASON_SKIPPED, message, failed)

    def outcome_record(self, out: runner.Outcome) -> Record:
        if out.timed_out:
            return self._record(p.EXIT_TIMED_OUT, p.REASON_TIMED_OUT,
                                f"timed out after {self.opts.timeout:g}s; process group killed",
                                started=out.started_at, finished=out.finished_at)
        if out.exit_code == 0:
            return self._record(0, p.REASON_COMPLETED, started=out.started_at, finished=out.finished_at)
        message = (f"killed by {_signame(out.signal)}" if out.signal
                   else f"exited with code {out.exit_code}")
        return self._record(out.exit_code, p.REASON_ERROR, message,
                            started=out.started_at, finished=out.finished_at)

    def finish(self, rec: Record, *, post_completion: bool = True) -> int:
        opts = self.opts
        wrote = post.write_termination_message(opts.termination_log, rec, explicit=opts.termination_log_explicit)
        code = rec.exit_code
        if post_completion:
            try:
                post.write_completion(opts.post, rec)
            except OSError as exc:
                log.say(f"cannot write completion file {opts.post}: {exc.strerror} "
                        f"({rec.reason}, exit code {rec.exit_code}); the steps after this one cannot start")
                code = code or p.EXIT_USAGE
                if wrote:
                    post.retract_termination_message(opts.termination_log)
        # Under --retry a failed container is restarted: its sidecars must stay up for it.
        if rec.ok or not opts.retry:
            if opts.mains_dir:
                record_main(opts.mains_dir, opts.name, rec)
            quit_sidecars(opts.quit, opts.mains_dir, opts.mains, opts.retry)
        return code

    def fail(self, exc: WaiterError) -> int:
        log.say(exc.message)
        return self.finish(self._record(exc.exit_code, p.REASON_WAITER_ERROR, exc.message))

    def stopped(self) -> int:
        name = _signame(self.stop_signal)
        log.say(f"{name} before the command started: not running it")
        return self.finish(self._record(p.EXIT_SIGNAL_BASE + self.stop_signal, p.REASON_STOPPED,
                                        f"stopped by {name} before the command started"))

    # --- the sequence -------------------------------------------------------------------
    def run(self) -> int:
        opts = self.opts
        try:
            own = read_record(opts.post)
        except ValueError as exc:
            return self.fail(WaiterError(f"own completion file is unreadable: {exc}"))
        if own is not None:
            if own.ok or not opts.retry:
                log.say(f"already ran in this pod ({own.reason}, exit code {own.exit_code}): "
                        "not running again")
                return self.finish(own, post_completion=False)
            log.say(f"restarted after {own.reason} (exit code {own.exit_code}): running again")
        if opts.wait:
            prev = self.wait_predecessor()
            if prev is None:
                return self.stopped()
            if not prev.ok:
                rec = self.skip(prev)
                log.say(rec.message)
                return self.finish(rec)
        # A signal that came while the gate's last probe or the predecessor's record was being
        # read is still queued: the command must not start only to be sent it.
        if not Gate(opts.ready_file or None, opts.probes).wait(self.interrupted, self.box) or self.interrupted():
            return self.stopped()
        try:
            out = runner.run(opts.argv, child_environment(), self.box, opts.timeout)
        except WaiterError as exc:
            return self.fail(exc)
        return self.finish(self.outcome_record(out))


def _fail_early(args: list[str], exc: WaiterError) -> int:
    """Bad flags: one line, and still a failure record if we know where it goes."""
    log.say(exc.message)
    path = post_path_of(args)
    if path and os.path.isdir(os.path.dirname(path) or "."):
        t = rfc3339(now())
        rec = Record("", exc.exit_code, p.REASON_WAITER_ERROR, t, t, exc.message)
        try:
            post.write_completion(path, rec)
        except OSError as err:
            log.say(f"cannot write completion file {path}: {err.strerror}")
    return exc.exit_code


def main(argv: list[str]) -> int:
    try:
        opts = parse_run(argv)
    except UsageError as exc:
        return _fail_early(argv, exc)
    log.set_name(opts.name)
    box = SignalBox()
    runner.become_subreaper()
    try:
        return Entrypointer(opts, box).run()
    except Exception as exc:  # a bug of ours: one line, a failure record, never a traceback
        return _fail_early(argv, WaiterError(f"internal error: {type(exc).__name__}: {exc}"))
