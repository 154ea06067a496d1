"""4/6 block-scale selection ("Four Over Six"): fouroversix's PyTorch reference bit for bit where its arithmetic
defines the result, its FP32 order (the 6-candidate (a_B / 6) * G, the 4-candidate times 1.5, errors from
((p * S) * g) / (T * F), torch's CPU row-sum order, ties to 6), and the same bits on every backend
(tests/test_cpu_kernel.py and tests/test_triton_quantize.py run the 4/6 schemes too)."""

import dataclasses
import json
import math

import pytest
import torch

from ue5m3.numerics.quantize import quantize
from ue5m3.numerics.scale_rules import block_error_sum
from ue5m3.numerics.schemes import BlockScheme, ScaleRule, Selection, get_scheme


def _wide(seed: int, rows: int = 128, cols: int = 256, tiles: bool = False) -> torch.Tensor:
    """Gaussian blocks spread over 2^+-12 (many E4M3 subnormal scales), a Student-t tensor on odd seeds."""
    g = torch.Generator().manual_seed(seed)
    if seed % 2:
        return torch.distributions.StudentT(3.0).sample((rows, cols)) * 3
    spread = torch.exp2(torch.randn(rows // (16 if tiles else 1), cols // 16, generator=g) * 3)
    if tiles:
        spread = spread.repeat_interleave(16, 0)
    return torch.randn(rows, cols, generator=g) * spread.repeat_interleave(16, 1)


@pytest.mark.parametrize("two_d", [False, True], ids=["blocks", "tiles"])
@pytest.mark.parametrize("selection", ["mae", "mse", "abs_max"])
@pytest.mark.parametrize("seed", range(3))
def test_4over6_equals_fouroversix_reference_where_its_arithmetic_defines_the_result(selection, two_d, seed):
    pytest.importorskip("fouroversix", reason="fouroversix is not installed (pip install 'ue5m3[conformance]')")
    from ue5m3.conformance.adapters.fouroversix import reference_quantize, undefined_blocks

    x = _wide(seed, tiles=two_d)
    payload, scales = reference_quantize(x, selection, two_d=two_d)
    q = quantize(x, f"nvfp4_4over6_{selection}", two_d=two_d, backend="torch")
    undefined = undefined_blocks(payload, scales, two_d=two_d)
    assert int(undefined.sum()) < undefined.numel() // 20  # the comparison covers nearly every block
    defined = ~undefined
    assert torch.equal(q.scales[defined], scales[defined])
    per_element = defined.repeat_interleave(16, 1)
    if two_d:
        per_element = per_element.repeat_interleave(16, 0)
    assert torch.equal(q.payload[per_element], payload[per_element])


def test_fouroversix_static_6_is_nvfp4_in_the_legacy_order():
    """fouroversix's static_6 (plain NVFP4) forms the block scale as (a_B / 6) * G: the ``te_legacy`` order."""
    pytest.importorskip("fouroversix", reason="fouroversix is not installed (pip install 'ue5m3[conformance]')")
    from ue5m3.conformance.adapters.fouroversix import reference_quantize, undefined_blocks

    x = _wide(0)
    payload, scales = reference_quantize(x, "static_6")
    defined = ~undefined_blocks(payload, scales)
    q = quantize(x, dataclasses.replace(get_scheme("nvfp4"), scale_order="te_legacy"), backend="torch")
    assert torch.equal(q.scales[defined], scales[defined])


def test_block_error_sum_is_torchs_cpu_row_sum_order():
    """On this CPU, torch's sum of a contiguous 16- or 256-element FP32 row is the order block_error_sum spells."""
    g = torch.Generator().manual_seed(4)
    for length in (16, 256):
        e = (torch.randn(20000, length, generator=g) * torch.exp2(torch.randn(20000, 1, generator=g) * 8)) ** 2
        assert torch.equal(block_error_sum(e).squeeze(-1), e.sum(-1))
    sequential = e[:, :1]
    for k in range(1, 256):
        sequential = sequential + e[:, k : k + 1]
    assert not torch.equal(block_error_sum(e), sequential)  # the order matters at these magnitudes


def test_a_block_near_four_takes_the_four_candidate_and_ties_take_six():
    """g = 4, so G = 1536 / 4 = 384: the 6-candidate is 256 (payload 4.5 rounds to 4, an error), the 4-candidate
    384 represents [4, 3, 2, 1] exactly; an all-zero block and a one-value block have equal errors: 6 (256)."""
    x = torch.zeros(3, 16)
    x[0] = torch.tensor([4.0, 3.0, 2.0, 1.0] * 4)
    x[2, 0] = 4.0
    for selection in Selection:
        q = quantize(x, f"nvfp4_4over6_{selection.value}", backend="torch")
        assert q.scales.flatten().tolist() == [384.0, 0.0, 256.0], selection
        assert torch.equal(q.payload[0], x[0])


def test_ue5m3_4over6_chooses_over_ue5m3_scales_and_repairs_zero_scales():
    x = _wide(2)
    x[0] = 0.0
    q = quantize(x, "ue5m3_b16_4over6_mse", backend="torch")
    assert q.scheme.scale.name == "ue5m3" and q.scheme.scale_rule is ScaleRule.FOUR_OVER_SIX
    assert torch.equal(q.scales[0], torch.ones_like(q.scales[0]))  # zero blocks: repaired to 1.0
    plain = quantize(x, get_scheme("ue5m3_b16").with_target(256.0), backend="torch")
    chosen_four = q.scales != plain.scales
    assert 0.05 < float(chosen_four.float().mean()) < 0.95  # both candidates are chosen somewhere
    err = ((q.dequantize() - x) ** 2).sum()
    assert float(err) < float(((plain.dequantize() - x) ** 2).sum())  # the selection lowers the error


def test_4over6_schemes_are_refused_without_a_selection_or_with_other_blocks():
    with pytest.raises(ValueError, match="needs a selection"):
        BlockScheme(name="x", scale=get_scheme("nvfp4").scale, block_size=16, target=256.0, scale_rule="four_over_six")
    with pytest.raises(ValueError, match="16-element blocks"):
        BlockScheme(
            name="x",
            scale=get_scheme("nvfp4").scale,
            block_size=32,
            target=256.0,
            scale_rule="four_over_six",
            selection="mse",
        )
    with pytest.raises(ValueError, match="takes no selection"):
        BlockScheme(name="x", scale=get_scheme("nvfp4").scale, block_size=16, target=448.0, selection="mse")


FOUR_OVER_SIX_SCHEMES = ("nvfp4_4over6_mae", "ue5m3_b16_4over6_mse")


@pytest.mark.parametrize("scheme", FOUR_OVER_SIX_SCHEMES)
def test_4over6_gemms_multiply_by_the_tensor_scale_factor_of_their_target(scheme):
    """alpha = (g_A * g_B) / ((256 * 6) * (256 * 6)) for 4/6 operands, as for any tensor-scaled pair (it was 1, so
    every emulated 4/6 GEMM came out (1536^2 / (g_A * g_B)) times too large and training stopped at step 1), and
    every GEMM output model agrees with the decoded one: the same encoded operands multiply as those of the
    tensor-scaled scheme with the same payload and scales."""
    from ue5m3.numerics import gemm

    g = torch.Generator().manual_seed(7)
    a_q = quantize(torch.randn(32, 256, generator=g) * 3, scheme, backend="torch")
    b_q = quantize(torch.randn(256, 24, generator=g) * 0.02, scheme, two_d=True, backend="torch")
    expected = (a_q.tensor_amax * b_q.tensor_amax) / (torch.tensor(1536.0) * torch.tensor(1536.0))
    assert torch.equal(gemm.alpha(a_q, b_q), expected)
    tensor_scaled = [
        dataclasses.replace(q, scheme=dataclasses.replace(q.scheme, scale_rule="tensor_scaled", selection=None))
        for q in (a_q, b_q)
    ]
    decoded = gemm.matmul(a_q, b_q, "decoded")
    for model in ("encoded_fp32", "probe_matched", "mma_sim"):
        got = gemm.matmul(a_q, b_q, model)
        assert torch.equal(got, gemm.matmul(*tensor_scaled, model)), model
        # the models differ from the decoded GEMM only by FP32 accumulation (and probe_matched's 1/1024 lattice)
        assert float((got - decoded).abs().max()) <= 1e-3 * float(decoded.abs().max()), model


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "plain"), [("nvfp4_4over6", "nvfp4_te"), ("ue5m3_b16_4over6", "ue5m3_b16")])
def test_4over6_recipes_train_finitely_beside_their_plain_recipes(tmp_path, recipe, plain):
    """Three steps of the hybrid debug model with the CPU DAG's layer pattern: every loss and gradient norm finite,
    and the first step's loss (same weights, same batch) within quantization noise of the recipe without 4/6."""
    from ue5m3.data import RandomTokenStream
    from ue5m3.training import loop
    from ue5m3.training.config import OptimConfig, TrainConfig

    losses = {}
    for name in (recipe, plain):
        cfg = TrainConfig(
            run_dir=str(tmp_path / name),
            model="nemotron_h_debug",
            model_overrides={"vocab_size": 4096, "hybrid_override_pattern": "*-M-M-M-M-M-"},
            recipe=name,
            seed=3,
            steps=3,
            micro_batch=2,
            accumulation=1,
            data=None,
            log_every=1,
            checkpoint_every=3,
            optim=OptimConfig(lr=3e-3),
        )
        loop.train(cfg, RandomTokenStream(4096, 64))
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records] == [1, 2, 3]
        assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records), name
        losses[name] = records[0]["loss"]
    assert abs(losses[recipe] - losses[plain]) < 0.05
