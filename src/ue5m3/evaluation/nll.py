"""Validation NLL of a checkpoint with the paper's protocol, and its uncertainty (experiments spec section 4).

Protocol: batch-1 windows of ``sequence_length + 1`` tokens in a fixed order, no padding; the body runs on
``tokens[:-1]`` (one work unit per sequence, see :mod:`ue5m3.evaluation.inference`), the head runs in FP32 in
chunks of 256 positions, the cross entropy is per token in FP32 and each sequence's sum is accumulated in FP64;
NLL = total / tokens, perplexity = exp(NLL), percent vs BF16 = 100 * (bf16 - candidate) / bf16.

Uncertainty: per-sequence (NLL sum, tokens) pairs give a sequence bootstrap for one model
(:func:`bootstrap_interval`) and a paired sequence bootstrap for the difference of two models on the same
sequences (:func:`paired_bootstrap`); both are seeded. Cold D = 50 replay is order-dependent, so its spread comes
from several evaluation orders (:func:`order_summary`: mean, min, max and a Student-t interval over orders).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ue5m3 import config
from ue5m3.artifacts import provenance, write_csv, write_json
from ue5m3.config import Range
from ue5m3.evaluation.inference import InferenceModel, InferencePolicy, load_for_inference, order_id
from ue5m3.evaluation.nll_records import load_results, order_summary, percent_vs_bf16, t_quantile
from ue5m3.logs import Progress
from ue5m3.training.config import read_run_config

__all__ = [
    "NllConfig",
    "HEAD_CHUNK",
    "SequenceNLL",
    "sequence_nll",
    "bootstrap_interval",
    "paired_bootstrap",
    "order_summary",
    "evaluation_orders",
    "percent_vs_bf16",
    "t_quantile",
    "run_nll",
    "load_results",
]

HEAD_CHUNK = 256
"""Positions per FP32 head chunk (bounds logit memory at V = 131,072)."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class NllConfig:
    """Settings of ``ue5m3 evaluate-nll`` (the pipeline's ``evaluation.nll``); which checkpoint and policy a job
    evaluates are its arguments.

    Attributes:
        replay_orders: evaluation orders of the order-dependent ``cold_d50_replay`` policy (order 0 is the set's
            fixed order, the others seeded permutations); the stateless policies are evaluated once.
        seed: seed of the extra orders and of the sequence bootstrap.
        bootstrap_samples: sequence-bootstrap resamples of a stateless policy's 95% interval.
        force_bf16: allow policy ``bf16`` on a quantized run (its weights evaluated unquantized).
    """

    replay_orders: int = 1
    seed: int = 0
    bootstrap_samples: int = 2000
    force_bf16: bool = False

    RANGES: ClassVar[dict[str, Range]] = {
        "replay_orders": Range(1, 10**4, note="evaluation orders of the cold replay; the paper: 3"),
        "seed": Range(0, 2**63 - 1, note="a seed"),
        "bootstrap_samples": Range(1, 10**7, note="bootstrap resamples; the default: 2,000"),
    }

    def __post_init__(self) -> None:
        if self.replay_orders < 1:
            raise ValueError(f"replay_orders: at least 1 evaluation order, got {self.replay_orders!r}")
        if self.seed < 0:
            raise ValueError(f"seed: a non-negative int, got {self.seed!r}")
        if self.bootstrap_samples < 1:
            raise ValueError(f"bootstrap_samples: at least 1 resample, got {self.bootstrap_samples!r}")

    def orders_for(self, policy: InferencePolicy) -> int:
        """How many orders ``policy`` is evaluated in (only the cold replay depends on the order)."""
        return self.replay_orders if policy is InferencePolicy.COLD_D50_REPLAY else 1


@dataclass(frozen=True)
class SequenceNLL:
    """Per-sequence results of one evaluation, indexed by the sequence's position in the validation set.

    Attributes:
        nll_sum: float64 [N], each sequence's summed token NLL.
        tokens: int64 [N], each sequence's evaluated tokens.
        order: the order the sequences were evaluated in (indices into the set).
    """

    nll_sum: np.ndarray
    tokens: np.ndarray
    order: tuple[int, ...]

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum())

    @property
    def nll(self) -> float:
        """Token-weighted mean NLL (FP64 total / tokens)."""
        return float(self.nll_sum.sum() / self.tokens.sum())


def _sequence_sum(loaded: InferenceModel, inputs: torch.Tensor, targets: torch.Tensor, chunk: int) -> float:
    hidden = loaded.forward_unit(inputs, return_hidden=True)  # [1, T, hidden]
    hidden, targets = hidden[0], targets[0].to(hidden.device)  # [T, hidden], [T]
    total = torch.zeros((), dtype=torch.float64, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        logits = loaded.head(hidden[start : start + chunk])  # [<=chunk, V] FP32
        losses = F.cross_entropy(logits, targets[start : start + chunk], reduction="none")  # FP32 per token
        total += losses.to(torch.float64).sum()
    return float(total)


def sequence_nll(
    loaded: InferenceModel, eval_set: Any, *, order: Sequence[int] | None = None, chunk: int = HEAD_CHUNK
) -> SequenceNLL:
    """Evaluate every window of ``eval_set`` once, one work unit per sequence, in ``order``.

    Args:
        loaded: the model from :func:`ue5m3.evaluation.inference.load_for_inference`.
        eval_set: a :class:`ue5m3.data.EvalSet` (``windows`` int64 [N, L + 1]).
        order: a permutation of range(N) (default: the set's fixed order).
        chunk: head positions per FP32 chunk.

    Raises:
        ValueError: ``order`` is not a permutation of the set's indices.
    """
    windows = eval_set.windows
    count = int(windows.shape[0])
    order = tuple(range(count)) if order is None else tuple(int(i) for i in order)
    if sorted(order) != list(range(count)):
        raise ValueError(f"order must be a permutation of range({count}), got {list(order)[:10]}...")
    sums, tokens = np.zeros(count, dtype=np.float64), np.zeros(count, dtype=np.int64)
    total, seen = 0.0, 0  # the running NLL shown with the progress
    with Progress("validation NLL", total=count, unit="window", logger=logger) as progress:
        for index in order:
            window = windows[index]
            inputs, targets = window[None, :-1], window[None, 1:]  # [1, L] each
            sums[index] = _sequence_sum(loaded, inputs, targets, chunk)
            tokens[index] = targets.numel()
            total, seen = total + sums[index], seen + int(tokens[index])
            progress.update(figures={"nll": f"{total / seen:.5f}", "tokens": seen})
    return SequenceNLL(nll_sum=sums, tokens=tokens, order=order)


# ----- uncertainty --------------------------------------------------------------------------------------


def _percentiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1 - level) / 2
    low, high = np.quantile(stats, [alpha, 1 - alpha])
    return float(low), float(high)


def _check_level(level: float, samples: int) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples!r}")


def bootstrap_interval(
    result: SequenceNLL, *, samples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile sequence-bootstrap interval of one model's NLL (resampling whole sequences; seeded)."""
    _check_level(level, samples)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(result.tokens), size=(samples, len(result.tokens)))  # [samples, N]
    stats = result.nll_sum[idx].sum(axis=1) / result.tokens[idx].sum(axis=1)
    return _percentiles(stats, level)


def paired_bootstrap(
    a_seq: SequenceNLL, b_seq: SequenceNLL, *, samples: int = 2000, seed: int = 0, level: float = 0.95
) -> dict[str, float]:
    """Paired sequence bootstrap of NLL(a) - NLL(b) on the same sequences (one index draw serves both models).

    Returns:
        ``{"difference", "low", "high", "level"}``.

    Raises:
        ValueError: the two results do not cover the same sequences with the same token counts.
    """
    _check_level(level, samples)
    if a_seq.tokens.shape != b_seq.tokens.shape or not np.array_equal(a_seq.tokens, b_seq.tokens):
        raise ValueError("paired_bootstrap needs both results on the same sequences with the same token counts")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a_seq.tokens), size=(samples, len(a_seq.tokens)))  # [samples, N]
    tokens = a_seq.tokens[idx].sum(axis=1)
    stats = (a_seq.nll_sum[idx].sum(axis=1) - b_seq.nll_sum[idx].sum(axis=1)) / tokens
    low, high = _percentiles(stats, level)
    return {"difference": a_seq.nll - b_seq.nll, "low": low, "high": high, "level": level}


def evaluation_orders(count: int, orders: int, *, seed: int) -> list[tuple[int, ...]]:
    """Order 0 is the set's fixed order; order k > 0 is a permutation drawn with seed ``seed + k``."""
    if orders < 1:
        raise ValueError(f"orders must be >= 1, got {orders!r}")
    out = [tuple(range(count))]
    for k in range(1, orders):
        perm = torch.randperm(count, generator=torch.Generator().manual_seed(seed + k))
        out.append(tuple(int(i) for i in perm))
    return out


# ----- the CLI's library call ---------------------------------------------------------------------------


def _open_eval_sets(run_dir: Path) -> tuple[Any, Any]:
    from ue5m3 import data

    cfg = read_run_config(run_dir)
    opened = data.open_data(cfg.require_data())
    return opened.validation, opened.calibration


def run_nll(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    policy: InferencePolicy | str,
    step: int | None = None,
    cfg: NllConfig | None = None,
    orders: int | None = None,
    validation: Any = None,
    calibration: Any = None,
) -> dict[str, Any]:
    """Evaluate a checkpoint's validation NLL and write ``out`` (JSON) and ``<out stem>.sequences.csv``.

    Args:
        run_dir: the training run directory.
        out: the JSON result to write (atomically; nothing is written if evaluation fails).
        policy: the inference policy.
        step: checkpoint step (default: newest).
        cfg: the settings (:class:`NllConfig`; its defaults when None).
        orders: evaluation orders, overriding :meth:`NllConfig.orders_for` (``cold_d50_replay`` only may use more
            than one; order 0 is the fixed order).
        validation, calibration: EvalSets (default: opened from the run's data section).

    Returns:
        The written JSON record.
    """
    policy = InferencePolicy(policy)
    cfg = cfg if cfg is not None else NllConfig()
    seed, bootstrap_samples, force_bf16 = cfg.seed, cfg.bootstrap_samples, cfg.force_bf16
    orders = cfg.orders_for(policy) if orders is None else orders
    run_dir = Path(run_dir)
    if orders > 1 and policy is not InferencePolicy.COLD_D50_REPLAY:
        raise ValueError(f"policy {policy.value!r} is order-independent; use orders=1 (got {orders!r})")
    if validation is None:
        validation, default_calibration = _open_eval_sets(run_dir)
        calibration = default_calibration if calibration is None else calibration
    if policy is not InferencePolicy.CALIBRATED_FROZEN:
        calibration = None
    results, identity = [], {}
    for order in evaluation_orders(len(validation), orders, seed=seed):
        loaded = load_for_inference(
            run_dir, step, policy=policy, calibration=calibration, validation=validation, force_bf16=force_bf16
        )  # fresh (cold) state for every order
        identity = loaded.identity
        results.append(sequence_nll(loaded, validation, order=order))
    first = results[0]
    total = first.total_tokens
    expected = int(validation.windows.shape[0]) * (int(validation.windows.shape[1]) - 1)
    if total != expected:
        raise RuntimeError(f"token accounting: evaluated {total} tokens, expected {expected}")
    record = provenance(
        "evaluate-nll",
        {"run_dir": str(run_dir), "step": step, "policy": policy.value, "orders": orders, **config.dump(cfg)},
        **identity,
        validation_sha256=validation.sha256(),
        sequences=len(validation),
        tokens=total,
        evaluation_order_ids=[order_id(r.order) for r in results],
        nll=first.nll,
        perplexity=math.exp(first.nll),
        order_nll=[r.nll for r in results],
    )
    if policy is InferencePolicy.COLD_D50_REPLAY:
        record["order_summary"] = order_summary([r.nll for r in results])
    else:
        low, high = bootstrap_interval(first, samples=bootstrap_samples, seed=seed)
        record["bootstrap_95"] = {"low": low, "high": high, "samples": bootstrap_samples, "seed": seed}
    out = Path(out)
    rows = [
        {
            "sequence": i,
            "tokens": int(first.tokens[i]),
            **{f"nll_sum_order{k}": float(r.nll_sum[i]) for k, r in enumerate(results)},
        }
        for i in range(len(first.tokens))
    ]
    fields = ["sequence", "tokens", *[f"nll_sum_order{k}" for k in range(len(results))]]
    write_csv(out.with_name(out.stem + ".sequences.csv"), rows, [*fields])
    write_json(out, record)
    return record
