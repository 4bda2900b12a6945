"""A small, deterministic YAML writer for the exported configs (no PyYAML at run time).

Only what the export needs: mappings (insertion order kept), sequences, strings, ints, floats,
bools and null. Quoting is decided here, in one place, for every renderer:

* a string that could be read back as anything but the same string is written double-quoted,
  with every character that is not printable (controls, format characters, line/paragraph
  separators, a lone surrogate...) escaped (``\\r``, ``\\x85``, ``\\u2028``): nothing a value holds
  can end the scalar, start a new line or add a key;
* only a plain token (``^[A-Za-z_/][A-Za-z0-9_./+-]*$``, not a YAML 1.1 boolean/null word) is
  written unquoted: it cannot be read as anything else nor break a line;
* values that come from the user (model reference, dataset, names) go through :func:`user_text`,
  which refuses control characters with a clear ``ConfigError`` (and is never written as a block);
* multi-line strings become literal blocks (``|``) only when that reads back exactly (printable
  lines, no leading indentation, no whitespace-only lines, at most one trailing newline); else they
  are quoted too;
* comments (headers, :class:`Commented`) are split on every line break Python knows and their
  non-printable characters escaped, so a comment cannot spill into data.

The property "any text round-trips through PyYAML unchanged and adds no key" is tested with
hypothesis (``tests/test_bad_input_export.py``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..inputs import check_text

__all__ = ["dump_yaml", "Commented", "UserText", "user_text", "yaml_quote", "comment_text"]

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./+-]*$")
#: YAML 1.1 and 1.2 words that plain scalars would turn into booleans or null
_SPECIAL = {"y", "yes", "n", "no", "true", "false", "on", "off", "null", "~"}


class Commented:
    """A value with a comment written on the line above its key."""

    __slots__ = ("value", "comment")

    def __init__(self, value: Any, comment: str) -> None:
        self.value = value
        self.comment = comment


class UserText(str):
    """A string that came from the user and passed :func:`user_text` (never written as a block)."""

    __slots__ = ()


def user_text(value: Any, what: str, *, allow_empty: bool = False, field: str | None = None) -> UserText:
    """Check a user-supplied one-line value (``ConfigError`` for control characters, non-strings,
    absurd lengths) and mark it as a one-line value. Every renderer passes user strings
    (``model_ref``, ``dataset``, names from a plan file) through this before writing them."""
    if isinstance(value, UserText):
        return value
    return UserText(check_text(value, what, allow_empty=allow_empty, field=field))


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\x00": "\\0"}


def _escape_char(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if ch.isprintable():
        return ch
    o = ord(ch)
    if o <= 0xFF:
        return f"\\x{o:02x}"
    if o <= 0xFFFF:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def yaml_quote(text: str) -> str:
    """``text`` as a YAML double-quoted scalar that reads back as exactly ``text``."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return '"' + "".join(_escape_char(ch) for ch in text) + '"'


def comment_text(text: str) -> list[str]:
    """The lines of a comment: split on every line break, non-printable characters escaped."""
    out = []
    for line in str(text).splitlines() or [""]:
        if not line.isprintable():
            line = "".join(ch if ch.isprintable() else _escape_char(ch) for ch in line)
        out.append(line)
    return out


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
        return yaml_quote(v)
    raise TypeError(f"cannot write {type(v).__name__} to YAML")


def _is_block(v: Any) -> bool:
    """A literal block reads back exactly: printable lines (no tab, CR or other break), the first
    not indented, no whitespace-only line, at most one trailing newline."""
    if not isinstance(v, str) or isinstance(v, UserText) or "\n" not in v or v[:1].isspace() or v.endswith("\n\n"):
        return False
    return all(line.isprintable() and (line.strip() or not line) for line in v.split("\n"))


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
                for line in comment_text(v.comment):
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
        out.extend(f"# {line}".rstrip() for line in comment_text(header))
    _emit(obj, 0, out)
    return "\n".join(out) + "\n"
