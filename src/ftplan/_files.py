"""Atomic file replacement: what ftplan writes over a user's file (a plot, a ratchet) is either the
old file or the complete new one, never a half-written mix."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import IO

__all__ = ["atomic_open"]


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], *, binary: bool = False,
                mode_bits: int | None = None) -> Iterator[IO]:
    """Open a uniquely named temporary file next to ``path`` for writing; on a clean exit flush it
    to disk, give it ``mode_bits`` (default: the existing file's permission bits, else 0o644) and
    rename it over ``path``. On any exception the temporary file is removed and ``path`` is left
    as it was."""
    p = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(p))
    if mode_bits is None:
        try:
            mode_bits = stat.S_IMODE(os.stat(p).st_mode)
        except OSError:
            mode_bits = 0o644
    name = os.path.basename(p)[:100]
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode_bits)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
