"""Where the pipeline's wall time goes: per rule, the jobs and the seconds they ran, from a Snakemake log.

    python benchmarks/dag_profile.py [LOG] [--top 12]

LOG is Snakemake's own log of one run (``.snakemake/log/<time>.snakemake.log``, the newest when omitted) or the
captured output of ``make reproduce``. Each job's time is from its start record (``rule X:`` / ``localrule X:`` with
its ``jobid``) to its ``Finished jobid`` record: wall seconds at Snakemake's one-second resolution, including the
job's interpreter start-up and imports. With ``--cores 2`` two jobs may run at once, so the job seconds add up to
more than the run's elapsed time; the table gives both. Prints a Markdown table (docs/performance.md holds one).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


@dataclass(frozen=True)
class Job:
    rule: str
    jobid: int
    seconds: float


def parse(text: str) -> tuple[list[Job], float]:
    """The finished jobs of a Snakemake log and the seconds from its first record to its last.

    Raises:
        ValueError: the text holds no timestamped job record (not a Snakemake log).
    """
    started: dict[int, tuple[str, datetime]] = {}
    jobs: list[Job] = []
    stamp: datetime | None = None
    first: datetime | None = None
    pending: str | None = None  # a rule whose start record's jobid is still to come
    for line in text.splitlines():
        if m := _STAMP.match(line):
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
            first = first or stamp
        elif (m := _START.match(line)) and stamp is not None:
            pending = m.group(1)
        elif (m := _JOBID.match(line)) and pending is not None and stamp is not None:
            started[int(m.group(1))] = (pending, stamp)
            pending = None
        elif (m := _FINISHED.match(line)) and stamp is not None:
            jobid = int(m.group(1))
            if jobid in started:
                rule, began = started.pop(jobid)
                jobs.append(Job(rule, jobid, (stamp - began).total_seconds()))
    if first is None or stamp is None:
        raise ValueError("no timestamped Snakemake records found: is this a Snakemake log?")
    return jobs, (stamp - first).total_seconds()


def table(jobs: list[Job], elapsed: float, top: int | None = None) -> str:
    """Markdown: one row per rule, slowest total first, then the totals."""
    by_rule: dict[str, list[float]] = defaultdict(list)
    for job in jobs:
        by_rule[job.rule].append(job.seconds)
    rows = sorted(by_rule.items(), key=lambda item: -sum(item[1]))
    total = sum(j.seconds for j in jobs)
    lines = ["| rule | jobs | job seconds | share | mean s | max s |", "|---|---|---|---|---|---|"]
    shown = rows if top is None else rows[:top]
    for rule, seconds in shown:
        share = sum(seconds) / total if total else 0.0
        lines.append(
            f"| `{rule}` | {len(seconds)} | {sum(seconds):,.0f} | {share:.0%} | "
            f"{sum(seconds) / len(seconds):.0f} | {max(seconds):.0f} |"
        )
    if len(shown) < len(rows):
        rest = [s for _, seconds in rows[len(shown) :] for s in seconds]
        lines.append(f"| {len(rows) - len(shown)} other rules | {len(rest)} | {sum(rest):,.0f} | "
                     f"{sum(rest) / total if total else 0:.0%} | | |")  # fmt: skip
    lines.append(f"| **all** | {len(jobs)} | {total:,.0f} | 100% | | |")
    return "\n".join(lines) + f"\n\nElapsed (first to last record): {elapsed / 60:.1f} min.\n"


def newest_log(root: Path = Path(".snakemake/log")) -> Path:
    logs = sorted(root.glob("*.snakemake.log"))
    if not logs:
        raise FileNotFoundError(f"no Snakemake log under {root}: run the pipeline first, or name a log")
    return logs[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", type=Path, help="a Snakemake log (default: the newest in .snakemake/log)")
    parser.add_argument("--top", type=int, default=None, help="rules shown before the rest are summed")
    args = parser.parse_args(argv)
    try:
        path = args.log or newest_log()
        jobs, elapsed = parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as error:
        print(f"dag_profile: {error}", file=sys.stderr)
        return 2
    print(table(jobs, elapsed, args.top), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
