"""The ``ue5m3`` command line: one verb per pipeline step, each a thin call into the library.

Every verb parses its arguments into a config, makes one library call and writes its declared outputs
atomically together with a provenance record. Run ``ue5m3 <verb> --help`` for each verb's options.
Progress and messages are logged to stderr in one format (:mod:`ue5m3.logs`); results go to stdout.

The help texts are plain text for a terminal: no reStructuredText markup, and they cite the paper's sections and
the shipped docs/ pages only (tests/test_cli.py checks every verb).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from ue5m3 import __version__, logs
from ue5m3.cli import analyses, evaluation, identification, training
from ue5m3.evaluation.extra import MissingExtra

__all__ = ["main", "build_parser"]

logger = logging.getLogger(__name__)

DESCRIPTION = (
    "The ue5m3 command line: one verb per pipeline step, each a thin call into the library that writes its "
    "declared outputs with a provenance record (UE5M3 FP4 block scaling, arXiv 2609.02846). Progress and messages "
    "go to stderr as '<time> <LEVEL> <logger>: <message>' lines (a progress bar on a terminal); results go to "
    "stdout. Run 'ue5m3 VERB --help' for a verb's options."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ue5m3", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        type=str.lower,
        choices=logs.LEVELS,
        default=None,
        help=f"what is logged to stderr (default: ${logs.LEVEL_ENV}, else info)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages too (--log-level debug)")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs: dict[str, Callable[[argparse.Namespace], int]] = {}
    for group in (analyses, training, evaluation, identification):
        group.add_verbs(sub, verbs)
    parser.set_defaults(_verbs=verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.verb == "lm-eval":
        args.lm_eval_args = rest[1:] if rest[:1] == ["--"] else rest  # `ue5m3 lm-eval -- --help`: lm-eval's help
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        logs.configure("debug" if args.verbose else args.log_level)
    except ValueError as err:  # only the environment variable can hold a bad level; --log-level has choices
        parser.error(f"{logs.LEVEL_ENV}={os.environ.get(logs.LEVEL_ENV)!r}: {err}")
    try:
        return args._verbs[args.verb](args)
    except (ValueError, TypeError, FileNotFoundError, MissingExtra) as err:
        logger.error(f"ue5m3 {args.verb}: error: {err}")
        return 2
    except OSError as err:  # the file system refused a write: name the path and the fix, no traceback
        from ue5m3.artifacts import StorageError, storage_error

        storage = err if isinstance(err, StorageError) else storage_error(err, err.filename or "a file", "writing")
        if storage is None:
            raise
        logger.error(f"ue5m3 {args.verb}: error: {storage}")
        return 74  # EX_IOERR
    except RuntimeError as err:  # hardware that is not here: fail closed with the reason, no traceback
        if type(err).__name__ not in ("OracleUnavailable", "NativeUnavailable"):
            raise
        logger.error(f"ue5m3 {args.verb}: unavailable here: {err}")
        return 3


if __name__ == "__main__":
    sys.exit(main())
