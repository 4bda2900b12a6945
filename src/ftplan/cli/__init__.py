"""The ``ftplan`` command line: thin layers over :mod:`ftplan.api`.

The commands are a table (:data:`COMMANDS`): each lives in a module of this package
(``catalog``: models, gpus, offers; ``plan``: estimate, recommend, compare, fit; ``measure``:
measure, validate; ``export``; ``train``; ``web``: serve) that declares its arguments and a
``run(args) -> exit code``. Job, layout, search and offer flags come from the options schema
(:mod:`ftplan.cli.options`, :mod:`ftplan.options`).

Every expected failure (bad option, unknown name, malformed file) is printed as one line,
``ftplan: error: <what> (<how to fix>)``, with exit code 2; the library's messages name options
(```seq_len```), printed here as flags (``--seq-len``). Set ``FTPLAN_DEBUG=1`` for tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from ..errors import FtplanError
from .options import RENDERER, Parser

__all__ = ["main", "build_parser", "COMMANDS", "EXIT_USAGE"]

EXIT_USAGE = 2

#: the commands in the order ``ftplan --help`` lists them: name -> module of ftplan.cli
COMMANDS: tuple[tuple[str, str], ...] = (
    ("models", "catalog"),
    ("estimate", "plan"),
    ("recommend", "plan"),
    ("compare", "plan"),
    ("fit", "plan"),
    ("gpus", "catalog"),
    ("offers", "catalog"),
    ("measure", "measure"),
    ("validate", "measure"),
    ("export", "export"),
    ("train", "train"),
    ("serve", "web"),
    ("claims", "catalog"),
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ftplan", description="Plan LLM fine-tuning jobs: memory, time, cost.")
    p.add_argument("--version", action="version", version=f"ftplan {__import__('ftplan').__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module in COMMANDS:
        cmd = importlib.import_module(f"{__name__}.{module}").COMMANDS[name]
        s = sub.add_parser(name, help=cmd.help, description=cmd.description)
        cmd.configure(s)
        s.set_defaults(func=cmd.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        return int(args.func(args) or 0)
    except FtplanError as e:
        print(f"ftplan: error: {e.one_line(RENDERER)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ftplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: still one line, unless debugging
        if os.environ.get("FTPLAN_DEBUG"):
            raise
        print(f"ftplan: internal error: {type(e).__name__}: {e} (set FTPLAN_DEBUG=1 for a traceback "
              "and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
