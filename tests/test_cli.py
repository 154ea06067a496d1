"""The command line: every verb has --help, writes its outputs and reports bad input clearly."""

import subprocess
import sys

import pytest

from ue5m3 import cli


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
