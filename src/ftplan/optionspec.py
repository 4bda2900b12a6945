"""The machinery of ftplan's options schema: :class:`Option` and the field helpers.

An option is declared once, where its value lives: on a field of :class:`ftplan.job.Job` /
:class:`ftplan.job.Layout` (``micro_batch: int = option(1, minimum=1, flags=("--batch-size",),
help=...)``) or in a table of :mod:`ftplan.options` (search and offer options). Everything else is
derived from the declaration: the CLI flags (``--micro-batch``), the web request fields
(``micro_batch``), the keyword arguments of :mod:`ftplan.api`, the JSON (de)serializers of jobs and
layouts, the bounds and choices checked by :func:`ftplan.job.validate_job`, and the defaults the web
page shows (``GET /api/options``).

Stdlib only; nothing here knows about argparse, pydantic or the web.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import Problem, did_you_mean
from .inputs import show_value

__all__ = [
    "Option",
    "option",
    "json_field",
    "internal",
    "group",
    "walk",
    "options_of",
    "groups",
    "TYPES",
    "parse_tokens",
    "parse_int",
    "parse_float",
    "sorted_names",
    "lower",
]

#: option value types: how text (a flag, a form field) becomes a value
TYPES = ("int", "float", "bool", "str", "names", "tokens", "paths")

_META = "ftplan"  # dataclasses field metadata key


@dataclass(frozen=True)
class Option:
    """One option: its name everywhere, type, default, choices, bounds, help and where it maps.

    ``name`` is the option's name in the web request, the API keyword and (dashed) the CLI flag
    ``--name``; ``flags`` are extra CLI aliases. ``attr`` is the attribute path on the object the
    option configures (``"lora.r"`` on a Job); ``json`` says when it is in job/layout JSON:
    ``"always"``, ``"data"`` (only where a document describes the training data) or ``"never"``.
    ``cli`` / ``web``: whether it is a command-line flag / a web request field (a json-only or
    internal field is neither). ``invert``: a bool option that is the negation of its attribute
    (``no_double_quant`` -> ``quant.double_quant``). ``auto``: ``(model, obj) -> value`` for an
    option whose default depends on the model or on other options (the declared ``default`` is
    then None = "auto" in the CLI and the web). Bounds (``minimum`` ...) are checked by the library;
    ``web_max`` only caps web requests.
    """

    name: str = ""
    type: str = "str"
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] | None = None
    group: str = "job"
    attr: str | None = None
    label: str | None = None  # words for messages ("sequence length"); default: the name
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    exclusive_maximum: float | None = None
    web_max: float | None = None
    example: Any = None  # for the web page / docs: '20M'
    invert: bool = False
    auto: Callable[[Any, Any], Any] | None = None
    normalize: Callable[[Any], Any] | None = None
    json: str = "always"
    cli: bool = True
    web: bool = True
    repeat: bool = False  # CLI: the flag may be given several times (paths)

    # ---- names ----
    @property
    def flag(self) -> str:
        """The primary CLI flag: ``--seq-len`` for ``seq_len``."""
        return "--" + self.name.replace("_", "-")

    @property
    def negatable(self) -> bool:
        """A bool option that is on by default: the CLI also has ``--no-<flag>`` for each flag."""
        return self.type == "bool" and self.default is True and not self.invert

    @property
    def all_flags(self) -> tuple[str, ...]:
        """Every CLI flag of the option: the primary one, the aliases and, for a bool option that is
        on by default, their ``--no-`` forms (``--no-gradient-checkpointing``, ``--no-gc``)."""
        out = (self.flag, *self.flags)
        return out + tuple("--no-" + f[2:] for f in out) if self.negatable else out

    @property
    def words(self) -> str:
        return self.label or self.name.replace("_", " ")

    @property
    def is_option(self) -> bool:
        """A user-facing option (a CLI flag or a web field), not a json-only/internal field."""
        return self.cli or self.web

    # ---- values ----
    def coerce(self, value: Any) -> Any:
        """A value given by a program or parsed from text -> the option's type; ValueError if not."""
        if value is None:
            return None
        t = self.type
        if t == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, (int, float)) and value in (0, 1):
                return bool(value)
            if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
                return _BOOL_WORDS[value.strip().lower()]
            raise ValueError(f"expected true or false, got {show_value(value)}")
        if t == "int":
            if isinstance(value, bool):
                raise ValueError(f"expected an integer, got {show_value(value)}")
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str):
                return parse_int(value)
            raise ValueError(f"expected an integer, got {show_value(value)}")
        if t == "float":
            if isinstance(value, bool):
                raise ValueError(f"expected a number, got {show_value(value)}")
            if isinstance(value, (int, float)):
                try:
                    return float(value)
                except OverflowError:  # an int beyond float range
                    raise ValueError(f"expected a number, got {show_value(value)}") from None
            if isinstance(value, str):
                return parse_float(value)
            raise ValueError(f"expected a number, got {show_value(value)}")
        if t == "tokens":
            if isinstance(value, bool):
                raise ValueError(f"expected a token count like 50M or 2B, got {show_value(value)}")
            if isinstance(value, int):
                return value
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, str):
                return parse_tokens(value) if value.strip() else None
            raise ValueError(f"expected a token count like 50M or 2B, got {show_value(value)}")
        if t in ("names", "paths"):
            if isinstance(value, str):
                value = value.split(",") if t == "names" else [value]
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
                raise ValueError("expected a comma-separated string or a list of strings")
            out = tuple(x.strip() for x in value if x.strip())
            return self.normalize(out) if self.normalize else out
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {show_value(value)}")
        if self.normalize:
            return self.normalize(value)
        return lower(value) if self.choices is not None else value

    def check(self, value: Any) -> list[Problem]:
        """Problems of a (coerced) value against the choices and bounds (None = unset: fine)."""
        if value is None:
            return []
        if self.choices is not None:
            values = value if isinstance(value, tuple) else (value,)
            for v in values:
                if v not in self.choices:
                    hint = did_you_mean(str(v), self.choices) or f"use one of {', '.join(self.choices)}"
                    return [Problem(self.name, f"unknown {self.words} {v!r}", hint)]
            return []
        if self.type not in ("int", "float", "tokens"):
            return []
        hint = f"e.g. `{self.name}={self.example}`" if self.example is not None else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [Problem(self.name, f"{self.words} must be a number (got {show_value(value)})", hint)]
        if isinstance(value, float) and not math.isfinite(value):
            return [Problem(self.name, f"{self.words} must be a finite number (got {value})", hint)]
        lo, lo_x, hi, hi_x = self.minimum, self.exclusive_minimum, self.maximum, self.exclusive_maximum
        low_ok = (lo is None or value >= lo) and (lo_x is None or value > lo_x)
        ok = low_ok and (hi is None or value <= hi) and (hi_x is None or value < hi_x)
        if ok:
            return []
        # below the minimum: say the minimum (the upper bound may be a sanity limit nobody thinks of)
        bounds = self.bounds_text(lower_only=not low_ok)
        return [Problem(self.name, f"{self.words} must be {bounds} (got {show_value(value)})", hint)]

    def bounds_text(self, lower_only: bool = False) -> str:
        lo = self.minimum if self.minimum is not None else self.exclusive_minimum
        hi = None if lower_only else (self.maximum if self.maximum is not None else self.exclusive_maximum)
        if lo is not None and hi is not None:
            return (f"in {'[' if self.minimum is not None else '('}{_num(lo)}, {_num(hi)}"
                    f"{']' if self.maximum is not None else ')'}")
        if lo is not None:
            return f"{'>=' if self.minimum is not None else '>'} {_num(lo)}"
        if hi is not None:
            return f"{'<=' if self.maximum is not None else '<'} {_num(hi)}"
        return "valid"

    def public(self) -> dict[str, Any]:
        """The option as JSON (``GET /api/options``, docs)."""
        d: dict[str, Any] = {"name": self.name, "type": self.type, "group": self.group,
                             "default": list(self.default) if isinstance(self.default, tuple) else self.default,
                             "help": self.help, "flag": self.flag, "aliases": list(self.flags)}
        for k in ("choices", "minimum", "exclusive_minimum", "maximum", "exclusive_maximum", "example"):
            v = getattr(self, k)
            if v is not None:
                d[k] = list(v) if isinstance(v, tuple) else v
        if self.attr:
            d["attr"] = self.attr
        d["auto"] = self.auto is not None
        return d


_BOOL_WORDS = {"1": True, "true": True, "yes": True, "y": True, "on": True,
               "0": False, "false": False, "no": False, "n": False, "off": False}


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}"


# ---------------------------------------------------------------------------------------------
# declaring fields
# ---------------------------------------------------------------------------------------------
def _type_of(default: Any) -> str:
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, tuple):
        return "names"
    return "str"


def option(default: Any, *, type: str | None = None, **spec: Any) -> Any:
    """A dataclass field that is a user-facing option (see :class:`Option` for ``spec``)."""
    # with ``auto`` the CLI/web default is None ("auto"); the dataclass keeps ``default``
    # an inverted bool option (no_double_quant) defaults to the negation of its attribute
    declared = None if spec.get("auto") is not None else (not default if spec.get("invert") else default)
    opt = Option(type=type or _type_of(default), default=declared, **spec)
    return dataclasses.field(default=default, metadata={_META: opt})


def json_field(default: Any, **spec: Any) -> Any:
    """A dataclass field written to and read from JSON, but not a CLI/web option."""
    opt = Option(type=_type_of(default), default=default, cli=False, web=False, **spec)
    return dataclasses.field(default=default, metadata={_META: opt})


def internal(default: Any, **spec: Any) -> Any:
    """A dataclass field that is neither an option nor in plan JSON (records keep every field)."""
    opt = Option(type=_type_of(default), default=default, cli=False, web=False, json="never", **spec)
    return dataclasses.field(default=default, metadata={_META: opt})


@dataclass(frozen=True)
class _Group:
    """Metadata of a nested dataclass field (``Job.lora``): in JSON only when ``when`` is true."""

    when: str | None = None


def group(factory: type, *, when: str | None = None) -> Any:
    """A nested dataclass field (``lora: LoraSpec = group(LoraSpec, when="uses_lora")``): its
    options are options of the outer class; in JSON it is an object, present when the outer
    object's attribute ``when`` is true."""
    return dataclasses.field(default_factory=factory, metadata={_META: _Group(when)})


def walk(cls: type, prefix: str = "", group_name: str = "job") -> Iterator[Option]:
    """Every field's :class:`Option` of dataclass ``cls`` (nested groups flattened), with
    ``name`` (the field name unless declared), ``attr`` (the dotted path) and ``group`` set.
    A field without ftplan metadata raises TypeError: every field says what it is."""
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        path = prefix + f.name
        if isinstance(meta, _Group):
            yield from walk(f.default_factory, path + ".", group_name)  # type: ignore[arg-type]
        elif isinstance(meta, Option):
            yield dataclasses.replace(meta, name=meta.name or f.name, attr=path, group=group_name)
        else:
            raise TypeError(f"{cls.__name__}.{f.name} has no option metadata: declare it with "
                            "option(...), json_field(...) or internal(...) (see docs/extending.md)")


@functools.lru_cache(maxsize=None)
def options_of(cls: type, group_name: str = "job") -> tuple[Option, ...]:
    """``tuple(walk(cls, group_name=...))``, computed once per class (validation runs it per job)."""
    return tuple(walk(cls, group_name=group_name))


@functools.lru_cache(maxsize=None)
def groups(cls: type) -> dict[str, tuple[type, str | None]]:
    """Nested group fields of ``cls``: name -> (dataclass, when). Cached: do not modify."""
    out = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if isinstance(meta, _Group):
            out[f.name] = (f.default_factory, meta.when)
    return out


# ---------------------------------------------------------------------------------------------
# parsing text
# ---------------------------------------------------------------------------------------------
def parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:  # also: more digits than Python converts (4300)
        raise ValueError(f"expected an integer, got {show_value(text)}") from None


def parse_float(text: str) -> float:
    try:
        x = float(text.strip().lstrip("$").replace(",", ""))
    except ValueError:
        raise ValueError(f"expected a number, got {show_value(text)}") from None
    if not math.isfinite(x):  # 'inf', 'nan', '1e400'
        raise ValueError(f"expected a finite number, got {show_value(text)}")
    return x


def parse_tokens(text: str) -> int:
    """'50M', '1.5B', '200k', '123456' -> tokens."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
    try:
        x = float(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else float(t)
        if not math.isfinite(x):  # inf, nan, 1e400: not a count (int() would raise OverflowError)
            raise ValueError
        return int(x)
    except ValueError:
        raise ValueError(f"expected a token count like 50M or 2B, got {show_value(text)}") from None


def lower(text: str) -> str:
    return text.strip().lower()


def sorted_names(names: Sequence[str]) -> tuple[str, ...] | None:
    """Names as a set: lower-case, unique, sorted; none -> None (= any)."""
    out = tuple(sorted({n.lower() for n in names}))
    return out or None


def coerce_values(options: Mapping[str, Option], values: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """(coerced values, problems) of ``values`` keyed by option name; unknown names are problems."""
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for k, v in values.items():
        opt = options.get(k)
        if opt is None:
            hint = did_you_mean(k, options) or "see the option list (`ftplan estimate --help`)"
            problems.append(Problem(k, f"unknown option {k!r}", hint))
            continue
        try:
            out[k] = opt.coerce(v)
        except ValueError as e:
            problems.append(Problem(k, f"{opt.words}: {e}"))
    return out, problems
