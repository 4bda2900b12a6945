"""The small error hierarchy of ftplan.

Every error carries a message that says what is wrong and, in ``hint``, how to fix it.
The CLI prints ``error: <message> (<hint>)`` on one line and exits with code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "FtplanError",
    "ConfigError",
    "CatalogError",
    "NotFoundError",
    "InfeasibleError",
    "MeasurementError",
    "did_you_mean",
]


class FtplanError(Exception):
    """Base of every error ftplan raises on purpose."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return " ".join(text.split())


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
