"""The ``fastload`` command line: ``main(argv) -> int``.

Every :class:`~fastload.errors.FastloadError` becomes one readable line on stderr
and exit code 2 (``--debug`` shows the traceback). Ctrl-C exits with 130.

Each subcommand lives in its own ``_add_<name>(sub)`` function that registers the
parser and sets ``func`` to a handler ``(args) -> int``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from . import __version__
from .errors import FastloadError

log = logging.getLogger("fastload")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{self.prog}: {message}")


class _UsageError(Exception):
    pass


# ----------------------------------------------------------------------------- subcommands
# (pack / inspect / verify, bench / doctor are registered below; keep one function each)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastload", description="Feed the GPU: pack image folders into LMDB shards, load them with DALI.")
    p.add_argument("--version", action="version", version=f"fastload {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in _COMMANDS:
        add(sub)
    return p


_COMMANDS: list = []


def _setup_logging(debug: bool, quiet: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    root = logging.getLogger("fastload")
    if not root.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(h)
    root.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        _setup_logging(args.debug, args.quiet)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except _UsageError as e:
        print(f"{e} (see fastload --help)", file=sys.stderr)
        return 2
    except FastloadError as e:
        if debug:
            raise
        print(f"fastload: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fastload: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if debug:
            raise
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"fastload: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


def main_entry() -> None:
    """Console-script entry point."""
    sys.exit(main())
