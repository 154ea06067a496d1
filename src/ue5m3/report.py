"""Report items: the figures and tables of the Snakemake report in forms a browser shows inline.

The pipeline's figures are PDFs (vector, for the paper) and its comparisons CSV files. A browser's report page
shows neither inline: an embedded PDF needs a viewer plugin that headless browsers lack, and a CSV file is offered
as a download. :func:`render` turns a figure PDF into a PNG (its first page, rasterised by PDFium at a fixed
resolution) and a CSV table into a small self-contained HTML table; the notebook that draws a figure writes its view
too (:func:`ue5m3.plotting.save_figure`), and the rule marks it with ``report()`` and the figure's caption from
:mod:`ue5m3.figures`. Both outputs are written atomically and are the same bytes for the same input.
"""

from __future__ import annotations

import csv
import html
import os
from pathlib import Path

from ue5m3 import stages
from ue5m3.artifacts import atomic_path

__all__ = ["render", "pdf_to_png", "csv_to_html", "claims_section", "DPI"]

DPI = 110  # readable on a laptop screen at the figures' 6-7 inch widths


def pdf_to_png(pdf: str | os.PathLike[str], png: str | os.PathLike[str], *, dpi: int = DPI) -> Path:
    """Rasterise the first page of ``pdf`` to ``png`` on a white background."""
    import pypdfium2  # noqa: PLC0415 - a pipeline dependency, only needed here

    pdf, png = Path(pdf), Path(png)
    document = pypdfium2.PdfDocument(pdf)
    try:
        if len(document) == 0:
            raise ValueError(f"{pdf} has no pages")
        image = document[0].render(scale=dpi / 72, fill_color=(255, 255, 255, 255)).to_pil()
    finally:
        document.close()
    with atomic_path(png) as tmp:
        image.convert("RGB").save(tmp, format="PNG", optimize=False)  # no text chunks: stable bytes
    return png


VERDICT_COLUMNS = ("verdict", "agrees")
"""Columns that say what a comparison concluded: shown first."""
LABEL_COLUMNS = ("recipe", "config", "configuration")
"""Columns holding recipe names: shown as the paper's labels (:func:`ue5m3.stages.label`)."""
SIGNIFICANT = 4


def display_value(column: str, text: str) -> str:
    """A table cell as a reader should see it: recipes by their labels, floats to 4 significant digits (integers
    with thousands separators), everything else as written."""
    if column in LABEL_COLUMNS:
        return stages.label(text)
    try:
        number = float(text)
    except ValueError:
        return text
    if text.strip().lstrip("-").isdigit():
        return f"{int(text):,}"
    if number != number or number in (float("inf"), float("-inf")):
        return text
    return f"{number:,.0f}" if abs(number) >= 10**SIGNIFICANT else f"{number:.{SIGNIFICANT}g}"


def csv_to_html(table: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write ``table`` (CSV with a header row) as one HTML page holding the table and its file name: the verdict
    first, recipes by their labels, numbers rounded for reading (the CSV keeps every digit)."""
    table, out = Path(table), Path(out)
    with table.open(newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        raise ValueError(f"{table} is empty (no header row)")
    header, body = rows[0], rows[1:]
    order = [i for i, name in enumerate(header) if name in VERDICT_COLUMNS]
    order += [i for i in range(len(header)) if i not in order]
    cells = "".join(f"<th>{html.escape(header[i])}</th>" for i in order)
    lines = [f"<tr>{cells}</tr>"]
    for row in body:
        shown = (display_value(header[i], row[i]) if i < len(row) else "" for i in order)
        lines.append("<tr>" + "".join(f"<td>{html.escape(value)}</td>" for value in shown) + "</tr>")
    page = (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>"
        f"{html.escape(table.name)}</title><style>"
        "body{font-family:sans-serif;font-size:13px;margin:8px}table{border-collapse:collapse}"
        "th,td{border:1px solid #bbb;padding:3px 6px;text-align:left;vertical-align:top}th{background:#eee}"
        "td{max-width:28em}"
        "</style></head><body>"
        f"<p><b>{html.escape(table.name)}</b> ({len(body)} rows; numbers to {SIGNIFICANT} significant digits, every "
        "digit in the CSV)</p><table>\n" + "\n".join(lines) + "\n</table></body></html>\n"
    )
    with atomic_path(out) as tmp:
        tmp.write_text(page)
    return out


def render(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """A figure (``.pdf`` -> ``.png``) or a table (``.csv`` -> ``.html``) for the report, by suffix."""
    source, out = Path(source), Path(out)
    kinds = {(".pdf", ".png"): pdf_to_png, (".csv", ".html"): csv_to_html}
    convert = kinds.get((source.suffix.lower(), out.suffix.lower()))
    if convert is None:
        raise ValueError(f"cannot render {source} as {out}: supported are .pdf -> .png and .csv -> .html")
    if not source.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    return convert(source, out)


CLAIMS_SHOWN = ("verdict", "statement", "paper_section", "scale", "effect", "interval_low", "interval_high", "mde",
                "paper_effect")  # fmt: skip


def _rst_cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "/") or "-"


SAFE_CENTERING = """.. raw:: html

   <style>
   /* Snakemake's report centres each page in a flex box of the window's height; a front page taller or wider than
      the window (the claims table) would lose its top and left, beyond the scrollbars' reach. "safe" centres what
      fits and starts at the edge what does not */
   div.h-screen.items-center.justify-center { align-items: safe center; justify-content: safe center; }
   /* the claims table in a column of its own width, scrolling sideways there, not under the workflow graph */
   div.prose:has(#the-paper-s-claims) { max-width: 56rem; }
   #the-paper-s-claims table.docutils { display: block; overflow-x: auto; }
   #the-paper-s-claims td:nth-child(2) { min-width: 20rem; }
   </style>

"""
"""Raw HTML the front page carries (docutils' raw directive, which Snakemake's report renders): the report's own page
layout, made to scroll to the claims table's first row and column."""


def claims_section(claims_csv: str | os.PathLike[str]) -> str:
    """The report front page's section of the paper's claims: a reStructuredText list-table of ``claims.csv``
    (verdict first, numbers rounded), or a line saying where it will come from while the file does not exist."""
    claims_csv = Path(claims_csv)
    head = "The paper's claims\n==================\n\n" + SAFE_CENTERING
    if not claims_csv.is_file():
        return head + f"The claims table appears here once {claims_csv} exists (rule claims_figures makes it).\n"
    with claims_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: auto", ""]
    lines.append("   * - " + "\n     - ".join(CLAIMS_SHOWN))
    for row in rows:
        cells = [_rst_cell(display_value(c, row.get(c, ""))) for c in CLAIMS_SHOWN]
        lines.append("   * - " + "\n     - ".join(cells))
    intro = (
        "Each claim of the paper, decided from this run: paired over seeds where both configurations train per seed "
        "(95% t interval, minimum detectable effect at 80% power), reproduced, contradicted, inconclusive or not run "
        f"(the whole table, with notes: {claims_csv.name}).\n\n"
    )
    return head + intro + "\n".join(lines) + "\n"
