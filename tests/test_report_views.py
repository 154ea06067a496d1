"""The report's views of figures and tables (ue5m3.report): PNG pages of PDFs, HTML pages of CSVs that read like a
paper's tables (the verdict first, the paper's recipe labels, rounded numbers), the same bytes for the same input."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from ue5m3 import plotting, report


def _table(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return path


def test_a_table_shows_its_verdict_first_labels_and_rounded_numbers(tmp_path):
    table = _table(
        tmp_path, "recipe,ours,steps,verdict\nue5m3_b16,6.177123456,30000,reproduced\nnew_recipe,1e-07,5,x\n"
    )
    page = report.csv_to_html(table, tmp_path / "t.html").read_text()
    header = page[page.index("<tr>") : page.index("</tr>")]
    assert header.index("verdict") < header.index("recipe") < header.index("ours")
    assert "<td>UE5M3 B16 (proposed)</td>" in page and "<td>new_recipe</td>" in page  # unknown: its own name
    assert "<td>6.177</td>" in page and "<td>30,000</td>" in page and "<td>1e-07</td>" in page
    assert "6.177123456" not in page


def test_the_same_table_gives_the_same_bytes(tmp_path):
    table = _table(tmp_path, "a,b\n1,2.5\n")
    first = report.csv_to_html(table, tmp_path / "1.html").read_bytes()
    assert report.csv_to_html(table, tmp_path / "2.html").read_bytes() == first


def test_a_figure_renders_to_a_png_of_its_first_page(tmp_path):
    plotting.apply_style()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    pdf = plotting.save_figure(fig, tmp_path / "f.pdf")
    plt.close(fig)
    png = report.render(pdf, tmp_path / "f.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.render(pdf, tmp_path / "g.png").read_bytes() == png.read_bytes()


@pytest.mark.parametrize(("source", "out"), [("f.pdf", "f.html"), ("t.csv", "t.png"), ("f.svg", "f.png")])
def test_unsupported_pairs_are_refused_naming_both(tmp_path, source, out):
    with pytest.raises(ValueError, match=rf"{source} as .*{out}"):
        report.render(tmp_path / source, tmp_path / out)


def test_a_missing_source_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        report.render(tmp_path / "missing.csv", tmp_path / "x.html")
