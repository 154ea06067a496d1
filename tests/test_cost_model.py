"""benchmarks/cost_model.py, the per-recipe table of ue5m3.plan.cost for the 8B microbatch: it runs, counts the 8B
linears as the conversion does and orders the recipes as their operations say (an estimate: no wall time is
asserted anywhere)."""

import json
from pathlib import Path

import pytest

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


def test_the_exact_path_is_charged_by_both_measured_shares_as_docs_say():
    """Each exact tile-slice at r fast ones, each other tile-slice of a flagged tile at 2: the probe_matched GEMM work
    grows by f + (r - 2) e (docs/performance.md), whatever the memory-bound rest of the linear costs."""
    model = load_benchmark("cost_model")
    cost = model.cost
    recipe = model.TrainConfig(run_dir="x", model="nemotron_h_8b", recipe="ue5m3_b16", seed=0, steps=1, micro_batch=1,
                              accumulation=1, data=None).resolved_recipe()  # fmt: skip
    gpu = model.gpu_types()["H100"]

    def seconds(e: float, f: float) -> float:
        eff = cost.Efficiency(exact_share=e, flagged_share=f)
        return cost.linear_seconds(recipe, 8192, 4096, 4096, gpu, eff, native=False)

    fast = seconds(0.0, 1.0) - seconds(0.0, 0.0)  # one more fast pass over every tile-slice
    charged = seconds(0.25, 0.5) - seconds(0.0, 0.0)
    assert abs(charged - fast * (0.5 + (cost.EXACT_SLICE_COST - 2) * 0.25)) < 1e-12 * charged
    assert seconds(0.25, 0.0) == seconds(0.25, 0.25)  # a tile with an exact slice is a flagged tile


def test_the_shares_come_from_an_exact_share_record_by_source(capsys):
    model = load_benchmark("cost_model")
    record = Path(__file__).parents[1] / "benchmarks" / "records" / "exact_share_dense_1p2b_init.json"
    sources = json.loads(record.read_text())["sources"]
    assert model.measured_shares(record, "init") == (sources["init"]["share"], sources["init"]["flagged_share"])
    with pytest.raises(SystemExit, match=r"exact_share_dense_1p2b_init.json: no source 'step 9'; it has \['init'\]"):
        model.main(["--shares", str(record), "--source", "step 9"])
    assert model.main(["--shares", str(record)]) == 0
    assert "| H100 | ue5m3_b16 |" in capsys.readouterr().out
