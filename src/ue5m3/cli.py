"""The ``ue5m3`` command line: one verb per pipeline step, each a thin call into the library.

Every verb parses its arguments into a config, makes one library call and writes its declared outputs
atomically together with a provenance record. Run ``ue5m3 <verb> --help`` for each verb's options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["main", "build_parser"]


def _range_analysis(args: argparse.Namespace) -> int:
    from . import range_analysis

    config = range_analysis.RangeAnalysisConfig(
        targets=tuple(args.targets),
        example_reference=args.example_reference,
        example_targets=tuple(args.example_targets),
    )
    paths = range_analysis.run(config, args.out_dir)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _formats(args: argparse.Namespace) -> int:
    from . import formats

    names = args.names or sorted(formats.FORMATS)
    print(f"{'format':<18}{'bits':>5}{'max finite':>16}{'min normal':>14}{'min subnormal':>15}{'pos. codes':>11}")
    for name in names:
        f = formats.get(name)
        sub = "-" if f.min_subnormal is None else f"{f.min_subnormal:.4g}"
        print(
            f"{f.name:<18}{f.bits:>5}{f.max_finite:>16.6g}{f.min_normal:>14.4g}{sub:>15}{f.positive_finite_count:>11}"
        )
    return 0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ue5m3", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs: dict[str, Callable[[argparse.Namespace], int]] = {}

    p = sub.add_parser(
        "range-analysis",
        help="format facts, codebooks, stale-growth headroom and the worked scale-placement example",
        description="Write formats.csv, codebooks.csv, headroom.csv, worked_example.csv, summary.json and "
        "provenance.json (paper sections 4 and 5.2).",
    )
    p.add_argument(
        "--targets",
        type=_positive_float,
        nargs="+",
        default=[256, 448, 1024, 2048, 4096],
        help="tensor-scale targets T for the headroom table",
    )
    p.add_argument(
        "--example-reference", type=_positive_float, default=100.0, help="tensor reference amax g of the worked example"
    )
    p.add_argument(
        "--example-targets",
        type=_positive_float,
        nargs="+",
        default=[448, 2048],
        help="targets T of the worked example",
    )
    p.add_argument("--out-dir", required=True, help="directory for the tables")
    verbs["range-analysis"] = _range_analysis

    p = sub.add_parser(
        "formats",
        help="print the facts of the known number formats",
        description="Print max finite, min normal, min subnormal and positive finite codes.",
    )
    p.add_argument("names", nargs="*", help="format names (default: all)")
    verbs["formats"] = _formats

    parser.set_defaults(_verbs=verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args._verbs[args.verb](args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print(f"ue5m3 {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
