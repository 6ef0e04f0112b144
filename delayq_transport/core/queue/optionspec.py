"""Declared options: each setting's name, default, unit and meaning in one place.

The adapters read their settings (``broker_transport_options``, beat's ``app.conf``) through
an :class:`Options` registry, so the default the code uses and the sentence the reference
shows come from the same definition; ``docs/_gen/reference.py`` renders the registries into
``docs/reference/`` and a test fails when a name is read that no registry declares.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    """One setting. ``unit`` says what the value is ("seconds", "bool", "int", ...);
    ``shown`` replaces the default in the reference when the default is computed (None in
    code, "the broker URL" for a reader)."""

    name: str
    default: Any
    unit: str
    doc: str
    shown: str | None = None

    @property
    def default_text(self) -> str:
        if self.shown is not None:
            return self.shown
        return "unset" if self.default is None else repr(self.default)


class Options(Mapping[str, Option]):
    """An ordered, read-only set of options; unknown names raise ``KeyError``."""

    def __init__(self, *options: Option) -> None:
        self._by_name = {o.name: o for o in options}
        if len(self._by_name) != len(options):
            raise ValueError("an option is declared twice")

    def __getitem__(self, name: str) -> Option:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def default(self, name: str) -> Any:
        return self._by_name[name].default

    def read(self, values: Mapping[str, Any], name: str) -> Any:
        """``values[name]``, or the declared default when it is missing or None."""
        value = values.get(name)
        return self.default(name) if value is None else value
