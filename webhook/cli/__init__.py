"""The `initshift` command line: one private module per subcommand, each with `main(argv) -> int`."""

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """`initshift` (_main.py). The console script imports this package, then calls this:
    everything the command line imports loads here, where Ctrl-C is the shell's 130 (130 is
    _exits.EXIT_INTERRUPTED, not imported before the guard); before it only the interpreter's
    own start-up (about 15 ms) can print a KeyboardInterrupt traceback."""
    try:
        from ._main import main as run
    except KeyboardInterrupt:
        return 130
    return run(argv)
