"""CLI command for the local web app: serve.

Wired into ``ftplan.cli`` by ``_add_web_commands(sub)`` calling ``add_web_commands(sub)``.
"""

from __future__ import annotations

__all__ = ["add_web_commands"]


def add_web_commands(sub) -> None:
    """Placeholder until `ftplan serve` lands."""
