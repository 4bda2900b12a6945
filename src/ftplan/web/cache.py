"""The web app's result cache: a small thread-safe LRU of response bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["LRU"]


class LRU:
    """A small thread-safe LRU of response bytes; concurrent misses of one key compute once."""

    def __init__(self, maxsize: int = 64, max_bytes: int = 64 << 20) -> None:
        self.maxsize, self.max_bytes = maxsize, max_bytes
        self._d: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self.hits = self.misses = 0

    def peek(self, key: str) -> bytes | None:
        """The cached value, or None (no computing: safe on the event loop)."""
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
                self.hits += 1
            return v

    def get(self, key: str, compute: Callable[[], bytes]) -> tuple[bytes, bool]:
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                self.hits += 1
                return self._d[key], True
            ev = self._inflight.get(key)
            owner = ev is None
            if owner:
                ev = self._inflight[key] = threading.Event()
        if not owner:
            ev.wait(60)
            with self._lock:
                if key in self._d:
                    self.hits += 1
                    return self._d[key], True
            return compute(), False  # the first one failed: raise our own error
        try:
            val = compute()
            with self._lock:
                self.misses += 1
                if self.maxsize > 0 and len(val) <= self.max_bytes:
                    self._d[key] = val
                    self._bytes += len(val)
                    while len(self._d) > self.maxsize or self._bytes > self.max_bytes:
                        _, old = self._d.popitem(last=False)
                        self._bytes -= len(old)
            return val, False
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            ev.set()
