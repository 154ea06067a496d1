"""Tiny grid-regression control: does the accumulator lattice snap change FP4 training at all? (gemm spec §4).

Paper appendix C's control: a teacher-student regression MLP 256 -> 256 -> 64 (SiLU hidden, no biases, 81,920
parameters) trained for 500 AdamW steps with both linears converted to FP4 (UE5M3 B16, T = 448 for every role,
D = 50, 2D weights, no RHT, all three GEMMs ``probe_matched`` with 64-wide slices and RTZ cross-slice adds),
first without the snap, then snapped to a 1/d lattice for d in {256, ..., 4096}. The claim: every loss,
gradient norm and final parameter is bit-identical across all six grid settings, for every seed and for both
upstream-gradient roundings. Paper: mean final eval MSE BF16 0.001956, quantized 0.027130 (RNE) / 0.027578 (SR).

Choices this module makes (the spec leaves them open):

* Data per seed, from one ``torch.Generator`` seeded with the seed, in this order: teacher weights
  N(0,1)/sqrt(fan_in) (up, down), 2,048 train and 1,024 eval inputs N(0,1) rounded to BF16 (held as FP32 values),
  student noise 0.25 N(0,1)/sqrt(fan_in) (up, down), then the batch order (a fresh permutation per epoch).
  Targets are the teacher's FP32 forward pass on the BF16-valued inputs.
* Quantized arms: the recipe is ``ue5m3_b16`` with the overrides above; student activations between the layers
  and the outputs stay FP32 (``QuantLinear`` returns FP32 for FP32 inputs). ``"rne"`` sets the upstream-gradient
  rounding to RNE; ``"sr"`` keeps the recipe's own stochastic rounding (``sf``, 8 random bits per element). Those
  bits are the Philox streams of the run seed (:class:`~ue5m3.numerics.philox.SRState`), so every grid setting
  draws the same bits; the caller's RNG state is untouched.
* BF16 arm (``rounding="bf16"``): FP32 master weights; each linear multiplies BF16-cast operands (activation
  and weight) with a BF16 result, as autocast would, and autograd carries the BF16 casts into the backward.
* Evaluation: the student's forward on the eval inputs in the arm's numerics; quantized arms evaluate with a
  fresh current-scaling reference state (interval 1) and no stochastic rounding.
* Grad norm: the L2 norm over all parameter gradients before the optimizer step; the parameter hash is the
  SHA-256 of the FP32 bytes of the parameters in ``named_parameters`` order.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ue5m3 import logs
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.layers import recipes
from ue5m3.layers.linear import QuantLinear, convert, find_quant_stats
from ue5m3.layers.recipes import Recipe
from ue5m3.numerics.exact import is_grid
from ue5m3.numerics.formats import Rounding
from ue5m3.numerics.philox import SRState
from ue5m3.numerics.scaling import ScaleState

__all__ = [
    "GridControlConfig",
    "RunResult",
    "GridControlResult",
    "TeacherStudentMLP",
    "arm_recipe",
    "params_sha256",
    "run_one",
    "run",
    "write",
]

logger = logging.getLogger(__name__)

D_IN, D_HIDDEN, D_OUT = 256, 256, 64
ROUNDINGS = ("rne", "sr")


@dataclass(frozen=True, kw_only=True)
class GridControlConfig:
    """Configuration of the grid control (defaults: the paper's setup).

    Attributes:
        seeds: one run per seed and arm; each seed fixes data, teacher, student and batch order.
        grids: lattice denominators d of the snap; None is the unsnapped probe_matched GEMM.
        roundings: upstream-gradient roundings of the quantized arms, from ``("rne", "sr")``.
        bf16_baseline: also train the unquantized BF16 arm once per seed.
        steps: AdamW steps per run.
        batch_size: examples per step (must divide train_examples).
        lr: AdamW learning rate.
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        train_examples: training inputs per seed.
        eval_examples: evaluation inputs per seed.
        student_noise: student = teacher + student_noise * N(0,1)/sqrt(fan_in).
        target: tensor-scale target T of every operand role.
        interval: refresh interval D of the tensor references.
    """

    seeds: tuple[int, ...] = (41, 42, 43)
    grids: tuple[int | None, ...] = (None, 256, 512, 1024, 2048, 4096)
    roundings: tuple[str, ...] = ROUNDINGS
    bf16_baseline: bool = True
    steps: int = 500
    batch_size: int = 128
    lr: float = 0.002
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    train_examples: int = 2048
    eval_examples: int = 1024
    student_noise: float = 0.25
    target: float = 448.0
    interval: int = 50

    RANGES: ClassVar[dict[str, Range]] = {
        "seeds": Range(0, 2**63 - 1, note="a seed"),
        "grids": Range(2, 2**24, note="a lattice denominator, null: unsnapped"),
        "steps": Range(1, 10**6, note="AdamW steps per run; the paper: 500"),
        "batch_size": Range(1, 2**16, note="examples per step"),
        "lr": Range(0, 1, low_open=True, note="AdamW learning rate; the default: 2e-3"),
        "betas": Range(0, 1, high_open=True, note="AdamW betas"),
        "weight_decay": Range(0, 1, note="AdamW weight decay"),
        "train_examples": Range(1, 2**24, note="training inputs per seed"),
        "eval_examples": Range(1, 2**24, note="evaluation inputs per seed"),
        "student_noise": Range(0, 100, note="noise of the student around the teacher"),
        "target": Range(1, 2**16, note="a tensor-scale target T; the paper: 448 to 4096"),
        "interval": Range(1, 10**6, note="refresh interval D of the references; the paper: 50"),
    }

    def __post_init__(self) -> None:
        def require(ok: bool, key: str, what: str) -> None:
            if not ok:
                raise ValueError(f"grid_control.{key} must be {what}, got {getattr(self, key)!r}")

        for key in ("steps", "batch_size", "train_examples", "eval_examples", "interval"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"grid_control.{key} must be an int, got {value!r}")
            require(value >= 1, key, ">= 1")
        require(self.train_examples % self.batch_size == 0, "train_examples", "a multiple of batch_size")
        ints = all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds)
        require(bool(self.seeds) and ints and len(set(self.seeds)) == len(self.seeds), "seeds", "distinct ints >= 0")
        grids_ok = all(is_grid(g) for g in self.grids)
        grids_ok = bool(self.grids) and grids_ok and len(set(self.grids)) == len(self.grids)
        require(grids_ok, "grids", "distinct entries, each None or a power of two >= 2")
        ok = bool(self.roundings) and len(set(self.roundings)) == len(self.roundings)
        require(ok and set(self.roundings) <= set(ROUNDINGS), "roundings", f"distinct names from {list(ROUNDINGS)}")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", "two numbers in [0, 1)")
        for key in ("lr", "student_noise", "target"):
            require(0 < getattr(self, key) < math.inf, key, "positive and finite")
        require(0 <= self.weight_decay < math.inf, "weight_decay", ">= 0")


class TeacherStudentMLP(nn.Module):
    """``down(silu(up(x)))`` without biases; ``operand_dtype=torch.bfloat16`` casts each linear's operands."""

    def __init__(self, operand_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.up = nn.Linear(D_IN, D_HIDDEN, bias=False)
        self.down = nn.Linear(D_HIDDEN, D_OUT, bias=False)
        self.operand_dtype = operand_dtype

    def _linear(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.operand_dtype is None or not isinstance(layer, nn.Linear):
            return layer(x)
        return F.linear(x.to(self.operand_dtype), layer.weight.to(self.operand_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(self.down, F.silu(self._linear(self.up, x))).float()  # [N, 256] -> [N, 64]


@dataclass(frozen=True)
class RunResult:
    """One training run: per-step curves, final eval MSE and the hash of the final parameters."""

    seed: int
    grid: int | None
    rounding: str
    losses: tuple[float, ...]
    grad_norms: tuple[float, ...]
    final_eval_mse: float
    params_sha256: str


def arm_recipe(cfg: GridControlConfig, grid: int | None, rounding: str) -> Recipe:
    """The ``ue5m3_b16`` recipe with the control's overrides for one (grid, rounding) arm."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {list(ROUNDINGS)} for a quantized arm, got {rounding!r}")
    base = recipes.get("ue5m3_b16").to_dict()
    roles = {role: {**spec, "target": cfg.target, "rht": False} for role, spec in base["roles"].items()}
    roles["weight"]["two_d"] = True
    if rounding == "rne":
        roles["upstream_gradient"]["rounding"] = "rne"
    assert Rounding(roles["upstream_gradient"]["rounding"]).random_bit_count > 0 or rounding == "rne"
    gemm = {"model": "probe_matched", "slice_width": 64, "cross_slice_rounding": "rtz", "final_grid": grid}
    overrides = {"interval": cfg.interval, "roles": roles, "gemm": gemm, "target_overrides": [], "bf16_layers": []}
    name = f"grid_control_{rounding}_{grid or 'none'}"
    return Recipe.from_dict({**base, "name": name, "description": f"gemm spec 4 grid control, {name}", **overrides})


def _data(cfg: GridControlConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def weights(out: int, inp: int, scale: float = 1.0) -> torch.Tensor:
        return scale * torch.randn(out, inp, generator=gen) / math.sqrt(inp)

    d = {"t_up": weights(D_HIDDEN, D_IN), "t_down": weights(D_OUT, D_HIDDEN)}
    for split, n in (("train", cfg.train_examples), ("eval", cfg.eval_examples)):
        d[f"x_{split}"] = torch.randn(n, D_IN, generator=gen).bfloat16().float()  # BF16 values, FP32 storage
    d["s_up"] = d["t_up"] + weights(D_HIDDEN, D_IN, cfg.student_noise)
    d["s_down"] = d["t_down"] + weights(D_OUT, D_HIDDEN, cfg.student_noise)
    epochs = -(-cfg.steps * cfg.batch_size // cfg.train_examples)
    order = torch.cat([torch.randperm(cfg.train_examples, generator=gen) for _ in range(epochs)])
    d["batches"] = order[: cfg.steps * cfg.batch_size].reshape(cfg.steps, cfg.batch_size)  # [steps, batch]
    with torch.no_grad():  # targets: the teacher's FP32 forward pass
        for split in ("train", "eval"):
            d[f"y_{split}"] = F.silu(d[f"x_{split}"] @ d["t_up"].T) @ d["t_down"].T
    return d


def _build(
    data: dict[str, torch.Tensor], cfg: GridControlConfig, grid: int | None, rounding: str, seed: int
) -> nn.Module:
    model = TeacherStudentMLP(operand_dtype=torch.bfloat16 if rounding == "bf16" else None)
    with torch.no_grad():
        model.up.weight.copy_(data["s_up"])
        model.down.weight.copy_(data["s_down"])
    if rounding != "bf16":  # the SR stream of the seed: identical random bits for every grid setting
        convert(model, arm_recipe(cfg, grid, rounding), select=["up", "down"], sr_state=SRState(seed))
    return model


def params_sha256(model: nn.Module) -> str:
    """SHA-256 over the FP32 bytes of the parameters, in ``named_parameters`` order."""
    digest = hashlib.sha256()
    for _, p in model.named_parameters():
        digest.update(p.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def run_one(cfg: GridControlConfig, seed: int, grid: int | None, rounding: str) -> RunResult:
    """Train one student and evaluate it.

    Args:
        cfg: the control's configuration.
        seed: data, initialisation, batch-order and stochastic-rounding seed.
        grid: snap denominator d, or None for no snap (must be None for the BF16 arm).
        rounding: ``"rne"`` or ``"sr"`` (quantized arms, upstream-gradient rounding) or ``"bf16"``.

    Raises:
        ValueError: an unknown rounding, or a grid with the BF16 arm.
    """
    if rounding == "bf16" and grid is not None:
        raise ValueError(f"the bf16 arm has no GEMM snap; use grid=None, got {grid!r}")
    data = _data(cfg, seed)
    with torch.random.fork_rng(devices=[]):  # nn.Linear's init and the SR bits leave the caller's RNG alone
        model = _build(data, cfg, grid, rounding, seed)
        quant = [m for m in model.modules() if isinstance(m, QuantLinear)]
        state = quant[0].scale_state if quant else None
        sr = quant[0].sr_state if quant else None
        stats = find_quant_stats(model)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        losses, norms = [], []
        for step, idx in enumerate(data["batches"], start=1):
            if state is not None:
                state.begin_step(step)
            if sr is not None:
                sr.begin_step(step)
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(data["x_train"][idx]), data["y_train"][idx])
            loss.backward()
            if stats is not None:  # the step's one read of the quantizers' deferred finiteness checks
                stats.checks.raise_if_any()
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
            opt.step()
            losses.append(loss.item())
            norms.append(norm.item())
    eval_state = ScaleState(1)  # evaluation: current-scaling references, no stochastic rounding
    eval_state.begin_step(1)
    for m in quant:
        m.scale_state = eval_state
        m.set_inference(True)
    with torch.no_grad():
        mse = F.mse_loss(model(data["x_eval"]), data["y_eval"]).item()
    return RunResult(seed, grid, rounding, tuple(losses), tuple(norms), mse, params_sha256(model))


def _signature(r: RunResult) -> tuple:
    return r.losses, r.grad_norms, r.params_sha256


@dataclass(frozen=True)
class GridControlResult:
    """All runs of one control; quantized runs are compared bit for bit across grid settings."""

    config: GridControlConfig
    runs: tuple[RunResult, ...]

    @property
    def bitwise_identical_across_grids(self) -> dict[tuple[int, str], bool]:
        """Per (seed, rounding): whether losses, grad norms and final parameters agree exactly across grids."""
        groups: dict[tuple[int, str], set] = {}
        for r in self.runs:
            if r.rounding != "bf16":
                groups.setdefault((r.seed, r.rounding), set()).add(_signature(r))
        return {key: len(sigs) == 1 for key, sigs in groups.items()}

    @property
    def mean_eval_mse(self) -> dict[str, float]:
        """Mean final eval MSE per arm (``"bf16"``, ``"rne"``, ``"sr"``) over seeds and grids."""
        arms: dict[str, list[float]] = {}
        for r in self.runs:
            arms.setdefault(r.rounding, []).append(r.final_eval_mse)
        return {arm: sum(v) / len(v) for arm, v in arms.items()}

    def summary_rows(self) -> list[dict[str, object]]:
        """One row per run: rounding, grid, seed, final eval MSE, parameter hash and its group's identity flag."""
        same = self.bitwise_identical_across_grids
        return [
            {
                "rounding": r.rounding,
                "grid": r.grid,
                "seed": r.seed,
                "final_eval_mse": r.final_eval_mse,
                "params_sha256": r.params_sha256,
                "bit_identical_across_grids": same.get((r.seed, r.rounding)),
            }
            for r in self.runs
        ]


def run(cfg: GridControlConfig, *, progress: bool = True) -> GridControlResult:
    """Every run of the control: per seed the BF16 arm (if enabled), then each rounding x grid."""
    arms = [(seed, None, "bf16") for seed in cfg.seeds] if cfg.bf16_baseline else []
    arms += [(s, g, r) for s in cfg.seeds for r in cfg.roundings for g in cfg.grids]
    runs = []
    with logs.Progress("grid control", total=len(arms), unit="run", logger=logger, enabled=progress) as bar:
        for arm in arms:
            runs.append(run_one(cfg, *arm))
            bar.update()
    return GridControlResult(cfg, tuple(runs))


def _grid_label(grid: int | None) -> str:
    return "none" if grid is None else str(grid)


def write(result: GridControlResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``runs.csv``, ``curves.csv`` (per step) and ``summary.json`` (with provenance) atomically."""
    out = Path(out_dir)
    paths = {"runs": out / "runs.csv", "curves": out / "curves.csv", "summary": out / "summary.json"}
    rows = [{**row, "grid": _grid_label(row["grid"])} for row in result.summary_rows()]
    write_csv(paths["runs"], rows, list(rows[0]) if rows else ["rounding"])
    curves = [
        {"rounding": r.rounding, "grid": _grid_label(r.grid), "seed": r.seed, "step": step, "loss": loss}
        | {"grad_norm": norm}
        for r in result.runs
        for step, (loss, norm) in enumerate(zip(r.losses, r.grad_norms, strict=True), start=1)
    ]
    write_csv(paths["curves"], curves, ["rounding", "grid", "seed", "step", "loss", "grad_norm"])
    same = result.bitwise_identical_across_grids
    cfg = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(result.config).items()}
    summary = {
        "bitwise_identical_across_grids": {f"{seed}/{rounding}": v for (seed, rounding), v in same.items()},
        "all_bitwise_identical": all(same.values()),
        "mean_eval_mse": result.mean_eval_mse,
        "provenance": provenance("grid-control", cfg, recipe_base="ue5m3_b16"),
    }
    write_json(paths["summary"], summary)
    return paths
