"""Whether two checkouts' pipeline runs made the same outputs: byte for byte, file by file.

    python benchmarks/compare_outputs.py CHECKOUT_A CHECKOUT_B [--under figures results/report] [--ext csv pdf ...]

Each checkout is a repository root after ``make reproduce``. Every file with one of the extensions under the given
folders (relative to the root) is hashed with SHA-256 on both sides; the comparison prints how many files are the
same, which differ and which exist on one side only, and exits 1 unless every file is on both sides with the same
bytes. A refactor that claims to change no result is checked this way (docs/performance.md records the run).
Provenance files (``provenance.json``) hold the commit and source hash, which a refactor changes by construction,
so JSON is not compared unless asked for.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

DEFAULT_UNDER = ("figures", "results/report")
DEFAULT_EXTENSIONS = ("csv", "pdf", "png", "html")


def digests(root: Path, under: list[str], extensions: list[str]) -> dict[str, str]:
    """SHA-256 of every file with one of ``extensions`` below ``root / u`` for each ``u`` in ``under``, keyed by the
    path relative to ``root``.

    Raises:
        FileNotFoundError: none of the folders exists under ``root`` (not a checkout after a run).
    """
    folders = [root / u for u in under]
    if not any(f.is_dir() for f in folders):
        raise FileNotFoundError(f"{root}: none of {under} exists (run `make reproduce` there first)")
    suffixes = {"." + e.lstrip(".") for e in extensions}
    out: dict[str, str] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in suffixes:
                out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def compare(a: dict[str, str], b: dict[str, str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """(same, different, only in a, only in b), each sorted."""
    same = sorted(k for k in a.keys() & b.keys() if a[k] == b[k])
    different = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    return same, different, sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--under", nargs="+", default=list(DEFAULT_UNDER))
    parser.add_argument("--ext", nargs="+", default=list(DEFAULT_EXTENSIONS))
    args = parser.parse_args(argv)
    a = digests(args.a, args.under, args.ext)
    b = digests(args.b, args.under, args.ext)
    same, different, only_a, only_b = compare(a, b)
    print(
        f"{len(same)} files the same bytes; {len(different)} differ; {len(only_a)} only in {args.a}; "
        f"{len(only_b)} only in {args.b}"
    )
    for title, names in (("differ", different), (f"only in {args.a}", only_a), (f"only in {args.b}", only_b)):
        for name in names:
            print(f"  {title}: {name}")
    return 0 if not (different or only_a or only_b) else 1


if __name__ == "__main__":
    sys.exit(main())
