"""Reading what users hand to ftplan without letting it crash or harm: one clear error instead.

Small, stdlib-only helpers shared by the catalogs, the export, ``train`` and the measurement side:

* :func:`check_text`: a user string that ends up in files (a model reference, a dataset name, a
  path) is a ``str`` of bounded length without control, format, surrogate or line/paragraph
  separator characters (a carriage return in ``--dataset`` must not become a line break in a
  YAML file, a bidi override must not hide text in a script);
* :func:`check_finite`: a number is a real, finite ``int``/``float`` (not a bool, not NaN or
  infinity) within bounds;
* :func:`read_text_file`: a bounded UTF-8 text file (a BOM is accepted and dropped), no NUL bytes;
* :func:`load_json_text`: JSON without ``NaN``/``Infinity`` and with bounded nesting;
* :func:`load_yaml_text`: YAML through PyYAML's safe loader, refusing anchors/aliases (so an
  "alias bomb" cannot expand) and deep nesting.

Every problem is raised as the error class the caller names (default ``ConfigError``).
"""

from __future__ import annotations

import json
import math
import os
import unicodedata
from pathlib import Path
from typing import Any

from .errors import ConfigError, FtplanError

__all__ = [
    "MAX_TEXT_CHARS",
    "MAX_FILE_BYTES",
    "MAX_NESTING",
    "bad_characters",
    "check_text",
    "check_finite",
    "show_value",
    "nesting_depth",
    "read_text_file",
    "load_json_text",
    "load_yaml_text",
]

#: longest user string (model reference, dataset name, path) ftplan accepts; 4096 is PATH_MAX on Linux
MAX_TEXT_CHARS = 4096
#: largest input file (config.json, plan JSON, matrix YAML) read whole into memory
MAX_FILE_BYTES = 64 * 2**20
#: deepest nesting of JSON/YAML containers accepted (real configs and plans nest < 10 levels)
MAX_NESTING = 64

#: Unicode general categories that never belong in a one-line name: controls (C0, DEL, C1),
#: format characters (bidi overrides, zero-width), surrogates, private use, unassigned, and the
#: line/paragraph separators (U+2028/U+2029, line breaks to YAML 1.1 and JavaScript)
_BAD_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def bad_characters(text: str) -> list[str]:
    """The distinct characters of ``text`` that are not allowed in a one-line name, as ``U+XXXX``."""
    seen: dict[str, None] = {}
    for ch in text:
        if ch.isprintable() and ch.isascii():
            continue
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            seen[f"U+{ord(ch):04X}"] = None
    return list(seen)


def check_text(value: Any, what: str, *, max_chars: int = MAX_TEXT_CHARS, allow_empty: bool = False,
               error: type[FtplanError] = ConfigError, field: str | None = None) -> str:
    """``value`` if it is a one-line string fit to be written into a file, else ``error``.

    Refused: non-strings, empty (unless ``allow_empty``) or longer than ``max_chars``, and any
    control/format/surrogate/separator character (:func:`bad_characters`).
    """
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {type(value).__name__}", f"pass {what} as text", field=field)
    if not value and not allow_empty:
        raise error(f"{what} is empty", f"pass a {what}", field=field)
    if len(value) > max_chars:
        raise error(f"{what} is {len(value):,} characters long (at most {max_chars:,})", f"pass a shorter {what}",
                    field=field)
    bad = bad_characters(value)
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise error(f"{what} contains control or invisible characters ({shown})",
                    "remove them: names, paths and dataset ids are plain one-line text", field=field)
    return value


def check_finite(value: Any, what: str, *, minimum: float | None = None, maximum: float | None = None,
                 exclusive_minimum: bool = False, integer: bool = False,
                 problems: list[str] | None = None) -> bool:
    """Check that ``value`` is a finite real number (an ``int`` when ``integer``) within bounds.

    With ``problems`` the message is appended there and False returned; without, a
    ``ConfigError`` is raised. Bools are refused (``True`` is not a count).
    """
    msg = None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"{what} must be {'an integer' if integer else 'a number'}, got {show_value(value)}"
    elif integer and not isinstance(value, int):
        msg = f"{what} must be an integer, got {show_value(value)}"
    elif isinstance(value, float) and not math.isfinite(value):
        msg = f"{what} must be a finite number, got {value!r}"
    elif minimum is not None and (value <= minimum if exclusive_minimum else value < minimum):
        msg = f"{what} must be {'>' if exclusive_minimum else '>='} {minimum:g}, got {_short(value)}"
    elif maximum is not None and value > maximum:
        msg = f"{what} must be <= {maximum:,}, got {_short(value)}"
    if msg is None:
        return True
    if problems is None:
        raise ConfigError(msg, "fix the value")
    problems.append(msg)
    return False


def _short(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**15:
        return f"{float(v):.3g}" if abs(v) < 10**300 else f"an integer of about {int(v.bit_length() * 0.30103)} digits"
    return f"{v:g}" if isinstance(v, float) else str(v)


def show_value(v: Any, n: int = 40) -> str:
    """A short, safe rendering of any value for an error message (huge ints, long strings...)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return _short(v)
    if isinstance(v, (list, tuple, dict, set)):
        return f"a {type(v).__name__} of {len(v)}"
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001 - a repr that fails must not hide the real error
        return f"a {type(v).__name__}"
    return text if len(text) <= n else text[:n] + "..."


def nesting_depth(obj: Any, limit: int = MAX_NESTING) -> int:
    """Depth of nested lists/dicts in ``obj`` (iterative; stops counting past ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((c, depth + 1) for c in children)
    return deepest


def read_text_file(path: str | os.PathLike, what: str, *, max_bytes: int = MAX_FILE_BYTES,
                   error: type[FtplanError] = ConfigError, hint: str | None = None) -> str:
    """The text of a UTF-8 file (a leading BOM dropped), or one-line ``error`` naming the problem.

    Refused: missing, not a regular file, larger than ``max_bytes``, not UTF-8, NUL bytes.
    """
    p = Path(path)
    try:
        st = p.stat()
        if not p.is_file():
            raise error(f"{what} {str(p)!r} is not a file", hint)
        if st.st_size > max_bytes:
            raise error(f"{what} {str(p)!r} is {st.st_size / 2**20:,.1f} MiB (at most {max_bytes / 2**20:,.0f} MiB)",
                        hint)
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"no such file: {str(p)!r} ({what})", hint) from None
    except (OSError, ValueError) as e:  # ValueError: embedded NUL in the path
        reason = getattr(e, "strerror", None) or str(e)
        raise error(f"cannot read {what} {str(p)[:200]!r}: {reason}", hint) from None
    if len(data) > max_bytes:
        raise error(f"{what} {str(p)!r} is larger than {max_bytes / 2**20:,.0f} MiB", hint)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(f"{what} {str(p)!r}: line {line}: not UTF-8 text (byte 0x{data[e.start]:02x})",
                    hint or "save the file as UTF-8") from None
    nul = text.find("\x00")
    if nul >= 0:
        raise error(f"{what} {str(p)!r}: line {text.count(chr(10), 0, nul) + 1}: NUL byte",
                    hint or "the file is binary or corrupted; pass a text file")
    return text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json_text(text: str, where: str, *, max_depth: int = MAX_NESTING,
                   error: type[FtplanError] = ConfigError, hint: str | None = None) -> Any:
    """``json.loads`` that refuses ``NaN``/``Infinity`` and nesting deeper than ``max_depth``."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise error(f"{where}: not JSON (line {e.lineno}: {e.msg})", hint) from None
    except ValueError as e:  # parse_constant
        raise error(f"{where}: not JSON ({e})", hint) from None
    except RecursionError:
        raise error(f"{where}: nested too deeply", hint) from None
    if nesting_depth(doc, max_depth) > max_depth:
        raise error(f"{where}: nested deeper than {max_depth} levels", hint)
    return doc


def load_yaml_text(text: str, where: str, *, max_depth: int = MAX_NESTING,
                   error: type[FtplanError] = ConfigError, hint: str | None = None) -> Any:
    """YAML through PyYAML's safe loader; anchors and aliases are refused (no "billion laughs")."""
    try:
        import yaml
    except ImportError:
        raise error(f"reading {where} needs PyYAML", "pip install pyyaml") from None
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise error(f"{where}: YAML anchors and aliases (& and *) are not accepted",
                            hint or "write the values out in full")
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{where}: {line}not valid YAML ({problem})", hint) from None
    except RecursionError:
        raise error(f"{where}: nested too deeply", hint) from None
    if nesting_depth(doc, max_depth) > max_depth:
        raise error(f"{where}: nested deeper than {max_depth} levels", hint)
    return doc

