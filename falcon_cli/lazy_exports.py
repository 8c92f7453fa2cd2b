"""A package's public names, imported from its modules on first use (PEP 562's module ``__getattr__``).

Importing ``falcon_cli.models.config`` first runs ``falcon_cli/models/__init__.py``. If that file imported the
package's public names, reading a model config (which validating a recipe does, through the config schema)
would import the networks and torch with it. So a package whose light modules the command line reads
(``falcon_cli.models``, ``falcon_cli.data.shapes``) names its public API here instead, and each name is imported
from its module when first asked for: ``from falcon_cli.models import create_model`` works as before.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(
    package: str, exports: dict[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose public names are ``exports``: ``{module: names}``,
    each module relative to the package (``{"registry": ("create_model", ...)}``)."""
    home = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home:  # (so that `from package import submodule` falls back to importing the submodule)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)  # asked once: later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return __getattr__, __dir__, sorted(home)


__all__ = ["lazy_exports"]
