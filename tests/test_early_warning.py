"""The early warning validated on trained runs with injected instabilities (issue 26, item 6).

Tiny runs of the dense debug model (vocabulary 256, 4 x 32 tokens a step, AdamW at 3e-3, every step logged) train
through the trainer (``loop.train``: the metrics.jsonl it writes is what the warning reads) on a learnable stream (a
fixed permutation of the vocabulary gives each next token, 10% of them random), so a healthy run's loss falls
from 5.5 to about 2 in 40 steps. Injected, each on the study's reference arm ``ue5m3_t448`` (UE5M3, T = 448,
D = 50) unless named:

* a learning-rate spike: from step 20 the rate grows 30% a step (x 2.6 by step 24, x 50 by step 34);
* stale references with a large D: D = 10^6 (the references of step 1 are held for the whole run) under a rate
  that grows 15% a step from step 10, gentle enough that the loss keeps falling for 20 steps;
* too small a T: T = 1/1024 on every role, so most blocks' scales round to zero before the repair (and on E4M3
  scales, ``e4m3_t448``, T = 1/16: a third of the blocks sit at E4M3's smallest code).

The spike and the stale references are flagged a stated number of logged steps before they diverge (a nat above
their first logged loss): at least 1 for the spike (an optimizer instability: the held references see it only as
it happens; measured: flagged at step 33, diverged at 34) and at least 10 for the stale references (their headroom
margin climbs for many steps before they saturate; measured: flagged at 28 and diverged at 45 on one machine, 30
and 49 on another CPU (trajectories differ by machine), so the run has 64 steps of room). Too small a T is
flagged from the first step; at this scale it does not diverge (nor fall behind the healthy run). The healthy
runs (UE5M3, E4M3 and UE8M0 scales) are never flagged and never diverge.
"""

from __future__ import annotations

import pytest
import torch

from ue5m3.experiments import early_warning
from ue5m3.training import loop
from ue5m3.training.config import OptimConfig, TrainConfig

pytestmark = pytest.mark.slow

VOCAB, SEQUENCE, BATCH = 256, 32, 4


class PermutationStream:
    """Each next token is a fixed permutation of the previous one, 10% of them uniformly random (learnable)."""

    def __init__(self, seed: int = 0) -> None:
        self.perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1234))
        self.seed, self.cursor, self.sequence_length, self.vocab_size = seed, 0, SEQUENCE, VOCAB

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.cursor)
        self.cursor += 1
        tokens = torch.empty(batch_size, SEQUENCE + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, VOCAB, (batch_size,), generator=g)
        noise = torch.rand(batch_size, SEQUENCE + 1, generator=g) < 0.1
        random = torch.randint(0, VOCAB, (batch_size, SEQUENCE + 1), generator=g)
        for t in range(1, SEQUENCE + 1):
            tokens[:, t] = torch.where(noise[:, t], random[:, t], self.perm[tokens[:, t - 1]])
        return tokens[:, :-1], tokens[:, 1:]

    def state_dict(self) -> dict:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])


def _roles(target: float) -> dict:
    return {
        role: {"rounding": rounding, "target": target, "two_d": two_d, "rht": False}
        for role, rounding, two_d in (("activation", "rne", False), ("weight", "rne", True),
                                      ("upstream_gradient", "sf", False))
    }  # fmt: skip


def _train(tmp_path, monkeypatch, name, steps, *, recipe="ue5m3_t448", overrides=None, ramp=None):
    """Train one run; its logged records and the step it stopped on with a non-finite value (None: finished)."""
    lr_at = loop.lr_at
    if ramp is not None:
        start, growth = ramp
        monkeypatch.setattr(loop, "lr_at", lambda s, n, o: lr_at(s, n, o) * growth ** max(0, s - start + 1))
    cfg = TrainConfig(
        run_dir=str(tmp_path / name),
        model="dense_debug",
        model_overrides={"vocab_size": VOCAB},
        recipe=recipe,
        recipe_overrides=overrides or {},
        seed=1,
        steps=steps,
        micro_batch=BATCH,
        accumulation=1,
        data=None,
        log_every=1,
        checkpoint_every=1000,
        optim=OptimConfig(lr=3e-3, decay_fraction=0.0),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    stopped = None
    try:
        loop.train(cfg, PermutationStream())
    except loop.NonFiniteError:
        stopped = len(early_warning.read_records(cfg.run_dir)) + 1
    finally:
        torch.set_num_threads(threads)
        monkeypatch.setattr(loop, "lr_at", lr_at)
    return early_warning.read_records(cfg.run_dir), stopped


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("early_warning")
    try:
        return {
            "healthy_ue5m3": _train(tmp, monkeypatch, "healthy_ue5m3", 40),
            "healthy_e4m3": _train(tmp, monkeypatch, "healthy_e4m3", 40, recipe="e4m3_t448"),
            "healthy_ue8m0": _train(tmp, monkeypatch, "healthy_ue8m0", 40, recipe="ue8m0_rceil_b16"),
            "spike": _train(tmp, monkeypatch, "spike", 36, ramp=(20, 1.3)),
            "stale": _train(tmp, monkeypatch, "stale", 64, overrides={"interval": 10**6}, ramp=(10, 1.15)),
            "small_t": _train(tmp, monkeypatch, "small_t", 24, overrides={"roles": _roles(1 / 1024)}),
            "small_t_e4m3": _train(
                tmp, monkeypatch, "small_t_e4m3", 24, recipe="e4m3_t448", overrides={"roles": _roles(1 / 16)}
            ),
        }
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("name", ["healthy_ue5m3", "healthy_e4m3", "healthy_ue8m0"])
def test_healthy_runs_learn_and_are_never_flagged(runs, name):
    records, stopped = runs[name]
    assert stopped is None and len(records) == 40
    assert records[-1]["loss"] < records[0]["loss"] - 2  # they learn: 5.6 -> below 3.6
    assert early_warning.scan(records) == []
    assert early_warning.diverged(records) is None


# (run, the least lead in logged steps, the condition that flags it first)
INJECTED = [("spike", 1, "headroom_margin"), ("stale", 10, "headroom_margin")]


@pytest.mark.parametrize(("name", "lead", "reason"), INJECTED, ids=[i[0] for i in INJECTED])
def test_injected_instabilities_are_flagged_before_the_loss_diverges(runs, name, lead, reason):
    records, stopped = runs[name]
    step = early_warning.diverged(records, stopped_at=stopped)
    flags = early_warning.scan(records)
    assert step is not None, f"{name}: the injected instability did not diverge"
    assert flags and reason in flags[0].reasons, f"{name}: not flagged by {reason}: {flags[:1]}"
    assert step - flags[0].step >= lead, f"{name}: flagged at {flags[0].step} ({flags[0].describe()}), diverged {step}"


@pytest.mark.parametrize(("name", "reason"), [("small_t", "zero_rounded_share"), ("small_t_e4m3", "bottom_code_share")])
def test_too_small_a_t_is_flagged_from_the_first_step(runs, name, reason):
    """T = 1/1024 puts most UE5M3 blocks' scales below its smallest code (the repair lifts them to it: the
    zero-rounded share), T = 1/16 a third of E4M3's at its smallest code (the bottom-code share); both are flagged
    at every logged step from the first. At this scale neither diverges nor falls behind its healthy twin: a warning
    of a misplaced scale, not of a loss to come."""
    records, stopped = runs[name]
    flags = early_warning.scan(records)
    assert stopped is None and len(records) == 24
    assert [f.step for f in flags] == list(range(1, 25)) and reason in flags[0].reasons
    step = early_warning.diverged(records, twin=runs["healthy_ue5m3"][0])
    assert step is None or step > flags[0].step
