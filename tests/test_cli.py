"""The command line: every verb has --help, writes its outputs and reports bad input clearly; --version; help
texts are plain text citing only what ships; a training run's log file holds the loss of every logged step."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import ue5m3
from ue5m3 import cli

ROOT = Path(__file__).resolve().parents[1]


def _verbs():
    parser = cli.build_parser()
    return sorted(parser._subparsers._group_actions[0].choices)  # noqa: SLF001 - argparse has no public accessor


@pytest.mark.parametrize("verb", _verbs())
def test_every_verb_has_help(verb, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([verb, "--help"])
    assert exit_info.value.code == 0
    assert "usage: ue5m3 " + verb in capsys.readouterr().out


def test_range_analysis_verb_writes_its_declared_outputs(tmp_path):
    assert cli.main(["range-analysis", "--out-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "codebooks.csv",
        "formats.csv",
        "headroom.csv",
        "provenance.json",
        "summary.json",
        "worked_example.csv",
    ]


def test_bad_config_value_is_an_error_naming_the_key_and_the_value(capsys):
    assert cli.main(["range-analysis", "--config", '{"targets": [-5]}', "--out-dir", "x"]) == 2
    err = capsys.readouterr().err
    assert "--config (inline JSON)" in err and "targets" in err and "-5" in err


def test_stage_config_from_a_file_names_the_file_in_errors(tmp_path, capsys):
    path = tmp_path / "range.yaml"
    path.write_text("targets: [448]\ntargets: [2048]\n")
    assert cli.main(["range-analysis", "--config", str(path), "--out-dir", str(tmp_path / "out")]) == 2
    assert f"{path}: not valid YAML" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_python_dash_m_entry_point_runs():
    out = subprocess.run(
        [sys.executable, "-m", "ue5m3", "formats", "ue5m3"], capture_output=True, text=True, check=True
    )
    assert "61440" in out.stdout


def test_the_cli_spells_the_inference_policies_as_the_library_does():
    from ue5m3.cli import argtypes
    from ue5m3.evaluation.inference import InferencePolicy

    assert argtypes.POLICIES == tuple(p.value for p in InferencePolicy)


def test_prepare_data_in_parts_and_merge_data_write_the_bytes_of_one_prepare_data(tmp_path, capsys):
    import json
    from pathlib import Path

    from helpers.data import fixture_config

    def tree(root):
        files = sorted(p for p in Path(root).rglob("*") if p.is_file() and "parts" not in p.relative_to(root).parts)
        return {str(p.relative_to(root)): p.read_bytes() for p in files}

    one = fixture_config(tmp_path / "one").to_dict()
    assert cli.main(["prepare-data", "--config", json.dumps(one), "--out", str(tmp_path / "one.json")]) == 0
    tokenizer = str(tmp_path / "one" / "data" / "tokenizer.json")
    split = {**one, "tokenizer_path": tokenizer, "data_dir": str(tmp_path / "split"), "prepare_parts": 2}
    records = [str(tmp_path / f"part{part}.json") for part in range(2)]
    for part, record in enumerate(records):
        assert cli.main(["prepare-data", "--config", json.dumps(split), "--part", str(part), "--out", record]) == 0
    logged = capsys.readouterr().err  # each part logs what it reads, with documents/s and tokens/s per unit
    assert "part 1 of 2: 2 of the 4 input units" in logged and "documents/s" in logged and "tokens/s" in logged
    merge = ["merge-data", "--config", json.dumps(split), "--out", str(tmp_path / "prepared.json")]
    assert cli.main([*merge, records[0]]) == 2
    assert "error: part(s) [1] of 2 are missing" in capsys.readouterr().err
    assert cli.main([*merge, *records]) == 0
    expected = tree(tmp_path / "one" / "data")
    del expected["tokenizer.json"]
    assert tree(tmp_path / "split") == expected
    record = json.loads((tmp_path / "prepared.json").read_text())
    assert record["command"] == "merge-data" and record["parts"] == records
    assert record["validation_sha256"] == json.loads((tmp_path / "one.json").read_text())["validation_sha256"]


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"ue5m3 {ue5m3.__version__}\n"


def _help_texts():
    parser = cli.build_parser()
    yield "ue5m3", parser.format_help()
    for verb, sub in parser._subparsers._group_actions[0].choices.items():  # noqa: SLF001
        yield f"ue5m3 {verb}", sub.format_help()


RST_MARKUP = re.compile(r"`|:(func|class|mod|meth|attr|data|exc|obj|ref):")
# The spec documents are not shipped; help cites the paper's sections and docs/ pages instead.
UNSHIPPED_SPEC = re.compile(
    r"\b(numerics|experiments|gemm|pipeline|style)(\.md)? spec\b|\bspecs? (section|§)|spec/", re.I
)


@pytest.mark.parametrize(("command", "text"), list(_help_texts()), ids=[c for c, _ in _help_texts()])
def test_help_is_plain_text_and_cites_only_what_ships(command, text):
    assert not RST_MARKUP.search(text), f"{command} --help shows markup: {RST_MARKUP.search(text).group()!r}"
    assert not UNSHIPPED_SPEC.search(text), f"{command} --help cites an unshipped spec: {UNSHIPPED_SPEC.search(text)}"
    for page in re.findall(r"docs/[\w.-]+\.md", text):
        assert (ROOT / page).is_file(), f"{command} --help cites {page}, which does not exist"


def test_a_bad_log_level_in_the_environment_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("UE5M3_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["formats", "ue5m3"])
    assert exit_info.value.code == 2 and "UE5M3_LOG_LEVEL='loud'" in capsys.readouterr().err


def test_a_training_run_logged_to_a_file_holds_the_loss_of_every_logged_step(tmp_path):
    """The pipeline redirects ``ue5m3 train``'s stderr into train.log: no bar there, a plain line per logged step."""
    import json

    import yaml

    from helpers.data import fixture_config
    from ue5m3.data import build_data
    from ue5m3.training.config import OptimConfig, TrainConfig

    data = fixture_config(tmp_path, sequence_length=64, validation_windows=4, calibration_windows=2)
    build_data(data)
    cfg = TrainConfig(
        run_dir=str(tmp_path / "run"),
        model="dense_debug",
        model_overrides={"vocab_size": data.vocab_size},
        recipe="ue5m3_b16",
        seed=1,
        steps=5,
        micro_batch=1,
        accumulation=1,
        data=data.to_dict(),
        checkpoint_every=5,
        log_every=2,
        optim=OptimConfig(lr=3e-3),
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    log = tmp_path / "train.log"
    with log.open("w") as err:  # a file, not a terminal
        done = subprocess.run(
            [sys.executable, "-m", "ue5m3", "train", "--config", str(config), "--threads", "1"],
            stdout=err,
            stderr=err,
            check=False,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [2, 4, 5]
    for m in metrics:
        line = re.search(rf"^.* INFO ue5m3\.training\.loop: train: step {m['step']}/5, loss (\S+), .*$", text, re.M)
        assert line, f"no log line for step {m['step']}:\n{text}"
        assert float(line.group(1)) == pytest.approx(m["loss"], abs=5e-5)
        assert "grad_norm " in line.group() and "lr " in line.group() and "tokens/s " in line.group()
    assert "\r" not in text  # no progress-bar redraws
    # every line is a record in the one format (or the indented continuation of a multi-line one)
    record = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
    assert all(record.match(line) or line.startswith(" ") for line in text.splitlines() if line), text


EVAL_VERBS = [
    ["lm-eval", "--model", "ue5m3", "--tasks", "x"],
    ["evaluate-downstream", "--config", '{"tasks": ["arc_easy"]}', "--run-dir", "r", "--policy", "bf16"]
    + ["--tasks-dir", "t", "--out", "o.json"],
]


@pytest.mark.parametrize("argv", EVAL_VERBS, ids=lambda argv: argv[0])
def test_without_the_eval_extra_the_evaluation_verbs_name_it_and_exit_2(argv, monkeypatch, capsys, tmp_path):
    """lm-eval not installed (simulated: ``import lm_eval`` fails as for a missing module): one error line naming
    the module and the extra's install command, exit status 2, no traceback and no work done."""
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"ue5m3 {argv[0]}: error: ue5m3 {argv[0]} needs lm-eval (no module named 'lm_eval')" in err
    assert 'pip install "ue5m3[eval]"' in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_module_of_the_eval_extra_missing_inside_lm_evals_cli_names_the_extra(monkeypatch, capsys):
    """``ue5m3 lm-eval --model hf`` where lm-eval's HF backend cannot import accelerate (the extra carries it)."""
    import lm_eval.__main__

    def cli_evaluate():
        raise ModuleNotFoundError("No module named 'accelerate'", name="accelerate")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", cli_evaluate)
    assert cli.main(["lm-eval", "--model", "hf", "--tasks", "x"]) == 2
    err = capsys.readouterr().err
    assert "lm-eval's --model hf needs accelerate (no module named 'accelerate')" in err
    assert 'pip install "ue5m3[eval]"' in err


def test_a_module_outside_the_eval_extra_missing_inside_lm_evals_cli_is_not_blamed_on_it(monkeypatch):
    import lm_eval.__main__

    def cli_evaluate():
        raise ModuleNotFoundError("No module named 'langdetect'", name="langdetect")  # a task's own dependency

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", cli_evaluate)
    with pytest.raises(ModuleNotFoundError, match="langdetect"):
        cli.main(["lm-eval", "--model", "hf", "--tasks", "x"])
