"""Tests of ue5m3.data.config: the strict ``data:`` config section (round trip, key and value errors)."""

from __future__ import annotations

import pytest

from ue5m3.data import Corpus, DataConfig


def test_config_round_trips_through_plain_data():
    config = DataConfig(corpus=Corpus.SOTU_CPYTHON)
    assert DataConfig.from_dict(config.to_dict()) == config
    assert config.mix == (41, 50) and config.stream_names == ("sotu", "cpython_docs")


def test_config_loader_lists_unknown_and_missing_keys():
    data = DataConfig(corpus=Corpus.SOTU_CPYTHON).to_dict()
    del data["corpus"]  # the one key without a default
    data["sead"] = 1
    with pytest.raises(ValueError, match=r"unknown keys \['sead'\], missing keys \['corpus'\]"):
        DataConfig.from_dict(data)


@pytest.mark.parametrize(
    ("overrides", "exc", "key"),
    [
        ({"mix": (50, 50)}, ValueError, "data.mix"),
        ({"sequence_length": 0}, ValueError, "data.sequence_length"),
        ({"vocab_size": True}, TypeError, "data.vocab_size"),
        ({"validation_fraction": 0.6, "calibration_fraction": 0.5}, ValueError, "data.calibration_fraction"),
        ({"stream_a_files": ("x.jsonl",)}, ValueError, "data.stream_a_files"),
        ({"bos_token": "</s>"}, ValueError, "data.eos_token"),
        ({"prepare_parts": 0}, ValueError, "data.prepare_parts: must be >= 1"),
        ({"prepare_parts": True}, TypeError, "data.prepare_parts"),
        ({"prepare_parts": 2}, ValueError, "data.prepare_parts: 2 parts need a fixed tokenizer"),
    ],
)
def test_config_errors_name_the_key(overrides, exc, key):
    with pytest.raises(exc, match=key):
        DataConfig(corpus=Corpus.SOTU_CPYTHON, **overrides)


def test_config_rejects_unknown_enum_value():
    data = DataConfig(corpus=Corpus.SOTU_CPYTHON).to_dict() | {"mix_unit": "token"}
    with pytest.raises(ValueError, match=r"data.mix_unit: unknown value 'token'; accepted: \['document', 'window'\]"):
        DataConfig.from_dict(data)
