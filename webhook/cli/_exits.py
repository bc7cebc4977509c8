"""The exit codes every command shares, alone in a module that imports nothing: the
command table's guard answers a Ctrl-C with its code while the rest imports, not a traceback."""

# Every command: 0 done, 1 the cluster, a file or the server failed at run time, 2 usage or bad input.
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# The shell's codes, 128 + the signal, as kubectl's and git's: Ctrl-C (SIGINT), and standard
# output closed before everything was written (`| head`: SIGPIPE, which Python turns into an error).
EXIT_INTERRUPTED, EXIT_OUTPUT_CLOSED = 130, 141

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_OUTPUT_CLOSED", "EXIT_USAGE"]
