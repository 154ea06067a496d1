"""Parity harness: ULP distances, tensor statistics against exact references, and end-to-end backend parity."""

import json
import math
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
import torch

from ue5m3.identify import parity
from ue5m3.layers import native_te
from ue5m3.numerics.kernels import cpu as cpu_kernel
from ue5m3.training.config import OptimConfig, TrainConfig

F32_TINY = float(np.finfo(np.float32).smallest_subnormal)


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def ulp_list(a, b):
    return parity.ulp_distance(a, b).tolist()


def _pair(backend_a, backend_b, **settings):
    return parity.ParityConfig(backend_a=backend_a, backend_b=backend_b, **settings)


def _config(tmp_path, recipe="ue5m3_b16", **kw):
    """A two-layer dense model of width 64 (MHA, so K/V widths are 64 too), sequence 32, batch 2."""
    return TrainConfig(
        run_dir=str(tmp_path / "run"),
        model="dense_debug",
        model_overrides={"hidden_size": 64, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 512},
        recipe=recipe,
        seed=3,
        steps=1,
        micro_batch=2,
        accumulation=1,
        data={"corpus": "sotu_cpython", "sequence_length": 32, "vocab_size": 512},
        optim=OptimConfig(lr=3e-3),
        **kw,
    )


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----- ulp_distance -------------------------------------------------------------------------------------


def test_ulp_distance_hand_cases_fp32():
    one_up = float(np.nextafter(np.float32(1), np.float32(2)))
    two_up = float(np.nextafter(np.float32(one_up), np.float32(2)))
    big = float(np.finfo(np.float32).max)
    a = _t([1.0, 1.0, F32_TINY, -F32_TINY, 0.0, -0.0, big, -math.inf, -1.0])
    b = _t([one_up, two_up, -F32_TINY, 0.0, -0.0, 0.0, math.inf, math.inf, -1.0])
    assert ulp_list(a, b) == [1, 2, 2, 1, 0, 0, 1, 2 * 0x7F800000, 0]
    assert parity.ulp_distance(a, b).dtype == torch.int64


def test_ulp_distance_bf16_counts_in_bf16_steps():
    # BF16 has 7 stored mantissa bits: 1 + 2^-7 is the next value after 1; across zero the smallest
    # subnormals (2^-133) are one step from zero each.
    tiny = 2.0**-133
    a = _t([1.0, 1.0, tiny, 0.0, 2.0], torch.bfloat16)
    b = _t([1 + 2**-7, 1 + 3 * 2**-7, -tiny, -0.0, 1.0], torch.bfloat16)
    assert ulp_list(a, b) == [1, 3, 2, 0, 128]  # [1, 2) holds 128 BF16 values


def test_ulp_distance_fp64_adjacent_and_saturating():
    one_up = float(np.nextafter(1.0, 2.0))
    a = _t([1.0, -math.inf], torch.float64)
    b = _t([one_up, math.inf], torch.float64)
    assert ulp_list(a, b) == [1, torch.iinfo(torch.int64).max]  # 2 * 0x7FF0... does not fit in int64


def test_ulp_distance_matches_counted_nextafter_steps():
    rng = np.random.default_rng(0)
    starts = np.concatenate([rng.standard_normal(100), rng.integers(-3, 4, 50) * F32_TINY]).astype(np.float32)
    ends, steps = [], rng.integers(0, 6, starts.size)
    for x, k in zip(starts, steps, strict=True):
        toward = np.float32(rng.choice([-1.0, 1.0]))
        for _ in range(k):
            x = np.nextafter(x, toward * np.float32(np.inf))
        ends.append(x)
    got = parity.ulp_distance(torch.from_numpy(starts), torch.from_numpy(np.array(ends, dtype=np.float32)))
    assert got.tolist() == steps.tolist()


def test_ulp_distance_refuses_nan_and_mismatches():
    with pytest.raises(ValueError, match="NaN"):
        parity.ulp_distance(_t([1.0, math.nan]), _t([1.0, 1.0]))
    with pytest.raises(ValueError, match="dtypes"):
        parity.ulp_distance(_t([1.0]), _t([1.0], torch.float64))
    with pytest.raises(TypeError, match="float"):
        parity.ulp_distance(torch.tensor([1]), torch.tensor([1]))


# ----- compare_tensors ----------------------------------------------------------------------------------


def _nudged(x: np.ndarray, ulps: int) -> np.float32:
    for _ in range(ulps):
        x = np.nextafter(x, np.float32(np.inf))
    return x


def test_compare_tensors_statistics_against_exact_references():
    rng = np.random.default_rng(1)
    b = rng.standard_normal(64).astype(np.float32)
    b[0] = 0.0
    a = b.copy()
    a[0] = -0.0  # 0 ULPs, not bitwise equal
    shifts = {1: 1, 2: 1, 3: 2, 4: 5, 5: 1}
    for index, ulps in shifts.items():
        a[index] = _nudged(a[index], ulps)
    c = parity.compare_tensors(torch.from_numpy(a), torch.from_numpy(b))

    assert (c.elements, c.bitwise_equal_elements, c.zero_sign_differs, c.nan_elements) == (64, 58, 1, 0)
    assert (c.ulp_1, c.ulp_2, c.ulp_over_2, c.max_ulp) == (3, 1, 1, 5)
    exact_diff = [Fraction(float(x)) - Fraction(float(y)) for x, y in zip(a, b, strict=True)]
    assert c.max_abs_diff == float(max(abs(d) for d in exact_diff))
    diff_sq, ref_sq = sum(d * d for d in exact_diff), sum(Fraction(float(y)) ** 2 for y in b)
    assert c.rel_l2 == pytest.approx(math.sqrt(diff_sq / ref_sq), rel=1e-12)
    assert c.dtype == "float32" and not c.bitwise_equal
    assert np.isclose(c.diff_norm, np.linalg.norm(a.astype(np.float64) - b.astype(np.float64)), rtol=1e-14)


def test_compare_tensors_bf16_nan_and_equal_cases():
    same = parity.compare_tensors(_t([1.0, -2.5, math.inf], torch.bfloat16), _t([1.0, -2.5, math.inf], torch.bfloat16))
    assert same.bitwise_equal and same.rel_l2 == 0.0 and same.max_abs_diff == 0.0 and same.dtype == "bfloat16"
    b = _t([1.0, 1.0, math.nan, 4.0], torch.bfloat16)
    c = parity.compare_tensors(_t([1 + 2**-7, 1.0, math.nan, math.nan], torch.bfloat16), b)
    # identical NaN bits are bitwise equal; a NaN on either side is counted and left out of the distances
    assert (c.bitwise_equal_elements, c.nan_elements, c.ulp_1, c.max_ulp) == (2, 2, 1, 1)
    assert c.max_abs_diff == 2**-7 and c.ref_norm == math.sqrt(2.0)


def test_group_totals_merge_tensors():
    parts = [parity.compare_tensors(_t([1.0, 2.0]), _t([1.0, 2.0])), parity.compare_tensors(_t([3.0]), _t([4.0]))]
    total = parity.TensorComparison.merge(parts)
    assert (total.elements, total.bitwise_equal_elements, total.max_abs_diff) == (3, 2, 1.0)
    assert total.rel_l2 == pytest.approx(1 / math.sqrt(21))


# ----- end to end ---------------------------------------------------------------------------------------


def test_c_kernel_and_torch_path_train_bit_identically(tmp_path):
    if not cpu_kernel.available():
        pytest.skip("no C compiler: both backends would take the torch path")
    with (
        mock.patch.object(cpu_kernel, "probe_gemm", wraps=cpu_kernel.probe_gemm) as gemm_calls,
        mock.patch.object(cpu_kernel, "probe_gemm_payload", wraps=cpu_kernel.probe_gemm_payload) as payload_calls,
        mock.patch.object(cpu_kernel, "quantize_blocks", wraps=cpu_kernel.quantize_blocks) as quantize_calls,
    ):
        report = parity.run(_config(tmp_path), _pair("emulated:probe_matched", "emulated:probe_matched:torch", steps=3))
    # backend A really used the kernels (the FP32 payload GEMM where the CPU has AVX2 + FMA)
    assert gemm_calls.call_count + payload_calls.call_count > 0 and quantize_calls.call_count > 0
    assert [e["cpu_kernel"] for e in report.executions] == [True, False]
    assert [e["backend"] for e in report.executions] == ["emulated:probe_matched", "emulated:probe_matched:torch"]
    assert [e["numerics_backend"] for e in report.executions] == ["auto", "torch"]
    assert report.first_difference is None, report.to_dict()["tensors"]
    assert report.bitwise_equal and report.losses_equal and len(report.losses_a) == 3
    groups = report.groups
    assert set(groups) == set(parity.GROUPS)
    assert groups["gradients"].elements == groups["parameters"].elements == groups["exp_avg"].elements > 0
    assert all(c.bitwise_equal and c.max_ulp == 0 for c in groups.values())

    parity.write_report(report, tmp_path / "parity.json")
    record = json.loads((tmp_path / "parity.json").read_text())
    assert record["command"] == "parity" and record["seed"] == 3 and record["versions"]["torch"]
    assert record["backends"] == ["emulated:probe_matched", "emulated:probe_matched:torch"]
    assert record["report"]["bitwise_equal"] is True and record["config"]["steps"] == 3


def test_probe_matched_and_decoded_differ_and_say_by_how_much(tmp_path):
    report = parity.run(_config(tmp_path), _pair("emulated:probe_matched", "emulated:decoded", steps=2, batch_size=2))
    assert not report.bitwise_equal
    assert report.first_difference == ("logits", "logits")
    grads = report.groups["gradients"]
    assert grads.max_ulp > 0 and grads.ulp_1 + grads.ulp_2 + grads.ulp_over_2 > 0
    assert 0 < grads.rel_l2 < 1e-3
    assert report.executions[1]["gemm_model"] == "decoded"
    json.dumps(report.to_dict())


def test_native_te_fails_closed_off_blackwell(tmp_path):
    try:
        native_te.require_native()
    except native_te.NativeUnavailable:
        pass
    else:
        pytest.skip("Transformer Engine and a Blackwell GPU are present: native_te can run here")
    cfg = _config(tmp_path, recipe="nvfp4_te", recipe_overrides={"bf16_layers": {"first": 0, "last": 1, "kind": None}})
    with pytest.raises(native_te.NativeUnavailable):
        parity.run(cfg, _pair("emulated", "native_te", steps=1))


def test_bad_backends_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="backend_a: unknown backend 'emulated:nonsense'"):
        _pair("emulated:nonsense", "emulated", steps=1)
    with pytest.raises(ValueError, match="'emulated:bf16' does not fit recipe"):
        parity.run(_config(tmp_path), _pair("emulated:bf16", "emulated", steps=1))
    assert parity.Backend.parse("emulated:mma_sim:torch").spec == "emulated:mma_sim:torch"
