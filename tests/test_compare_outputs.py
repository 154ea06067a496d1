"""benchmarks/compare_outputs.py: two checkouts' outputs compared byte for byte, on folders written here."""

import pytest

from helpers.benchmark_scripts import load_benchmark

compare_outputs = load_benchmark("compare_outputs")


def _checkout(root, files):
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_the_same_bytes_pass_and_json_provenance_is_left_out(tmp_path, capsys):
    files = {"figures/a.pdf": b"%PDF a", "results/report/t.csv": b"x,y\n1,2\n"}
    a = _checkout(tmp_path / "a", {**files, "results/report/provenance.json": b'{"commit": "1"}'})
    b = _checkout(tmp_path / "b", {**files, "results/report/provenance.json": b'{"commit": "2"}'})
    assert compare_outputs.main([str(a), str(b)]) == 0
    assert "2 files the same bytes; 0 differ" in capsys.readouterr().out


def test_one_changed_byte_and_a_missing_file_fail_and_are_named(tmp_path, capsys):
    a = _checkout(tmp_path / "a", {"figures/a.pdf": b"%PDF a", "figures/b.png": b"png", "results/report/t.csv": b"1"})
    b = _checkout(tmp_path / "b", {"figures/a.pdf": b"%PDF b", "results/report/t.csv": b"1"})
    assert compare_outputs.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "1 files the same bytes; 1 differ; 1 only in" in out
    assert "differ: figures/a.pdf" in out and "figures/b.png" in out


def test_a_checkout_without_outputs_is_refused_by_name(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty.*make reproduce"):
        compare_outputs.digests(tmp_path / "empty", ["figures"], ["pdf"])
