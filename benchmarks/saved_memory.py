"""Bytes one linear holds between its forward and backward pass, at the Nemotron-H 8B GEMM shapes.

Usage: python benchmarks/saved_memory.py [--tokens 8192] [--json out.json]

Counted, not timed: the forward runs on torch's ``meta`` device (no memory is allocated, shapes and dtypes are
real) under ``saved_tensors_hooks``, which see every tensor autograd keeps for the backward. Parameters are not
counted (they are held anyway). The baseline is ``nn.Linear`` with BF16 parameters (it keeps X in BF16); the FP4
linear keeps the packed wgrad copy of X (before, it kept an FP32 copy of X: 2x the baseline). The last column is
what a layer keeps resident for a step when its microbatches reuse the weight quantizations (the forward's packed
W^T; the dgrad's W adds as much again).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from torch import nn

SHAPES_8B = {  # (in, out) of the Nemotron-H 8B linears
    "mamba in_proj": (4096, 18560),
    "mamba out_proj": (8192, 4096),
    "mlp up_proj": (4096, 21504),
    "mlp down_proj": (21504, 4096),
    "attention q/o": (4096, 4096),
}
RECIPES = ("ue5m3_b16", "nvfp4_te", "mxfp4")


def saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of every tensor autograd keeps for ``module(x)``'s backward, its parameters and their views left out."""
    param_ids = {id(p) for p in module.parameters()}
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if id(t) not in param_ids and (t._base is None or id(t._base) not in param_ids):
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return total


def measure(tokens: int) -> list[dict]:
    from ue5m3.layers import recipes
    from ue5m3.layers.linear import convert, find_scale_state, set_weight_caching
    from ue5m3.layers.recipes import GemmModel

    rows = []
    for label, (fan_in, fan_out) in SHAPES_8B.items():
        x = torch.empty(tokens, fan_in, device="meta", dtype=torch.bfloat16, requires_grad=True)
        baseline = saved_bytes(nn.Linear(fan_in, fan_out, bias=False, device="meta", dtype=torch.bfloat16), x)
        row = {"linear": label, "in": fan_in, "out": fan_out, "bf16_nn_linear": baseline}
        for name in RECIPES:
            model = nn.Sequential(nn.Linear(fan_in, fan_out, bias=False, device="meta"))
            recipe = recipes.get(name)
            # what is saved does not depend on the GEMM output model; decoded runs few meta ops
            recipe = dataclasses.replace(
                recipe, gemm=dataclasses.replace(recipe.gemm, model=GemmModel.DECODED, final_grid=None)
            )
            convert(model, recipe, select=["0"], backend="torch")
            set_weight_caching(model, "step")
            find_scale_state(model).begin_step(1)
            row[name] = saved_bytes(model, x)
            row[f"{name}_weight_cache"] = model[0].weight_cache.nbytes  # the forward's W^T (the dgrad W adds as much)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = measure(args.tokens)
    print(f"bytes kept for the backward per linear, {args.tokens} tokens, torch {torch.__version__}")
    header = " | ".join(f"{r} (x BF16)" for r in RECIPES)
    print(f"| linear | BF16 nn.Linear (MiB) | {header} | cached W^T, {RECIPES[0]} (MiB) |")
    print("|---|---:|" + "---:|" * len(RECIPES) + "---:|")
    for row in rows:
        mib = 2**20
        cells = " | ".join(f"{row[r] / mib:.0f} ({row[r] / row['bf16_nn_linear']:.2f})" for r in RECIPES)
        print(
            f"| {row['linear']} ({row['in']} -> {row['out']}) | {row['bf16_nn_linear'] / mib:.0f} | {cells} | "
            f"{row[RECIPES[0] + '_weight_cache'] / mib:.0f} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"tokens": args.tokens, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
