"""benchmarks/dag_profile.py: per-rule jobs and seconds from a Snakemake log, checked on a log written by hand."""

import pytest

from helpers.benchmark_scripts import load_benchmark

dag_profile = load_benchmark("dag_profile")

LOG = """\
Building DAG of jobs...
[Thu Dec  3 17:59:14 2026]
localrule train_config:
    output: results/train/main/a/seed1/config.yaml
    jobid: 32
    reason: Missing output files
[Thu Dec  3 17:59:14 2026]
rule evaluate_nll:
    output: results/eval/nll/a.json
    jobid: 7
[Thu Dec  3 17:59:19 2026]
Finished jobid: 32 (Rule: train_config)
1 of 3 steps (33%) done
[Thu Dec  3 17:59:20 2026]
checkpoint plan:
    jobid: 9
[Thu Dec  3 18:00:04 2026]
Finished jobid: 7 (Rule: evaluate_nll)
[Thu Dec  3 18:00:30 2026]
Finished jobid: 9 (Rule: plan)
3 of 3 steps (100%) done
"""


def test_each_job_runs_from_its_start_record_to_its_finished_record():
    jobs, elapsed = dag_profile.parse(LOG)
    assert {(j.rule, j.jobid, j.seconds) for j in jobs} == {
        ("train_config", 32, 5.0),
        ("evaluate_nll", 7, 50.0),
        ("plan", 9, 70.0),
    }
    assert elapsed == 76.0


def test_the_table_sorts_rules_by_their_total_and_sums_the_rest():
    jobs, elapsed = dag_profile.parse(LOG)
    text = dag_profile.table(jobs, elapsed, top=2)
    rows = [line for line in text.splitlines() if line.startswith("| `") or "other rules" in line]
    assert rows[0].startswith("| `plan` | 1 | 70 |") and rows[1].startswith("| `evaluate_nll` | 1 | 50 |")
    assert rows[2].startswith("| 1 other rules | 1 | 5 |")
    assert "| **all** | 3 | 125 | 100% |" in text and "Elapsed (first to last record): 1.3 min." in text


def test_a_file_that_is_not_a_snakemake_log_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="Snakemake log"):
        dag_profile.parse("just text\n")
    other = tmp_path / "notes.txt"
    other.write_text("nothing here\n")
    assert dag_profile.main([str(other)]) == 2
    assert "is this a Snakemake log" in capsys.readouterr().err
