"""The roofline cost model of docs/performance.md: it runs, counts the 8B linears as the conversion does and orders
the recipes as their operations say (an estimate: no wall time is asserted anywhere)."""

import torch

from benchmark_helpers import load_benchmark


def _module():
    return load_benchmark("cost_model")


def test_the_model_counts_the_8b_linears_and_orders_the_recipes():
    model = _module()
    with torch.device("meta"):
        fp4 = {name: sum(f for _, _, f in model._linears(name)) for name in ("bf16", "nvfp4_te", "ue5m3_b16")}
        rows = {(r["gpu"], r["recipe"]): r for r in model.estimate()}
    assert fp4 == {"bf16": 0, "nvfp4_te": 96, "ue5m3_b16": 112}
    for gpu in model.GPUS:
        assert abs(rows[(gpu, "bf16")]["x_bf16"] - 1.0) < 1e-9
        # FP32 CUDA-core GEMMs cost more than the exact tensor-core fast path, which costs more than BF16
        assert rows[(gpu, "ue5m3_torch_control")]["x_bf16"] > rows[(gpu, "ue5m3_b16")]["x_bf16"] > 1.0
    # native NVFP4 only on Blackwell, and there faster than BF16
    assert rows[("B200", "nvfp4_te (native)")]["x_bf16"] < 1.0 and ("H100", "nvfp4_te (native)") not in rows
    markdown = model.render_markdown(list(rows.values()))
    assert "| H200 | ue5m3_b16 |" in markdown and "Assumptions:" in markdown
