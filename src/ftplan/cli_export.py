"""CLI commands that turn a plan into a running job: export, train.

Wired into ``ftplan.cli`` by ``_add_export_commands(sub)`` calling ``add_export_commands(sub)``.
"""

from __future__ import annotations

__all__ = ["add_export_commands"]


def add_export_commands(sub) -> None:
    """Placeholder until `ftplan export` / `ftplan train` land."""
