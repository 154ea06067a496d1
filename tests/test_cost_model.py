"""benchmarks/cost_model.py, the per-recipe table of ue5m3.plan.cost for the 8B microbatch: it runs, counts the 8B
linears as the conversion does and orders the recipes as their operations say (an estimate: no wall time is
asserted anywhere)."""

from helpers.benchmark_scripts import load_benchmark


def test_the_table_orders_the_recipes_as_their_operations_say():
    model = load_benchmark("cost_model")
    rows = {(r["gpu"], r["recipe"]): r for r in model.estimate()}
    for gpu in ("H100", "H200", "B200", "GB200"):
        assert abs(rows[(gpu, "bf16")]["x_bf16"] - 1.0) < 1e-12
        # FP32 CUDA-core GEMMs cost more than the exact tensor-core fast path, which costs more than BF16
        assert rows[(gpu, "ue5m3_torch_control")]["x_bf16"] > rows[(gpu, "ue5m3_b16")]["x_bf16"] > 1.0
    # native NVFP4 only on Blackwell, and there faster than BF16
    assert rows[("B200", "nvfp4_te (native)")]["x_bf16"] < 1.0 and ("H100", "nvfp4_te (native)") not in rows
    markdown = model.render_markdown(list(rows.values()))
    assert "| H200 | ue5m3_b16 |" in markdown and "Assumptions:" in markdown


def test_a_larger_exact_share_costs_more():
    model = load_benchmark("cost_model")
    base = model.cost.Efficiency()
    slow = model.cost.Efficiency(exact_share=0.4)
    pick = lambda rows: next(r for r in rows if (r["gpu"], r["recipe"]) == ("H100", "ue5m3_b16"))  # noqa: E731
    assert pick(model.estimate(slow))["microbatch_seconds"] > pick(model.estimate(base))["microbatch_seconds"]
