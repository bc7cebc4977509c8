"""`initshift mutate` is byte-stable: every fixture and example pod, in every mode, gives
exactly the output recorded in tests/golden/mutate.json (stdout, stderr and exit code).

A refactor must leave this file untouched. A deliberate behaviour change regenerates it
with `UPDATE_GOLDEN=1 pytest tests/test_golden_mutate.py` and says why in the commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.support.fixtures.pods import catalogue
from webhook.cli._main import main
from webhook.cli._podio import dump, dumper_for

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "mutate.json"
MODES = {"waiter": ["--mode", "waiter"], "native": ["--mode", "native"], "hybrid": ["--mode", "hybrid"],
         "auto": ["--mode", "auto"],
         "auto-native": ["--mode", "auto", "--native-sidecars"]}


def _cases(tmp: Path) -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for name, pod in sorted(catalogue().items()):
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(pod, sort_keys=False))
        for mode, flags in MODES.items():
            cases[f"{name}/{mode}"] = [str(path), *flags]
    for example in sorted((ROOT / "examples").iterdir()):
        for mode, flags in {"default": [], "auto-native": MODES["auto-native"]}.items():
            cases[f"examples/{example.name}/{mode}"] = [str(example), *flags]
    return cases


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> dict:
    code = main(["mutate", "-o", "json", *argv])
    out, err = capsys.readouterr()
    return {"exit": code, "stdout": out, "stderr": err}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("INITSHIFT_") or key == "SUPPORT_INJECTED_SIDECARS":
            monkeypatch.delenv(key)


def test_mutate_output_is_byte_identical_to_the_golden_file(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            clean_env: None) -> None:
    got = {name: _run(argv, capsys) for name, argv in _cases(tmp_path).items()}
    for record in got.values():  # the temporary folder's name is not part of the output
        record["stderr"] = record["stderr"].replace(str(tmp_path), "<tmp>")
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name


def _pure(obj: object) -> str:
    """What PyYAML's own (pure-Python) dumper writes: what `mutate -o yaml` always wrote."""
    return yaml.dump(obj, Dumper=yaml.SafeDumper, sort_keys=False, width=1000)


def _golden_objects(tmp: Path) -> list[object]:
    """Every input of the golden file and every object it records as output."""
    inputs = [yaml.safe_load(Path(argv[0]).read_text()) for argv in _cases(tmp).values()]
    outputs = [json.loads(record["stdout"]) for record in json.loads(GOLDEN.read_text()).values() if record["stdout"]]
    return [*inputs, *outputs]


def test_yaml_output_is_libyamls_where_it_writes_the_same_bytes(tmp_path: Path) -> None:
    """`mutate -o yaml` dumps with libyaml (5 times faster) where it writes exactly the bytes
    PyYAML's dumper writes: every golden input and output takes that path and reads the same."""
    for obj in _golden_objects(tmp_path):
        assert dumper_for(obj) is yaml.CSafeDumper
        assert dump(obj, "yaml") == _pure(obj)


SHARED = {"name": "A", "value": "1"}
TRICKY = [
    "on", "off", "yes", "no", "y", "N", "true", "False", "~", "null", "NULL", "", " ", "1e3", "0x10", "0o17", "017",
    "1_000", ".5", "+1", "-0", "1:20", "2024-05-01", "2024-05-01T10:00:00Z", ".inf", ".NaN", "0b101", "=", "<<",
    "a\nb", "a\nb\n", "a\n\nb\n\n", "\n", "  leading", "trailing  ", "tab\there", "a: b", "- x", "#c", "a #b", "&a",
    "*a", "!t", "%x", "@x", "'q'", '"d"', "{x}", "[x]", "x,y", "?", ":", "-", "---", "...", "é", "日本語", "emoji 😀",
    "\u0085", "\u2028", "\u00a0nbsp", "\ufeffbom", "\x7f", "\x01", "a\rb", "\\",
    "a" * 1200, " ".join(["word"] * 300), "set -e\n" + "echo " + "x" * 1500 + "\n",
    # Double-quoted (a space beside a line break, a tab, a non-ASCII character) and longer than a line:
    # the two emitters fold it at other places.
    "set -e\n  " + " ".join(["step"] * 300), "\t".join(["col"] * 400), "é " * 600,
]


def _tricky_documents() -> list[object]:
    docs: list[object] = [{"env": [SHARED, SHARED], "z": 1, "a": 2}]  # an anchor and an alias; keys kept in order
    for text in TRICKY:
        docs.append({"data": {"value": text, "list": [text, {"nested": text}]}})
        docs.append({text: "as a key"})
        docs.append({"k" * 90 + text[:40]: text})  # a key near the simple-key bound
    docs += [{"k" * n: 1} for n in range(95, 131)]
    docs.append({"é" * 64: 1})
    return docs


def test_yaml_output_is_byte_identical_to_pythons_dumper_for_tricky_strings() -> None:
    """Strings that read as other types, line breaks, escapes, long lines, odd keys: the same
    bytes either way. Where libyaml's own bytes differ (an empty key, a \\r in one, a key
    near 128 characters, a long double-quoted string folded elsewhere), `dump` must have
    chosen PyYAML's dumper, which the check below confirms case by case."""
    assert yaml.CSafeDumper is not None
    differing = 0
    for doc in _tricky_documents():
        assert dump(doc, "yaml") == _pure(doc), doc
        if yaml.dump(doc, Dumper=yaml.CSafeDumper, sort_keys=False, width=1000) != _pure(doc):
            differing += 1
            assert dumper_for(doc) is yaml.SafeDumper, doc
    assert differing > 0  # the cases above still reach what libyaml writes otherwise
