"""Tests for the training scale lifecycle (numerics spec section 4)."""

from __future__ import annotations

import io
import math
import re
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from ue5m3.numerics.scaling import OperandRole, ScaleState, all_reduce_max

A, W, G = OperandRole.ACTIVATION, OperandRole.WEIGHT, OperandRole.UPSTREAM_GRADIENT
MOD = "model.layers.0.mlp.up_proj"


def with_amax(value: float, shape: tuple[int, ...] = (4, 8), seed: int = 0) -> torch.Tensor:
    """A tensor whose max |x| is exactly ``value`` (attained by a negative entry)."""
    gen = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=gen) * 2 - 1) * value * 0.5
    t.view(-1)[3] = -value
    return t


def refresh_steps(interval: int, first_use: int, last_step: int) -> list[int]:
    """Steps at which a key first used at ``first_use`` refreshes (amax == step each step)."""
    state = ScaleState(interval)
    refreshes = []
    for step in range(1, last_step + 1):
        state.begin_step(step)
        if step >= first_use:
            ref = state.reference(A, MOD, with_amax(float(step)))
            if ref.item() == float(step):
                refreshes.append(step)
            else:
                assert ref.item() == float(refreshes[-1])
    return refreshes


def bits(t: torch.Tensor) -> int:
    return int(t.view(torch.int32).item())


# --------------------------------------------------------------------------- roles


def test_operand_role_values_exact():
    assert [r.value for r in OperandRole] == ["activation", "weight", "upstream_gradient"]
    assert OperandRole("upstream_gradient") is G
    assert A == "activation"
    for alias in ("grad", "gradient", "ACTIVATION", "act", "w"):
        with pytest.raises(ValueError):
            OperandRole(alias)


def test_reference_accepts_role_string_and_rejects_unknown():
    state = ScaleState(5)
    state.begin_step(1)
    assert state.reference("weight", MOD, with_amax(2.0)).item() == 2.0
    assert state.reference(W, MOD, with_amax(9.0)).item() == 2.0  # same key
    with pytest.raises(ValueError, match="'grad'"):
        state.reference("grad", MOD, with_amax(1.0))


# --------------------------------------------------------------------------- schedule


def test_refresh_schedule_first_use_step_1():
    assert refresh_steps(50, 1, 151) == [1, 51, 101, 151]


def test_refresh_schedule_first_use_step_7():
    assert refresh_steps(50, 7, 160) == [7, 57, 107, 157]


def test_current_scaling_interval_1_refreshes_every_step():
    assert refresh_steps(1, 1, 20) == list(range(1, 21))
    state = ScaleState(1)
    for step, amax in enumerate([3.0, 0.5, 100.0, 7.25], start=1):
        state.begin_step(step)
        assert state.reference(G, MOD, with_amax(amax)).item() == amax


def test_not_a_rolling_max():
    state = ScaleState(50)
    state.begin_step(1)
    assert state.reference(A, MOD, with_amax(3.0)).item() == 3.0
    for step in range(2, 51):
        state.begin_step(step)
        assert state.reference(A, MOD, with_amax(1e6 * step)).item() == 3.0
    state.begin_step(51)
    assert state.reference(A, MOD, with_amax(0.125)).item() == 0.125


def test_refresh_uses_current_tensor_amax_in_float32():
    state = ScaleState(3)
    state.begin_step(1)
    x = torch.tensor([[0.1, -1.0 / 3.0], [0.2, 0.3]], dtype=torch.float64)
    ref = state.reference(A, MOD, x)
    assert ref.dtype == torch.float32 and ref.dim() == 0
    assert bits(ref) == bits(torch.tensor(1.0 / 3.0, dtype=torch.float32))
    y = torch.tensor([-2.5, 1.0], dtype=torch.bfloat16)
    assert state.reference(W, MOD, y).item() == 2.5
    assert state.reference(G, MOD, torch.empty(0, 4)).item() == 0.0


def test_gaps_between_steps():
    state = ScaleState(10)
    state.begin_step(1)
    assert state.reference(A, MOD, with_amax(1.0)).item() == 1.0
    state.begin_step(10)
    assert state.reference(A, MOD, with_amax(2.0)).item() == 1.0
    state.begin_step(25)  # 25 - 1 >= 10
    assert state.reference(A, MOD, with_amax(3.0)).item() == 3.0
    state.begin_step(34)
    assert state.reference(A, MOD, with_amax(4.0)).item() == 3.0
    state.begin_step(35)
    assert state.reference(A, MOD, with_amax(5.0)).item() == 5.0


@settings(max_examples=40, deadline=None)
@given(
    interval=st.integers(1, 8),
    gaps=st.lists(st.integers(1, 5), min_size=1, max_size=25),
    first_index=st.integers(0, 10),
)
def test_schedule_matches_oracle(interval, gaps, first_index):
    steps = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    state = ScaleState(interval)
    last = None
    for i, step in enumerate(steps):
        state.begin_step(step)
        if i < first_index:
            continue
        ref = state.reference(W, "m", with_amax(float(step)))
        if last is None or step - last >= interval:
            last = step
        assert ref.item() == float(last)


def test_keys_are_independent():
    state = ScaleState(4)
    state.begin_step(1)
    assert state.reference(A, "a", with_amax(1.0)).item() == 1.0
    assert state.reference(W, "a", with_amax(2.0)).item() == 2.0
    assert state.reference(A, "b", with_amax(3.0)).item() == 3.0
    for step in (2, 3):
        state.begin_step(step)
        assert state.reference(A, "a", with_amax(50.0)).item() == 1.0
        assert state.reference(W, "a", with_amax(50.0)).item() == 2.0
    state.begin_step(4)
    assert state.reference(G, "a", with_amax(4.0)).item() == 4.0  # new key, first seen at 4
    state.begin_step(5)
    assert state.reference(A, "a", with_amax(5.0)).item() == 5.0
    assert state.reference(W, "a", with_amax(6.0)).item() == 6.0
    assert state.reference(A, "b", with_amax(7.0)).item() == 7.0
    assert state.reference(G, "a", with_amax(8.0)).item() == 4.0  # refreshes at 8, not 5
    for step in (6, 7, 8):
        state.begin_step(step)
    assert state.reference(G, "a", with_amax(9.0)).item() == 9.0


@pytest.mark.parametrize("interval", [1, 3])
def test_microbatches_reuse_first_call_of_step(interval):
    state = ScaleState(interval)
    for step in range(1, 8):
        state.begin_step(step)
        first = state.reference(A, MOD, with_amax(10.0 * step))
        for micro in range(1, 4):
            again = state.reference(A, MOD, with_amax(10.0 * step + micro))
            assert bits(again) == bits(first)
        assert first.item() == 10.0 * (step - (step - 1) % interval)  # last refresh: 1, 1 + D, ...


def test_returned_tensor_is_a_copy():
    state = ScaleState(5)
    state.begin_step(1)
    ref = state.reference(A, MOD, with_amax(2.0))
    ref.fill_(99.0)
    assert state.reference(A, MOD, with_amax(3.0)).item() == 2.0


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("bad", [0, -1, 1.0, True, "3", None])
def test_begin_step_rejects_bad_values(bad):
    state = ScaleState(2)
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        state.begin_step(bad)


def test_begin_step_must_strictly_increase():
    state = ScaleState(2)
    state.begin_step(5)
    with pytest.raises(ValueError, match="5"):
        state.begin_step(5)
    with pytest.raises(ValueError, match="4"):
        state.begin_step(4)
    state.begin_step(6)
    assert state.step == 6


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "1"])
def test_interval_validation(bad):
    with pytest.raises(ValueError, match="interval"):
        ScaleState(bad)


def test_reference_before_begin_step_raises():
    state = ScaleState(2)
    with pytest.raises(RuntimeError, match="begin_step"):
        state.reference(A, MOD, with_amax(1.0))


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_amax_raises_naming_role_and_module(bad):
    state = ScaleState(3)
    state.begin_step(1)
    x = with_amax(1.0)
    x[0, 0] = bad
    with pytest.raises(ValueError, match=r"'upstream_gradient'.*'model\.layers\.0\.mlp\.up_proj'"):
        state.reference(G, MOD, x)
    # Nothing was held: the next call for the key refreshes with its own amax.
    assert state.reference(G, MOD, with_amax(2.0)).item() == 2.0


def test_step_property_is_read_only_and_reset():
    state = ScaleState(3)
    assert state.step is None
    state.begin_step(4)
    with pytest.raises(AttributeError):
        state.step = 5  # type: ignore[misc]
    state.reference(A, MOD, with_amax(1.0))
    state.reset()
    assert state.step is None and state.state_dict()["entries"] == {}
    with pytest.raises(RuntimeError):
        state.reference(A, MOD, with_amax(1.0))
    state.begin_step(1)  # counter dropped too
    assert state.reference(A, MOD, with_amax(2.0)).item() == 2.0


# --------------------------------------------------------------------------- resume

KEYS = [(A, "model.layers.0.mlp.up_proj"), (W, "model.layers.0.mlp.up_proj"), (G, "lm_head")]
LATE_KEY = (A, "model.layers.1.attn.q_proj")  # first used at step 7


def run_steps(state: ScaleState, start: int, stop: int) -> list[torch.Tensor]:
    """Quantize-like references for steps [start, stop] with amaxes that change every step."""
    out = []
    for step in range(start, stop + 1):
        state.begin_step(step)
        gen = torch.Generator().manual_seed(1000 + step)
        keys = KEYS + ([LATE_KEY] if step >= 7 else [])
        for _microbatch in range(2):
            for role, module in keys:
                x = torch.randn(16, 32, generator=gen) * (1.0 + torch.rand((), generator=gen) * 100)
                out.append(state.reference(role, module, x))
    return out


def save_load(sd: dict) -> dict:
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_warm_resume_is_bit_exact():
    full = run_steps(ScaleState(50), 1, 120)
    first = ScaleState(50)
    head = run_steps(first, 1, 73)
    resumed = ScaleState(50)
    resumed.load_state_dict(save_load(first.state_dict()))
    assert resumed.step == 73
    tail = run_steps(resumed, 74, 120)
    assert len(head) + len(tail) == len(full)
    assert [bits(t) for t in head + tail] == [bits(t) for t in full]
    assert len({bits(t) for t in full}) > 4  # the references do change


def test_state_dict_contents_are_plain():
    state = ScaleState(50)
    run_steps(state, 1, 9)
    sd = state.state_dict()
    assert sd["interval"] == 50 and sd["step"] == 9
    entry = sd["entries"]["activation/model.layers.1.attn.q_proj"]
    assert entry["last_refresh"] == 7
    assert entry["amax"].dtype == torch.float32 and entry["amax"].dim() == 0
    assert sd["entries"]["upstream_gradient/lm_head"]["last_refresh"] == 1


def test_cold_resume_refreshes_at_first_use_and_differs_from_warm():
    full = run_steps(ScaleState(50), 1, 120)
    first = ScaleState(50)
    run_steps(first, 1, 73)
    sd = save_load(first.state_dict())
    cold = ScaleState(50)
    cold.load_state_dict(sd, cold=True)
    assert cold.step == 73 and cold.state_dict()["entries"] == {}
    tail = run_steps(cold, 74, 120)
    warm_tail = full[-len(tail) :]
    assert [bits(t) for t in tail] != [bits(t) for t in warm_tail]
    # Every key refreshed at step 74 (its first use after the resume) and is held through step 120,
    # whereas the warm run refreshes at 101 (and 107 for the late key).
    at_74 = run_steps(ScaleState(1), 74, 74)
    assert [bits(t) for t in tail] == [bits(t) for t in at_74] * (120 - 73)


def test_load_state_dict_validation():
    state = ScaleState(50)
    run_steps(state, 1, 3)
    sd = state.state_dict()
    with pytest.raises(ValueError, match=r"50.*10|10.*50"):
        ScaleState(10).load_state_dict(sd)
    bad_role = dict(sd, entries={"gradient/lm_head": sd["entries"]["upstream_gradient/lm_head"]})
    with pytest.raises(ValueError, match="'gradient'"):
        ScaleState(50).load_state_dict(bad_role)
    with pytest.raises(ValueError, match="'gradient'"):
        ScaleState(50).load_state_dict(bad_role, cold=True)
    future = {"amax": torch.tensor(1.0), "last_refresh": 4}
    with pytest.raises(ValueError, match="last_refresh"):
        ScaleState(50).load_state_dict(dict(sd, entries={"weight/x": future}))
    nan = {"amax": torch.tensor(math.nan), "last_refresh": 1}
    with pytest.raises(ValueError, match="amax"):
        ScaleState(50).load_state_dict(dict(sd, entries={"weight/x": nan}))
    with pytest.raises(ValueError, match="missing"):
        ScaleState(50).load_state_dict({"interval": 50})
    # A failed load leaves the target untouched.
    target = ScaleState(50)
    target.begin_step(2)
    with pytest.raises(ValueError):
        target.load_state_dict(dict(sd, step=0))
    assert target.step == 2


def test_module_names_with_slashes_round_trip():
    state = ScaleState(5)
    state.begin_step(1)
    state.reference(W, "enc/dec.proj", with_amax(1.5))
    other = ScaleState(5)
    other.load_state_dict(save_load(state.state_dict()))
    other.begin_step(2)
    assert other.reference(W, "enc/dec.proj", with_amax(9.0)).item() == 1.5


# --------------------------------------------------------------------------- distributed


def test_all_reduce_max_is_noop_without_process_group():
    assert not dist.is_initialized()
    t = torch.tensor(2.5)
    assert all_reduce_max(t) is t and t.item() == 2.5


DIST_STEPS = 12
DIST_INTERVAL = 5


def _dist_worker(rank: int, store_path: str, out_dir: str) -> None:
    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    try:
        state = ScaleState(DIST_INTERVAL)
        refs: dict[str, list[float]] = {"a": [], "late": []}
        for step in range(1, DIST_STEPS + 1):
            state.begin_step(step)
            # rank 0 dominates on even steps, rank 1 on odd steps
            amax = float(step * 10 + rank) if (step + rank) % 2 == 0 else float(step)
            refs["a"].append(state.reference(A, "m", with_amax(amax, seed=rank)).item())
            if step >= 3:
                refs["late"].append(state.reference(G, "m", with_amax(amax + 0.5, seed=rank)).item())
        state.begin_step(16)  # "a" last refreshed at 11: refresh now; only rank 0 sees a NaN
        bad = with_amax(1.0)
        if rank == 0:
            bad[0, 0] = math.nan
        try:
            state.reference(A, "m", bad)
            refs["nan_raised"] = [0.0]
        except ValueError:
            refs["nan_raised"] = [1.0]
        torch.save(refs, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_rank_gloo_max_reference_and_schedule(tmp_path):
    mp.spawn(_dist_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0 == r1

    def rank_amax(step: int, rank: int) -> float:
        return float(step * 10 + rank) if (step + rank) % 2 == 0 else float(step)

    def expected(first: int, offset: float) -> list[float]:
        out, held, last = [], None, None
        for step in range(first, DIST_STEPS + 1):
            if last is None or step - last >= DIST_INTERVAL:
                held, last = max(rank_amax(step, r) + offset for r in (0, 1)), step
            out.append(held)
        return out

    assert r0["a"] == expected(1, 0.0)  # refreshes at 1, 6, 11
    assert r0["late"] == expected(3, 0.5)  # refreshes at 3, 8
    assert r0["a"][0] == 11.0 and r0["a"][5] == 60.0  # MAX: rank 1 dominates at 1, rank 0 at 6
    assert r0["nan_raised"] == [1.0]  # both ranks raise, neither hangs
