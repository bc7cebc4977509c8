"""The `initshift` command line: one private module per subcommand, each with `main(argv) -> int`."""

from ._main import main

__all__ = ["main"]
