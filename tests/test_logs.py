"""Logging and progress: one format for every record, a bar with figures on a terminal, log lines in a file."""

from __future__ import annotations

import logging
import re
import warnings

import pytest

from ue5m3 import logs

# LOG_FORMAT as a pattern: time, level, logger name, message.
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: .")


@pytest.fixture
def configured(monkeypatch):
    """logs.configure at INFO, undone afterwards (the root logger is process-wide)."""
    root = logging.getLogger()
    saved = root.level, list(root.handlers), logging.getLogger("ue5m3").level
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    logs.configure("info")
    yield
    logging.captureWarnings(False)
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    logging.getLogger("ue5m3").setLevel(saved[2])


def test_every_record_has_the_one_format_time_level_logger_message(configured, capsys):
    logging.getLogger("ue5m3.training.loop").info("step %d", 3)
    logging.getLogger("ue5m3.data").debug("not shown at info")
    err = capsys.readouterr().err.splitlines()
    assert logs.LOG_FORMAT == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    assert len(err) == 1 and LINE.match(err[0]) and err[0].endswith(" INFO ue5m3.training.loop: step 3")


def test_warnings_go_through_the_same_format(configured, capsys):
    warnings.warn("a torn metrics line", UserWarning, stacklevel=1)
    first = capsys.readouterr().err.splitlines()[0]
    assert LINE.match(first) and " WARNING py.warnings: " in first and "a torn metrics line" in first


def test_configure_is_idempotent_and_takes_the_level_from_the_environment(configured, capsys, monkeypatch):
    monkeypatch.setenv(logs.LEVEL_ENV, "warning")
    logs.configure()
    logs.configure()
    logging.getLogger("ue5m3.x").info("hidden")
    logging.getLogger("ue5m3.x").warning("shown")
    assert capsys.readouterr().err.count("shown") == 1
    with pytest.raises(ValueError, match="'loud' is not one of debug, info, warning, error"):
        logs.configure("loud")


def test_third_party_noise_is_dropped_and_their_other_warnings_kept(configured, capsys):
    """The lines of ``logs.NOISE`` (torchao's extensions that do not load here, torch's note on torchao's Enums,
    lm-eval's custom_dataset hint for ue5m3's tasks) are dropped; any other warning of those loggers still shows."""
    so = "/venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"
    logging.getLogger("torchao").warning(f"Failed to load {so}: Could not load this library: {so}")
    logging.getLogger("torchao").warning("Failed to load /x/torchao/_C_cutlass_90a.abi3.so: undefined symbol")
    logging.getLogger("torch.utils._pytree").warning(
        "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type.", "<enum 'K'>"
    )
    logging.getLogger("lm_eval.api.task").warning(
        "ue5m3_arc_easy_mc: Custom kwargs can be passed to `--metadata` in console (as json string)"
    )
    logging.getLogger("torchao").warning("a torchao warning that matters")
    logging.getLogger("lm_eval.api.task").warning("arc_easy: Custom kwargs can be passed to `--metadata` ...")
    logs.configure("info")  # again: the filters are not stacked, and still hold
    logging.getLogger("torchao").warning(f"Failed to load {so}: again")
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[1] for line in err] == [
        "a torchao warning that matters",
        "arc_easy: Custom kwargs can be passed to `--metadata` ...",  # not one of ours: lm-eval's hint may matter
    ]
    assert sum(isinstance(f, logs._DropNoise) for f in logging.getLogger("torchao").filters) == 1


def test_ranks_other_than_0_log_only_warnings(configured, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    logging.getLogger("ue5m3.x").info("rank 1 info")
    logging.getLogger("ue5m3.x").warning("rank 1 warning")
    err = capsys.readouterr().err
    assert "rank 1 info" not in err and "rank 1 warning" in err


def test_without_a_terminal_progress_writes_a_line_per_reported_item_and_a_last_line(caplog):
    caplog.set_level(logging.INFO, logger="test.progress")
    with logs.Progress("eval", total=3, unit="window", logger=logging.getLogger("test.progress"), bar=False) as p:
        p.update(figures={"nll": 2.5}, report=True)
        p.update(figures={"nll": 2.25})  # interval_s not reached: no line
        p.update(figures={"nll": "2.00000"})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("eval: window 1/3, nll 2.5, ") and lines[0].endswith(" window/s")
    assert lines[1].startswith("eval: window 3/3, nll 2.00000, ") and " done in " in lines[1]


def test_progress_writes_nothing_when_disabled_and_no_repeated_last_line(caplog):
    caplog.set_level(logging.INFO, logger="test.progress")
    log = logging.getLogger("test.progress")
    with logs.Progress("quiet", total=2, logger=log, enabled=False, bar=False) as p:
        p.update(2, report=True)
    with logs.Progress("train", total=2, initial=1, unit="step", logger=log, rate=False, bar=False) as p:
        p.update(figures={"loss": "1.0000"}, report=True)  # the final count is already logged: no last line
    assert [r.getMessage() for r in caplog.records] == ["train: step 2/2, loss 1.0000"]


def test_on_a_terminal_progress_is_a_bar_with_the_figures(capsys):
    with logs.Progress("train", total=4, unit="step", bar=True) as p:
        p.update(figures={"loss": "2.3456", "tokens/s": "1234"}, report=True)
    err = capsys.readouterr().err
    assert "train:" in err and "1/4" in err and "loss=2.3456" in err and "tokens/s=1234" in err
