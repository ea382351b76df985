"""Named plugin registries: explicit, lazy, refusing duplicates.

Built-ins are listed in one place per family (`builtin.py`), as `name -> "module:attr"`; the
target is imported on first use. Unknown names raise `ConfigError` naming the valid ones.
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

from splitserve.core.errors import ConfigError

T = TypeVar("T")


class PluginRegistry(Generic[T]):
    def __init__(self, family: str) -> None:
        self.family = family
        self._targets: dict[str, str] = {}
        self._loaded: dict[str, T] = {}

    def add(self, name: str, target: str) -> None:
        if name in self._targets:
            raise ValueError(f"{self.family} plugin {name!r} is already registered")
        if ":" not in target:
            raise ValueError(f"target must be 'module:attr', got {target!r}")
        self._targets[name] = target

    def names(self) -> list[str]:
        return sorted(self._targets)

    def get(self, name: str) -> T:
        if name in self._loaded:
            return self._loaded[name]
        try:
            target = self._targets[name]
        except KeyError:
            valid = ", ".join(self.names()) or "(none)"
            raise ConfigError(f"unknown {self.family} {name!r}; valid: {valid}") from None
        module_name, attr = target.split(":", 1)
        obj: T = getattr(importlib.import_module(module_name), attr)
        self._loaded[name] = obj
        return obj
