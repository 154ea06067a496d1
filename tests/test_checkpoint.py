"""Checkpoint formats: full (one process) and sharded (torch.distributed.checkpoint), both verified by their
manifest, both read back as one full model state dict. The multi-rank cases are in test_train_distributed.py."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from helpers.ports import free_port
from ue5m3.training import checkpoint


@pytest.fixture
def one_rank_group():
    """A one-process gloo group: the sharded writer's collectives run, with a single participant."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4))


def _sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def test_a_sharded_checkpoint_reads_back_as_the_full_model_state(tmp_path, one_rank_group):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    path = checkpoint.save_sharded(tmp_path, 7, _sharded_state(model, optimizer), {"trainer": {"step": 7}}, meta={})
    manifest = checkpoint.verify(path)
    assert manifest["format"] == checkpoint.SHARDED and manifest["step"] == 7
    assert any(name.startswith("model/") and name.endswith(".distcp") for name in manifest["files"])
    assert any(name.startswith("optimizer/") for name in manifest["files"])
    state = checkpoint.load_model_state(path)
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    parts, _ = checkpoint.load(path)
    assert parts == {"trainer": {"step": 7}}  # only the torch.save files; the state is read by DCP
    # the weights hash depends on the weights only: the same state written again hashes the same
    again = checkpoint.save_sharded(tmp_path / "b", 7, _sharded_state(model, optimizer), {"trainer": {}}, meta={})
    assert checkpoint.weights_sha256(checkpoint.verify(again)) == checkpoint.weights_sha256(manifest)


def test_a_corrupted_shard_fails_verification_naming_the_file(tmp_path, one_rank_group):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    path = checkpoint.save_sharded(tmp_path, 1, _sharded_state(model, optimizer), {"trainer": {}}, meta={})
    shard = next((path / "model").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=rf"{shard.name} is corrupted"):
        checkpoint.load_model_state(path)


def test_a_failed_sharded_save_leaves_nothing_behind(tmp_path, one_rank_group):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    unpicklable = {"trainer": {"f": lambda: None}}
    with pytest.raises(checkpoint.CheckpointError, match="saving checkpoint .*step-00000003 failed on rank 0"):
        checkpoint.save_sharded(tmp_path, 3, _sharded_state(model, optimizer), unpicklable, meta={})
    assert list(tmp_path.iterdir()) == []


def test_transformer_engine_metadata_is_left_out_of_the_weights(tmp_path):
    state = {**_model().state_dict(), "0._extra_state": torch.zeros(3)}
    path = checkpoint.save(tmp_path, 1, {"model": state, "trainer": {}}, meta={})
    loaded = checkpoint.load_model_state(path)
    assert "0._extra_state" not in loaded and loaded.keys() == _model().state_dict().keys()
    assert checkpoint.weights_sha256(checkpoint.verify(path)) == checkpoint.file_sha256(path / "model.pt")
