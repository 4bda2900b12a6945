"""A small, deterministic YAML writer for the exported configs (no PyYAML at run time).

Only what the export needs: mappings (insertion order kept), sequences, strings, ints, floats,
bools and null. Strings that could be read back as anything but the same string are written as
JSON strings (a JSON string is a valid YAML double-quoted scalar); multi-line strings become
literal blocks (``|``). Comments can be attached to mapping keys with :class:`Commented`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["dump_yaml", "Commented"]

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./+-]*$")
#: YAML 1.1 and 1.2 words that plain scalars would turn into booleans or null
_SPECIAL = {"y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"}


class Commented:
    """A value with a comment written on the line above its key."""

    __slots__ = ("value", "comment")

    def __init__(self, value: Any, comment: str) -> None:
        self.value = value
        self.comment = comment


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v!r} to YAML")
        text = repr(v)
        mantissa, e, exp = text.partition("e")
        if e and "." not in mantissa:  # YAML 1.1 (PyYAML) reads 2e-05 as a string, 2.0e-05 as a float
            text = f"{mantissa}.0e{exp}"
        return text
    if isinstance(v, str):
        if _PLAIN.match(v) and v.lower() not in _SPECIAL:
            return v
        return json.dumps(v, ensure_ascii=False)
    raise TypeError(f"cannot write {type(v).__name__} to YAML")


def _is_block(v: Any) -> bool:
    return isinstance(v, str) and "\n" in v and not v[:1].isspace() and "\t" not in v


def _block(text: str, indent: str) -> str:
    keep = "" if text.endswith("\n") else "-"
    body = text if text.endswith("\n") else text + "\n"
    lines = [(indent + line) if line.strip() else "" for line in body[:-1].split("\n")]
    return f"|{keep}\n" + "\n".join(lines)


def _emit(obj: Any, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError("mapping keys must be strings")
            if isinstance(v, Commented):
                for line in v.comment.splitlines():
                    out.append(f"{pad}# {line}".rstrip())
                v = v.value
            key = _scalar(k)
            if isinstance(v, Mapping) and v:
                out.append(f"{pad}{key}:")
                _emit(v, indent + 2, out)
            elif isinstance(v, Sequence) and not isinstance(v, str) and v:
                out.append(f"{pad}{key}:")
                _emit(v, indent + 2, out)
            elif isinstance(v, Mapping):
                out.append(f"{pad}{key}: {{}}")
            elif isinstance(v, Sequence) and not isinstance(v, str):
                out.append(f"{pad}{key}: []")
            elif _is_block(v):
                out.append(f"{pad}{key}: " + _block(v, pad + "  "))
            else:
                out.append(f"{pad}{key}: {_scalar(v)}")
    elif isinstance(obj, Sequence) and not isinstance(obj, str):
        for item in obj:
            if isinstance(item, Mapping) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                first = sub[0]
                out.append(f"{pad}- {first[indent + 2:]}")
                out.extend(sub[1:])
            elif _is_block(item):
                out.append(f"{pad}- " + _block(item, pad + "  "))
            elif isinstance(item, (Mapping, Sequence)) and not isinstance(item, str):
                if item:
                    raise TypeError("nested sequences are not supported")
                out.append(f"{pad}- " + ("{}" if isinstance(item, Mapping) else "[]"))
            else:
                out.append(f"{pad}- {_scalar(item)}")
    else:
        out.append(pad + _scalar(obj))


def dump_yaml(obj: Mapping[str, Any], header: str | None = None) -> str:
    """YAML text of ``obj`` (a mapping), with ``header`` as leading ``#`` comment lines."""
    out: list[str] = []
    if header:
        out.extend(f"# {line}".rstrip() for line in header.splitlines())
    _emit(obj, 0, out)
    return "\n".join(out) + "\n"
