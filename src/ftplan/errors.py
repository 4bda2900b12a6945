"""The small error hierarchy of ftplan.

Every error carries one or more :class:`Problem` s: the option ``field`` it is about (an option
name of :mod:`ftplan.options`, e.g. ``"seq_len"``, or None), a ``message`` that says what is wrong
and a ``hint`` that says how to fix it. Validation collects every problem before raising.

Messages name *fields*, never command-line flags: a reference to an option or parameter is
written in backticks, ```lora_dropout``` or ```lora_dropout=0```, and a reference to a command
as ```ftplan models```. Front ends render them (:meth:`FtplanError.one_line`): the CLI as
``--lora-dropout 0`` and ``'ftplan models'``, the web app as ``lora_dropout=0`` and
``GET /api/models``. The CLI prints ``ftplan: error: <message> (<hint>)`` on one line and exits
with code 2.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

__all__ = [
    "Problem",
    "FtplanError",
    "ConfigError",
    "CatalogError",
    "NotFoundError",
    "InfeasibleError",
    "MeasurementError",
    "Renderer",
    "render_refs",
    "did_you_mean",
]

#: ```name``` / ```name=value``` (an option or parameter) and ```ftplan command args``` (a command)
_REF = re.compile(r"`(?:(?P<cmd>ftplan(?: [^`]+)?)|(?P<name>[a-z][a-z0-9_]*)(?:=(?P<value>[^`]*))?)`")


@dataclass(frozen=True)
class Renderer:
    """How references in messages are written: ``field(name, value)`` and ``command(text)``."""

    field: Callable[[str, str | None], str]
    command: Callable[[str], str]


def _field_words(name: str, value: str | None) -> str:
    return name if value is None else f"{name}={value}"


#: the library's own wording (``str(error)``, the web app): field names as they are
FIELDS = Renderer(field=_field_words, command=lambda text: f"'{text}'")


def render_refs(text: str, renderer: Renderer | None = None) -> str:
    """``text`` with its backticked references written by ``renderer`` (default: field names)."""
    r = renderer or FIELDS

    def sub(m: re.Match) -> str:
        if m.group("cmd"):
            return r.command(m.group("cmd"))
        return r.field(m.group("name"), m.group("value"))

    return _REF.sub(sub, text)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: the option ``field`` (or None), what, and how to fix it."""

    field: str | None
    message: str
    hint: str | None = None

    def one_line(self, renderer: Renderer | None = None) -> str:
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return " ".join(render_refs(text, renderer).split())


class FtplanError(Exception):
    """Base of every error ftplan raises on purpose.

    ``FtplanError(message, hint, field=...)`` for one problem, ``FtplanError(problems=[...])``
    for several (all found at once). ``message`` and ``hint`` are the first problem's when there
    is one, and the joined problems otherwise.
    """

    def __init__(self, message: str | None = None, hint: str | None = None, *, field: str | None = None,
                 problems: Iterable[Problem] = ()) -> None:
        probs = tuple(problems)
        if not probs:
            probs = (Problem(field, message or "", hint),)
        self.problems: tuple[Problem, ...] = probs
        if len(probs) == 1:
            self.message, self.hint = probs[0].message, probs[0].hint
        else:
            self.message = "; ".join((p.message if not p.hint else f"{p.message} ({p.hint})") for p in probs)
            self.hint = None
        super().__init__(self.message)

    @property
    def field(self) -> str | None:
        """The field of the first problem that names one."""
        return next((p.field for p in self.problems if p.field), None)

    def one_line(self, renderer: Renderer | None = None) -> str:
        """Every problem on one line, references written by ``renderer`` (default: field names)."""
        return "; ".join(p.one_line(renderer) for p in self.problems)

    def at(self, field: str) -> "FtplanError":
        """The same error with ``field`` on the problems that name none (same class)."""
        err = type(self).__new__(type(self))
        FtplanError.__init__(err, problems=[p if p.field else replace(p, field=field) for p in self.problems])
        return err

    def __str__(self) -> str:
        return self.one_line()


class ConfigError(FtplanError):
    """A job, layout, option or model config the user gave is invalid or unsupported."""


class NotFoundError(ConfigError):
    """A named thing (model, GPU, provider) is not in the catalog."""


class CatalogError(FtplanError):
    """A data file (bundled or user-supplied) is malformed."""


class InfeasibleError(FtplanError):
    """No plan satisfies the constraints."""


class MeasurementError(FtplanError):
    """A measurement could not be taken or a record file is unusable."""


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str | None:
    """A 'did you mean ...?' hint with close matches of ``name`` among ``choices``."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    matches = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.55)
    if not matches:
        # substring matches help with 'llama-70b' -> 'llama-3.1-70b'
        matches = [c for c in lowered if name.lower() in c][:n]
    if not matches:
        return None
    return "did you mean " + ", ".join(repr(lowered[m]) for m in matches) + "?"
