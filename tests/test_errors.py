"""One exception hierarchy: every exception class defined in webhook/ derives from
`webhook.errors.InitshiftError`, so a caller tells initshift's own errors (a message for
the user) from a bug. certs/ and waiter/ import nothing from webhook/ and keep their own
roots (`PKIError`, `WaiterError`), as webhook/errors.py says."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import webhook
from webhook.errors import InitshiftError


def _exceptions(package) -> dict[str, type]:  # noqa: ANN001 - a package module
    """Every exception class defined (not imported) in the package and its modules, by
    qualified name."""
    names = [package.__name__, *(m.name for m in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
                                 if not m.name.endswith(".__main__"))]  # an entry point runs when imported
    found = {}
    for name in sorted(names):
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def outside(package) -> list[str]:  # noqa: ANN001
    return [name for name, cls in _exceptions(package).items() if not issubclass(cls, InitshiftError)]


def test_every_exception_in_webhook_is_an_initshift_error() -> None:
    found = _exceptions(webhook)
    assert {"webhook.kube._config.KubeConfigError", "webhook.cli._common.CliError",
            "webhook.errors.InitshiftError"} <= set(found)
    assert outside(webhook) == []


def test_an_exception_outside_the_hierarchy_is_found(tmp_path, monkeypatch) -> None:
    package = tmp_path / "stray_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_mod.py").write_text("from webhook.errors import InitshiftError\n\n\n"
                                     "class Ours(InitshiftError):\n    pass\n\n\n"
                                     "class Stray(Exception):\n    pass\n\n\n"
                                     "class Plain(ValueError):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert outside(importlib.import_module("stray_package")) == ["stray_package._mod.Plain",
                                                                 "stray_package._mod.Stray"]
