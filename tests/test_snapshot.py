"""Scale-target snapshot: raw UE5M3 codes of the wgrad dY^T blocks, their counts, histograms and the CLI verb."""

import csv

import pytest
import torch

from ue5m3 import cli, models
from ue5m3.data import open_data
from ue5m3.evaluation.snapshot import block_maxima, capture, code_counts, default_modules, log10_histogram, run_snapshot


@pytest.fixture(scope="module")
def run(tiny_run):
    """The shared tiny run (read-only) and its validation set."""
    run_dir, config = tiny_run
    return run_dir, open_data(config).validation


def test_code_counts_on_crafted_block_maxima():
    # reference g = 1, T = 448: u = a_B * 448
    amax = torch.tensor([0.0, 2.0**-30, 2.0**-26, 1.0, 200.0])  # zero, u < 2^-18, 2^-18 < u < 2^-17, 448, 89,600
    counts = code_counts(amax, 1.0, 448.0)
    assert counts == {
        "target": 448.0,
        "dy_amax": 1.0,
        "blocks": 5,
        "zero_blocks": 1,
        "below_2^-17": 2,
        "below_2^-18": 1,
        "zero_rounded_before_repair": 2,  # the zero block and u = 448 * 2^-30 (below half the min subnormal)
        "saturated": 1,
    }
    wide = code_counts(amax, 1.0, 2048.0)  # u = a_B * 2048: 2^-19, 2^-15, 2048, 409,600
    assert (wide["below_2^-17"], wide["below_2^-18"], wide["saturated"]) == (1, 1, 1)


def test_block_maxima_run_along_tokens_of_dy_transposed():
    dy = torch.zeros(32, 3)
    dy[5, 1], dy[20, 2] = -4.0, 2.0
    amax = block_maxima(dy)
    assert amax.shape == (3, 2)
    assert amax.tolist() == [[0.0, 0.0], [4.0, 0.0], [0.0, 2.0]]
    with pytest.raises(ValueError, match="multiple of the block size 16"):
        block_maxima(torch.ones(20, 3))


def test_histogram_bins_are_eighth_decades_from_minus_16_to_8():
    counts, extra = log10_histogram(torch.tensor([0.0, 1.0, 1.5, 1e-20, 1e9, -10.0]))
    assert counts.shape == (192,) and int(counts.sum()) == 3
    assert counts[128] == 1 and counts[129] == 1 and counts[136] == 1  # log10 of 1, 1.5 and 10: 0, 0.176, 1
    assert extra == {"zeros": 1, "below_range": 1, "above_range": 1}


def test_capture_does_one_forward_and_backward_without_an_update():
    model = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = default_modules(model)
    assert names == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    window = torch.randint(0, 4096, (65,), generator=torch.Generator().manual_seed(1))
    captures = capture(model, window, names)
    cap = captures[names[-1]]
    assert cap.x.shape == (64, 384) and cap.w.shape == (128, 384) and cap.dy.shape == (64, 128)
    assert float(cap.dy.abs().amax()) > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def _plain_capture(model, window, names):
    """The snapshot's pass as it was before it was made to fit the 8B model on one GPU: the whole FP32 logits,
    every parameter's gradient, no block checkpointed."""
    seen = {}
    handles = [
        model.get_submodule(n).register_full_backward_hook(
            lambda m, gi, go, n=n: seen.__setitem__(n, go[0].detach().reshape(-1, m.out_features).clone())
        )
        for n in names
    ]
    logits = model(window[None, :-1])
    torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[1:]).backward()
    for handle in handles:
        handle.remove()
    model.zero_grad(set_to_none=True)
    return seen


@pytest.mark.parametrize("name", ["nemotron_h_debug", "dense_debug"])
def test_the_lean_capture_gives_the_dy_of_the_plain_pass_bit_for_bit(name):
    """Checkpointed blocks, the head in chunks and gradients only from the first hooked block on change none of the
    captured dY bits (the head's chunked loss changes only the loss's summation order, which dY does not read)."""
    from ue5m3.training import parallelize

    model = models.build(name, device="cpu", generator=torch.Generator().manual_seed(0))
    window = torch.randint(0, 4096, (257,), generator=torch.Generator().manual_seed(1))
    names = default_modules(model)
    reference = _plain_capture(model, window, names)
    parallelize.checkpoint_blocks(model, range(len(models.blocks(model))))
    lean = capture(model, window, names, loss_chunk=64)
    assert all(torch.equal(lean[n].dy, reference[n]) for n in names)
    assert all(p.requires_grad and p.grad is None for p in model.parameters())  # restored, nothing left


def test_run_snapshot_writes_counts_and_histograms(run, tmp_path):
    run_dir, validation = run
    paths = run_snapshot(run_dir, tmp_path, window=validation.windows[0])
    counts = list(csv.DictReader(paths["counts"].open()))
    assert [(r["module"], r["target"]) for r in counts] == [
        ("model.layers.0.mlp.down_proj", "448.0"),
        ("model.layers.0.mlp.down_proj", "2048.0"),
        ("model.layers.1.mlp.down_proj", "448.0"),
        ("model.layers.1.mlp.down_proj", "2048.0"),
    ]
    assert all(int(r["blocks"]) == 128 * 4 and r["saturated"] == "0" for r in counts)
    rows = list(csv.DictReader(paths["histograms"].open()))
    assert len(rows) == 2 * 6 * 192  # modules x (x, w, dy, block amax, two raw-code targets) x bins
    assert paths["provenance"].exists()


def test_scale_snapshot_verb_help_and_module_patterns(run, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["scale-snapshot", "--help"])
    assert exit_info.value.code == 0 and "SnapshotConfig" in capsys.readouterr().out
    run_dir, _ = run
    settings = '{"modules": ["*.up_proj"]}'
    code = cli.main(["scale-snapshot", "--config", settings, "--run-dir", str(run_dir), "--out-dir", str(tmp_path)])
    assert code == 0
    counts = list(csv.DictReader((tmp_path / "counts.csv").open()))
    assert {r["module"] for r in counts} == {"model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj"}
