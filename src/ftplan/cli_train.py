"""CLI command that runs a plan on this machine: train.

Wired into ``ftplan.cli`` by ``_add_train_commands(sub)`` calling ``add_train_commands(sub)``.
"""

from __future__ import annotations

__all__ = ["add_train_commands"]


def add_train_commands(sub) -> None:
    """Placeholder until `ftplan train` lands."""
