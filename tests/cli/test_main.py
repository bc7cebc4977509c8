"""The command table: `initshift --help`, `initshift help COMMAND`, `--version`."""

from __future__ import annotations

import pytest

from webhook import __version__
from webhook.cli._main import COMMANDS, main


def test_the_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in COMMANDS)
    assert out.rstrip().endswith("`initshift COMMAND --help` (or `initshift help COMMAND`) describes one command.")


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's --help
        return int(e.code or 0)


@pytest.mark.parametrize("command", ["mutate", "certs", "check"])
def test_help_command_is_the_commands_own_help(capsys, command):
    assert run([command, "--help"]) == 0
    expected = capsys.readouterr().out
    assert run(["help", command]) == 0
    assert capsys.readouterr().out == expected and expected.startswith(f"usage: initshift {command}")


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"initshift {__version__}\n"


@pytest.mark.parametrize("where", ["import", "run"])
def test_ctrl_c_is_exit_130_without_a_traceback(monkeypatch, capsys, where):
    """Ctrl-C while a command imports (its first second or two) or runs, where it does not
    answer it itself: the shell's 130, nothing printed (it was a KeyboardInterrupt traceback)."""
    import importlib

    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    if where == "import":
        monkeypatch.setattr(importlib, "import_module", interrupted)
    else:
        from webhook.cli import _mutate

        monkeypatch.setattr(_mutate, "main", interrupted)
    try:
        code = main(["mutate", "pod.yaml"])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt left main")
    assert code == 130
    assert capsys.readouterr() == ("", "")


def test_the_entry_point_imports_nothing_a_ctrl_c_would_interrupt_unguarded():
    """What runs before main's guard (the console script's `from webhook.cli import main`)
    is the package alone: the command table, settings, logging and the commands' modules
    load inside it, where a Ctrl-C is the shell's 130. It imported the settings there once
    (a window of about 30 ms in which Ctrl-C printed a traceback), then the command table
    (a few ms)."""
    import json
    import subprocess
    import sys

    probe = ("import json, sys; from webhook.cli import main; "
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('webhook'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert json.loads(loaded) == ["webhook", "webhook.cli"]


def test_ctrl_c_while_the_command_line_imports_is_130():
    """A Ctrl-C landing in the command table's imports, which the console script's call
    makes: 130, nothing printed."""
    import subprocess
    import sys

    script = (
        "import signal, sys\n"
        "class InterruptAtImport:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'webhook.cli._main':\n"
        "            signal.raise_signal(signal.SIGINT)\n"
        "sys.meta_path.insert(0, InterruptAtImport())\n"
        "from webhook.cli import main\n"
        "sys.exit(main(['--version']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")
