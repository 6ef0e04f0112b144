"""Declared options: each setting's name, default, unit and meaning in one place.

The adapters read their settings (``broker_transport_options``, beat's ``app.conf``, the
``django.tasks`` backend's ``OPTIONS``) through an :class:`Options` registry, so the default
the code uses and the sentence the reference shows come from the same definition;
``docs/_gen/reference.py`` renders the registries into ``docs/reference/`` and a test fails
when a name is read that no registry declares.

An option may carry a :class:`Check`: :meth:`Options.parse` then refuses a value of the wrong
type or range with an error naming the option, the value and what it expects, instead of
converting it (``bool("false")`` is True, ``int(2.7)`` is 2), and refuses an unknown name
(a typo would otherwise leave the default silently in force).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..db.errors import InvalidInput
from ..db.queries import TABLE_NAME_RE


@dataclass(frozen=True)
class Check:
    """What an option's value must be: ``expects`` in words (for the error and the
    reference), ``accepts`` the test, ``convert`` applied to an accepted value (an int number
    of seconds becomes a float: a widening, never a guess)."""

    expects: str
    accepts: Callable[[Any], bool]
    convert: Callable[[Any], Any] = lambda value: value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int in Python


def whole(minimum: int) -> Check:
    """An int (not a bool, not a float or a string of digits) >= ``minimum``."""
    return Check(f"an int >= {minimum}", lambda v: _is_int(v) and v >= minimum)


def seconds(minimum: float = 0.0, *, positive: bool = False) -> Check:
    """A finite number (int or float, not a bool or a string) of seconds, >= ``minimum``
    (or > 0 with ``positive``); read as a float."""
    bound = "> 0" if positive else f">= {minimum:g}"

    def accepts(v: Any) -> bool:
        if not (_is_int(v) or isinstance(v, float)) or not math.isfinite(v):
            return False
        return v > 0 if positive else v >= minimum

    return Check(f"a number of seconds {bound}", accepts, float)


def optional(check: Check, meaning: str) -> Check:
    """``check``, or None (``meaning`` says what None does)."""
    return Check(f"{check.expects}, or None ({meaning})",
                 lambda v: v is None or check.accepts(v),
                 lambda v: None if v is None else check.convert(v))


IS_FLAG = Check("True or False", lambda v: isinstance(v, bool))
IS_NAME = Check("a non-empty string", lambda v: isinstance(v, str) and v != "")
IS_TABLE = Check("a table name (1-31 letters, digits or underscores, not starting with a digit)",
              lambda v: isinstance(v, str) and TABLE_NAME_RE.match(v) is not None)
IS_MAPPING = Check("a dict", lambda v: isinstance(v, Mapping), dict)


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
    check: Check | None = None

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

    def parse(self, values: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Every declared option's value: ``values[name]`` passed through the option's
        :class:`Check`, or the declared default when missing (None is a value here: an
        option whose check accepts it gives None a meaning). Raises :class:`InvalidInput`
        naming ``where`` and the option for an unknown name or a refused value (the first
        of :meth:`problems`)."""
        problems = self.problems(values, where)
        if problems:
            raise InvalidInput(problems[0])
        return {name: self.checked(name, values[name], where) if name in values
                else option.default for name, option in self._by_name.items()}

    def problems(self, values: Mapping[str, Any], where: str) -> list[str]:
        """Everything :meth:`parse` would refuse in ``values``, one sentence each: the
        unknown names (with the closest known one), then each refused value in declaration
        order. A report (a system check) lists them all; ``parse`` raises the first."""
        if not isinstance(values, Mapping):
            return [f"{where}: expected a dict of options, got {values!r}"]
        out = []
        unknown = sorted(set(values) - set(self._by_name), key=str)
        if unknown:
            known = ", ".join(self._by_name)
            hints = [f"{name!r} (did you mean {close[0]!r}?)" if (
                close := difflib.get_close_matches(str(name), self._by_name, n=1)) else
                repr(name) for name in unknown]
            out.append(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} "
                       f"{', '.join(hints)}; the options are {known}")
        for name in self._by_name:
            if name in values:
                try:
                    self.checked(name, values[name], where)
                except InvalidInput as exc:
                    out.append(str(exc))
        return out

    def checked(self, name: str, value: Any, where: str, label: str | None = None) -> Any:
        """``value`` for option ``name`` passed through its :class:`Check` (as given when it
        has none); :class:`InvalidInput` naming ``where``, ``label`` (default: the name),
        the value and what is expected when refused."""
        check = self._by_name[name].check
        if check is None:
            return value
        if not check.accepts(value):
            raise InvalidInput(f"{where} {label or name} = {value!r}: expected {check.expects}")
        return check.convert(value)
