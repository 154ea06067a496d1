"""The ``ue5m3`` command line: one verb per pipeline step, each a thin call into the library.

Every verb parses its arguments into a config, makes one library call and writes its declared outputs
atomically together with a provenance record. Run ``ue5m3 <verb> --help`` for each verb's options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ue5m3.cli import analyses, evaluation, identification, training

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ue5m3", description=__doc__.split("\n\n")[0])
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
        return args._verbs[args.verb](args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"ue5m3 {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # hardware that is not here: fail closed with the reason, no traceback
        if type(err).__name__ not in ("OracleUnavailable", "NativeUnavailable"):
            raise
        print(f"ue5m3 {args.verb}: unavailable here: {err}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
