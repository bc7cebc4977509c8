"""webhook.jsontext: the same JSON value as the standard library, whatever orjson refuses."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from webhook import jsontext


@pytest.mark.parametrize("value", [
    {"a": [1, "é", None, True, 1.5, {"b": "\u2028<>&"}], "z": -0.0},
    {"big": 2**70, "neg": -(2**64)},  # over 64 bits: orjson refuses them
    {"lone": "\ud800x"},  # a lone surrogate, as json.loads makes from "\\ud800"
])
def test_dumps_is_compact_json_of_the_same_value(value):
    text = jsontext.dumps(value)
    assert isinstance(text, bytes) and b" " not in text.replace(b"\\u", b"")
    assert json.loads(text) == value


def test_object_keys_keep_their_order():
    assert jsontext.dumps({"b": 1, "a": 2}) == b'{"b":1,"a":2}'


def test_ctrl_c_while_orjson_loads_is_an_interrupt_not_a_crash():
    """orjson's initialisation crashes (SIGSEGV) when an import it makes raises, as Ctrl-C's
    KeyboardInterrupt does there (ijl/orjson#310): the signal is held until it is loaded."""
    script = textwrap.dedent("""
        import signal, sys

        class InterruptInsideOrjson:
            loading = False

            def find_spec(self, name, path=None, target=None):
                if self.loading:  # the first import orjson's initialisation makes
                    self.loading = False
                    signal.raise_signal(signal.SIGINT)
                self.loading = name == "orjson.orjson"

        sys.meta_path.insert(0, InterruptInsideOrjson())
        try:
            import webhook.jsontext
        except KeyboardInterrupt:
            print("interrupted", "orjson" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=pathlib.Path(__file__).resolve().parents[1])
    assert (done.returncode, done.stdout, done.stderr) == (0, "interrupted True\n", "")
