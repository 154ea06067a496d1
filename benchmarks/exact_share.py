"""The share of tile-slices the Triton probe_matched GEMM computes on its exact path, on real operands.

    python benchmarks/exact_share.py [--model nemotron_h_debug] [--overrides JSON] [--recipe ue5m3_b16]
        [--checkpoint DIR ...] [--init] [--batch 1] [--sequence 256] [--out results/exact_share.json]

One training microbatch (forward and backward, the recipe's own quantizations: its roundings, Philox streams and
tensor references) of the model at init (``--init``, the default without checkpoints) and from each checkpoint
(``ue5m3.training.checkpoint.load_model_state``), on the CPU. Every FP4 GEMM of every converted linear (fprop
X @ W^T, dgrad dY @ W, wgrad dY^T @ X) is intercepted with the operands it really gets, and
:func:`ue5m3.numerics.fast_path.probe_paths` counts which of its tile-slices the kernels would send to the exact path
(the GPU's 128 x 64 output tiles unless ``--tiles``, 64-wide K slices); the GEMM then runs as usual. The tokens
are drawn uniformly from the vocabulary with a fixed seed (the weights and what they make of any input are what is
measured).

Prints a table per source (exact share per GEMM role, and the layers with the largest shares) and writes every
layer's count to one JSON file; ``benchmarks/cost_model.py --shares FILE --source LABEL`` charges the exact path by
it and ``benchmarks/gpu_check.py`` benchmarks the captured operands beside Gaussian ones.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

PIPELINE_OVERRIDES = {"vocab_size": 4096, "hybrid_override_pattern": "*-M-M-M-M-M-"}  # config/config.yaml's model
ROLES = {"fprop_activation": "fprop", "dgrad_upstream_gradient": "dgrad", "wgrad_upstream_gradient": "wgrad"}


def capture(
    model: torch.nn.Module,
    recipe,
    tokens: torch.Tensor,
    tiles: tuple[int, int] = (128, 64),
    keep_operands=lambda layer: False,
) -> list[dict]:
    """Convert ``model`` under ``recipe`` (resolved for it), run one microbatch and return one row per FP4 GEMM:
    layer, GEMM role, shape, tile-slices and how many take the exact path; the rows of the layers ``keep_operands``
    names also hold the GEMM's two quantized operands and its GEMM config (``operands``, ``gemm_config``: what
    ``benchmarks/gpu_check.py`` times)."""
    from ue5m3 import models
    from ue5m3.layers import matmul
    from ue5m3.layers.linear import QuantLinear, convert, find_scale_state
    from ue5m3.numerics import fast_path
    from ue5m3.numerics.philox import SRState
    from ue5m3.training.loop import loss_fn

    sr = SRState(0)
    convert(model, recipe, select=models.eligible_linears(model), sr_state=sr)
    names = {id(m.weight_cache): name for name, m in model.named_modules() if isinstance(m, QuantLinear)}
    rows: list[dict] = []
    original = matmul._gemm

    def recording(call, a, b, prepared_b=None):
        config = call.policy.gemm
        if config.model.value == "probe_matched":
            paths = fast_path.probe_paths(
                a[1], b[1], slice_width=config.slice_width, block_m=tiles[0], block_n=tiles[1]
            )
            row = {
                "layer": names[id(call.weights)],
                "gemm": ROLES[a[0].value],
                "shape": [a[1].shape[0], a[1].shape[1], b[1].shape[1]],
                "tile_slices": paths.numel(),
                "exact": int(paths.sum()),
                # the fast kernel leaves a tile with any exact slice whole to the exact kernel
                "flagged_tile_slices": int(paths.any(-1).sum()) * paths.shape[-1],
            }
            if keep_operands(row["layer"]):
                row.update(operands=(a[1], b[1]), gemm_config=config)
            rows.append(row)
        return original(call, a, b, prepared_b)

    for parameter in model.parameters():  # nothing reads the gradients: each goes as soon as it is made
        parameter.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    state = find_scale_state(model)
    if state is not None:
        state.begin_step(1)
    sr.begin_step(1)
    sr.begin_microbatch(0)
    matmul._gemm = recording
    try:
        loss_fn(model, tokens[:, :-1], tokens[:, 1:]).backward()
    finally:
        matmul._gemm = original
    return rows


def summarise(rows: list[dict]) -> dict:
    """Shares of the tile-slices (all weighted alike: the fast kernel's work) on the exact path and in tiles the
    exact kernel computes, per GEMM role and over all, and the five layers-and-roles with the largest shares."""
    per_role: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for row in rows:
        counts = per_role[row["gemm"]]
        for i, key in enumerate(("exact", "flagged_tile_slices", "tile_slices")):
            counts[i] += row[key]
    totals = [sum(c[i] for c in per_role.values()) for i in range(3)]
    top = sorted(rows, key=lambda r: r["exact"] / max(r["tile_slices"], 1), reverse=True)[:5]
    return {
        "share": totals[0] / max(totals[2], 1),
        "flagged_share": totals[1] / max(totals[2], 1),
        "per_gemm": {role: c[0] / max(c[2], 1) for role, c in sorted(per_role.items())},
        "flagged_per_gemm": {role: c[1] / max(c[2], 1) for role, c in sorted(per_role.items())},
        "largest": [{**r, "share": r["exact"] / max(r["tile_slices"], 1)} for r in top],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nemotron_h_debug")
    parser.add_argument(
        "--overrides",
        default=json.dumps(PIPELINE_OVERRIDES),
        help="model overrides as JSON (default: config/config.yaml's CPU training model; {} for none)",
    )
    parser.add_argument("--recipe", default="ue5m3_b16")
    parser.add_argument("--checkpoint", type=Path, action="append", default=[], help="a checkpoint directory")
    parser.add_argument("--init", action="store_true", help="measure the model at init too (the default alone)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sequence", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--tiles", type=int, nargs=2, default=(128, 64), help="output rows and columns per tile (the GPU's: 128 64)"
    )
    parser.add_argument("--out", type=Path, default=Path("results/exact_share.json"))
    args = parser.parse_args(argv)
    from ue5m3 import models
    from ue5m3.layers import recipes
    from ue5m3.training import checkpoint
    from ue5m3.training.config import model_layers

    torch.set_num_threads(args.threads)
    overrides = json.loads(args.overrides)
    vocab = overrides.get("vocab_size", models.config(args.model).vocab_size)
    tokens = torch.randint(0, vocab, (args.batch, args.sequence + 1), generator=torch.Generator().manual_seed(0))
    sources: list[tuple[str, Path | None]] = [("init", None)] if args.init or not args.checkpoint else []
    sources += [(str(path), path) for path in args.checkpoint]
    result = {"model": args.model, "overrides": overrides, "recipe": args.recipe, "tokens": list(tokens.shape)}
    result["tiles"] = list(args.tiles)
    result["sources"] = {}
    for label, path in sources:
        model = models.build(args.model, device="cpu", generator=torch.Generator().manual_seed(0), **overrides)
        if path is not None:
            model.load_state_dict(checkpoint.load_model_state(path))
        recipe = recipes.get(args.recipe).for_model(model_layers(args.model, overrides))
        rows = capture(model, recipe, tokens, tuple(args.tiles))
        result["sources"][label] = {**summarise(rows), "gemms": rows}
        summary = result["sources"][label]
        roles = ", ".join(f"{role} {100 * share:.1f}%" for role, share in summary["per_gemm"].items())
        flagged = ", ".join(f"{role} {100 * share:.1f}%" for role, share in summary["flagged_per_gemm"].items())
        print(f"{args.model} {label}: exact path on {100 * summary['share']:.2f}% of tile-slices ({roles})")
        print(f"    in tiles the exact kernel computes: {100 * summary['flagged_share']:.2f}% ({flagged})")
        for row in summary["largest"]:
            print(f"    {row['layer']} {row['gemm']} {row['shape']}: {100 * row['share']:.1f}%")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
