"""argparse from the options schema, and the CLI's wording of the library's messages.

:func:`add_options` adds one argument group per schema table (flags, aliases, types, help with
the default) with ``default=SUPPRESS``: the namespace holds only the options given, and
:func:`values` hands them to :mod:`ftplan.api` by name, where the defaults live.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, Renderer
from ..options import FIT_OPTIONS, options_by_name
from ..optionspec import Option, parse_float, parse_int, parse_tokens

__all__ = ["Parser", "Command", "add_options", "values", "RENDERER", "flag_of", "emit_json", "arg_type"]


class Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        if len(message) > 300:  # argparse quotes the value: a 5000-digit argument is not a message
            message = message[:300] + "..."
        raise ConfigError(message, f"see `{self.prog} --help`")


@dataclass(frozen=True)
class Command:
    """One sub-command: help, arguments, and what runs (``run(args) -> exit code``)."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None


def arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type=`` from a parser that raises ValueError with the message to show."""
    def conv(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    conv.__name__ = getattr(parse, "__name__", "value")
    return conv


_PARSERS = {"int": arg_type(parse_int), "float": arg_type(parse_float), "tokens": arg_type(parse_tokens)}


def _help(o: Option) -> str:
    text = o.help
    if o.default is not None and o.default != () and o.type != "bool" and "default" not in text:
        d = ",".join(o.default) if isinstance(o.default, tuple) else o.default
        text = f"{text} (default: {d})" if text else f"default: {d}"
    return text.replace("%", "%%")


def add_options(p: argparse.ArgumentParser, table: tuple[Option, ...], title: str | None = None, *,
                required: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
    """Add the CLI options of ``table`` to ``p`` as the argument group ``title``."""
    g = p.add_argument_group(title or (table[0].group if table else None))
    for o in table:
        if not o.cli or o.name in skip:
            continue
        kw: dict[str, Any] = {"dest": o.name, "default": argparse.SUPPRESS, "help": _help(o)}
        if o.negatable:  # on by default: --flag / --no-flag
            kw["action"] = argparse.BooleanOptionalAction
        elif o.type == "bool":
            kw["action"] = "store_true"
        else:
            kw["type"] = _PARSERS.get(o.type, str)
            if o.metavar:
                kw["metavar"] = o.metavar
            if o.repeat:
                kw["action"] = "append"
        if o.name in required:
            kw["required"] = True
        g.add_argument(o.flag, *o.flags, **kw)


def values(a: argparse.Namespace, *tables: tuple[Option, ...]) -> dict[str, Any]:
    """The options of ``tables`` given on the command line (name -> value)."""
    return {o.name: getattr(a, o.name) for t in tables for o in t if o.cli and hasattr(a, o.name)}


def flag_of(name: str) -> str:
    """The CLI flag of an option or parameter name: ``seq_len`` -> ``--seq-len``."""
    opt = options_by_name().get(name) or options_by_name(FIT_OPTIONS).get(name)
    return opt.flag if opt is not None else "--" + name.replace("_", "-")


def _field(name: str, value: str | None) -> str:
    return flag_of(name) if value is None else f"{flag_of(name)} {value}"


#: the library's references as the command line says them: ``seq_len=4096`` -> ``--seq-len 4096``
RENDERER = Renderer(field=_field, command=lambda text: f"'{text}'")


def emit_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")
