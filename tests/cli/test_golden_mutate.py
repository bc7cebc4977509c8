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
