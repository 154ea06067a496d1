"""Tests of ue5m3.data.build: the whole pipeline end to end on the OLMo-mix fixture records (real BPE,
vocabulary 300)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from helpers.data import fixture_config
from ue5m3.data import DataConfig, TokenShards, build_data, data_paths, open_data


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> DataConfig:
    """The whole pipeline on the OLMo-mix fixture records (real BPE, vocabulary 300)."""
    config = fixture_config(tmp_path_factory.mktemp("built"))
    build_data(config)
    return config


def test_build_and_open_data_on_the_olmo_mix_fixture(built):
    data = open_data(built)
    inputs, targets = data.train.next_batch(2)
    assert inputs.shape == (2, 16) and int(inputs.max()) < 300
    assert len(data.validation) == 2 and len(data.calibration) == 1
    assert not set(data.validation.document_ids) & set(data.calibration.document_ids)
    paths = data_paths(built)
    for stream in built.stream_names:
        index = json.loads((paths.shards(stream, "train") / "index.json").read_text())
        assert index["dtype"] == "uint16" and (index["bos_id"], index["eos_id"]) == (1, 2)


def test_open_data_refuses_overlapping_validation_and_calibration(built, tmp_path):
    moved = dataclasses.replace(built, data_dir=str(tmp_path / "data"))
    shutil.copytree(built.data_dir, moved.data_dir)
    paths = data_paths(moved)
    calibration = paths.shards("dclm", "calibration")
    shutil.rmtree(calibration)
    shutil.copytree(paths.shards("dclm", "validation"), calibration)
    ids = TokenShards(calibration).ids
    with pytest.raises(ValueError, match=r"the validation and calibration splits share .*" + ids[0]):
        open_data(moved)
