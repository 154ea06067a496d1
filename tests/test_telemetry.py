"""Scale telemetry of the FP4 linears (ue5m3.layers.telemetry): sampled on the device, read once, exact against
direct computations from the quantized tensors, per linear and operand role, and only on the steps a run logs."""

import json
import math

import pytest
import torch
from torch import nn

from helpers.recipes import for_debug
from ue5m3 import models
from ue5m3.data import RandomTokenStream
from ue5m3.layers import recipes, telemetry
from ue5m3.layers.linear import QuantLinear, convert, find_quant_stats, find_scale_state
from ue5m3.numerics.philox import SRState
from ue5m3.training import loop
from ue5m3.training.config import OptimConfig, TrainConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _layer(recipe="ue5m3_b16", **overrides):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64))
    recipe = recipes.resolve(recipe, overrides) if overrides else recipes.get(recipe)
    convert(model, recipe, select=["0"], sr_state=SRState(5))
    return model


@pytest.mark.parametrize("recipe_name", [r for r in recipes.names() if r != "bf16"])
def test_a_sampled_training_step_on_meta_keeps_the_telemetry_on_the_device(recipe_name):
    """On torch's meta device nothing can be read back: a sampled step of every recipe records its telemetry
    there, so sampling adds no host synchronisation to a step."""
    model = models.build("nemotron_h_debug", device="meta")
    convert(model, for_debug(recipe_name, "nemotron_h_debug"), select=models.eligible_linears(model),
            sr_state=SRState(1), backend="torch")  # fmt: skip
    find_scale_state(model).begin_step(1)
    stats = find_quant_stats(model)
    stats.sample(True)
    vocab = models.config("nemotron_h_debug").vocab_size
    tokens = torch.randint(0, vocab, (2, 32), device="meta")
    model(tokens).float().sum().backward()
    held = [m.telemetry.stats for m in model.modules() if isinstance(m, QuantLinear)]
    assert held and all(s is not None and s.device.type == "meta" for s in held)


def test_nothing_is_sampled_unless_asked_and_a_pop_resets_what_was():
    model = _layer()
    state, stats = find_scale_state(model), find_quant_stats(model)
    state.begin_step(1)
    model(torch.randn(64, 64, requires_grad=True)).sum().backward()
    assert model[0].telemetry.stats is None  # not sampled: the step paid for the counts only
    roles = stats.pop()["telemetry"]["0"]
    assert roles["activation"]["quantized_blocks"] > 0 and roles["activation"]["dead_zone_share"] is None
    state.begin_step(2)
    stats.sample(True)
    model(torch.randn(64, 64, requires_grad=True)).sum().backward()
    sampled = stats.pop()["telemetry"]["0"]
    assert set(sampled) == {"activation", "weight", "upstream_gradient"}
    assert all(set(fields) == set(telemetry.ROLE_FIELDS) for fields in sampled.values())
    assert sampled["activation"]["dead_zone_share"] is not None
    again = stats.pop()["telemetry"]["0"]  # reset: nothing since the last pop
    assert again["activation"]["quantized_blocks"] == 0 and again["activation"]["scale_log2_max"] is None


def _direct(q, source):
    """The telemetry of one quantization computed directly, in FP64, from its tensors."""
    fmt = q.scheme.scale
    scales, nonzero = q.scale_values.double(), q.block_amax > 0
    positive = scales[nonzero & (q.scale_values > 0)]
    x = q.layout.to_blocks(source).double()
    scaled = (x * torch.clamp(torch.reciprocal(q.decode_scales_blocks), max=3.4028234663852886e38).double()).abs()
    dead = (scaled <= 0.25) & (x != 0)
    return {
        "low": math.log2(float(positive.min())),
        "high": math.log2(float(positive.max())),
        "top": int((nonzero & (scales == fmt.max_finite)).sum()),
        "bottom": int((nonzero & (scales == fmt.min_positive)).sum()),
        "blocks": int(nonzero.sum()),
        "dead": int(dead.sum()),
        "nonzero": int((x != 0).sum()),
        "rescued": int((dead & (q.payload_blocks != 0)).sum()),
    }


def test_the_sampled_step_reports_what_the_quantized_operands_hold():
    """One layer, one sampled forward and backward: each role's fields are the direct computation from the very
    operands its GEMMs consumed (captured by replacing run_gemm), its two slots together."""
    from ue5m3.layers import matmul

    model = _layer()
    state, stats = find_scale_state(model), find_quant_stats(model)
    seen = {}
    original = matmul.run_gemm

    def spy(a_q, b_q, config, **kw):
        seen[len(seen)] = (a_q, b_q)
        return original(a_q, b_q, config, **kw)

    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 64, generator=g) * torch.exp2(torch.randint(-20, 4, (64, 4), generator=g)).repeat_interleave(
        16, 1
    )  # blocks spread over 2^24
    x[0] = 0.0
    x[1, :16] = x.abs().max() * 2.0**-26 * torch.linspace(0.5, 1.0, 16)  # ideal scale 448 * 2^-26: the bottom code
    x.requires_grad_(True)
    dy = torch.randn(64, 64, generator=g)
    state.begin_step(1)
    stats.sample(True)
    mp = pytest.MonkeyPatch()
    mp.setattr(matmul, "run_gemm", spy)
    try:
        model(x).backward(dy)
    finally:
        mp.undo()
    (x_q, wt_q), (dy_q, w_q), (dyt_q, xt_q) = seen[0], seen[1], seen[2]
    weight = model[0].weight.detach()
    direct = {
        "activation": [_direct(x_q, x.detach()), _direct(xt_q, x.detach())],
        "weight": [_direct(wt_q, weight.t()), _direct(w_q, weight)],
        "upstream_gradient": [_direct(dy_q, dy), _direct(dyt_q, dy.t())],
    }
    got = stats.pop()["telemetry"]["0"]
    for role, (a, b) in direct.items():
        fields = got[role]
        assert fields["scale_log2_min"] == pytest.approx(min(a["low"], b["low"]), abs=0), role
        assert fields["scale_log2_max"] == pytest.approx(max(a["high"], b["high"]), abs=0), role
        assert fields["top_code_share"] == (a["top"] + b["top"]) / (a["blocks"] + b["blocks"]), role
        assert fields["bottom_code_share"] == (a["bottom"] + b["bottom"]) / (a["blocks"] + b["blocks"]), role
        assert fields["dead_zone_share"] == (a["dead"] + b["dead"]) / (a["nonzero"] + b["nonzero"]), role
        assert fields["headroom_margin"] is None  # the first step refreshes every reference
    assert got["activation"]["bottom_code_share"] > 0  # the spread reached the codebook's bottom
    sr = direct["upstream_gradient"]
    assert got["upstream_gradient"]["sr_share"] == (sr[0]["rescued"] + sr[1]["rescued"]) / (
        sr[0]["dead"] + sr[1]["dead"]
    )
    assert 0 < got["upstream_gradient"]["sr_share"] < 1 and got["activation"]["sr_share"] is None


def test_the_headroom_margin_is_t_rho_over_u_for_held_references_only():
    """D = 50: step 1 refreshes X's reference, step 2 holds it while X grows 10x: rho = 10, so the margin is
    448 * 10 / 61,440 for the activation role; the current-scaled recipe (D = 1) has no held reference at all."""
    model = _layer()
    state, stats = find_scale_state(model), find_quant_stats(model)
    x = torch.randn(64, 64)
    with torch.no_grad():
        for step, scale in ((1, 1.0), (2, 10.0)):
            state.begin_step(step)
            stats.sample(True)
            model(x * scale)
            fields = stats.pop()["telemetry"]["0"]["activation"]
    expected = 448.0 * float((x * 10.0).abs().max().double() / x.abs().max().double()) / 61440.0
    assert fields["headroom_margin"] == pytest.approx(expected, rel=1e-12)
    current = _layer("ue5m3_b16", interval=1)
    state, stats = find_scale_state(current), find_quant_stats(current)
    with torch.no_grad():
        for step in (1, 2):
            state.begin_step(step)
            stats.sample(True)
            current(x * step)
    assert stats.pop()["telemetry"]["0"]["activation"]["headroom_margin"] is None


def test_a_saturating_stale_reference_shows_in_the_margin_and_the_top_code():
    """A reference held at 1 while X holds values up to 1e3: T * rho / U = 448e3 / 61,440 > 1, every block whose
    ideal scale passes U saturates at the top code (Proposition 1)."""
    model = _layer()
    state, stats = find_scale_state(model), find_quant_stats(model)
    with torch.no_grad():
        state.begin_step(1)
        model(torch.full((64, 64), 1.0))
        stats.pop()
        state.begin_step(2)
        stats.sample(True)
        model(torch.full((64, 64), 1e3))
    fields = stats.pop()["telemetry"]["0"]["activation"]
    assert fields["headroom_margin"] == pytest.approx(448e3 / 61440) and fields["headroom_margin"] > 1
    assert fields["top_code_share"] == 1.0 and fields["saturated_blocks"] == fields["quantized_blocks"]


def _train_records(tmp_path, name, log_every):
    cfg = TrainConfig(
        run_dir=str(tmp_path / name),
        model="dense_debug",
        recipe="ue5m3_b16",
        seed=1,
        steps=4,
        micro_batch=2,
        accumulation=1,
        data=None,
        log_every=log_every,
        checkpoint_every=4,
        optim=OptimConfig(lr=3e-3),
    )
    loop.train(cfg, RandomTokenStream(4096, 32))
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_the_trainer_records_telemetry_on_logged_steps_with_the_counts_since_the_last(tmp_path):
    """Logging every 2 steps: each record's counts are the sums of the two steps' (as logging every step gives
    them), its sampled telemetry that of its own step, bit for bit."""
    every, second = _train_records(tmp_path, "every", 1), _train_records(tmp_path, "second", 2)
    assert [r["step"] for r in second] == [2, 4]
    for record in second:
        pair = [r for r in every if r["step"] in (record["step"] - 1, record["step"])]
        for key in telemetry.COUNTS:
            assert record[key] == sum(r[key] for r in pair), key
        ours, theirs = record["telemetry"], pair[1]["telemetry"]
        assert ours.keys() == theirs.keys() and len(ours) == len(
            models.eligible_linears(models.build("dense_debug", device="meta"))
        )
        for name, roles in ours.items():
            for role, fields in roles.items():
                for key in telemetry.ROLE_FIELDS[4:]:  # the sampled fields: the logged step's own
                    assert fields[key] == theirs[name][role][key], (name, role, key)
                assert fields["quantized_blocks"] == sum(r["telemetry"][name][role]["quantized_blocks"] for r in pair)
    assert second[1]["telemetry"]["model.layers.0.mlp.up_proj"]["activation"]["headroom_margin"] is not None  # D = 50
