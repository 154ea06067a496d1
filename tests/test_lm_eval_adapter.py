"""The ue5m3 lm-eval adapter on the random dense debug model: all three request types, slicing, work units."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from ue5m3 import models
from ue5m3.evaluation.lm_eval import UE5M3LM

# Batched (right-padded) and single-row forwards run GEMMs of different shapes, so float32 sums may differ in the
# last bits; 1e-4 absolute on log-probs of ~-8 per token is far below any accuracy-relevant difference.
ATOL = 1e-4


class ByteTokenizer:
    """Toy tokenizer: one id per UTF-8 byte, offset past PAD/BOS/EOS (0, 1, 2)."""

    eos_id = 2
    bos_id = 1

    def encode(self, text: str) -> list[int]:
        return [3 + b for b in text.encode("utf-8")]


class Unit:
    """Minimal inference wrapper: ``forward_unit`` counts its calls and records the input shapes."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls: list[tuple[int, ...]] = []

    def forward_unit(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(input_ids.shape))
        return self.model(input_ids)


@pytest.fixture(scope="module")
def net() -> torch.nn.Module:
    model = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0))
    return model.eval()


def make_lm(net: torch.nn.Module, **kw) -> tuple[UE5M3LM, Unit]:
    unit = Unit(net)
    return UE5M3LM(unit, ByteTokenizer(), **kw), unit


def direct_logprobs(net: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Log-softmax of the model on one unpadded row: ``[len(ids), V]``."""
    with torch.no_grad():
        return torch.log_softmax(net(torch.tensor([ids])).float(), dim=-1)[0]


def direct_continuation(net: torch.nn.Module, ctx: list[int], cont: list[int], max_length: int) -> tuple[float, bool]:
    whole = (ctx + cont)[-(max_length + 1) :]
    lp = direct_logprobs(net, whole[:-1])
    picks = [lp[len(whole) - 1 - len(cont) + i] for i in range(len(cont))]
    score = sum(float(p[t]) for p, t in zip(picks, cont, strict=True))
    return score, all(int(p.argmax()) == t for p, t in zip(picks, cont, strict=True))


def ll_request(context: str, continuation: str, idx: int = 0) -> Instance:
    return Instance("loglikelihood", {}, (context, continuation), idx)


PAIRS = [
    ("Question: What is 2+2?\nAnswer:", " 4"),
    ("The quick brown fox", " jumps over the lazy dog"),
    ("A", " B"),
    ("Trailing space ", "moves"),
    ("", "empty context"),
]


def test_loglikelihood_matches_direct_computation_on_unpadded_rows(net):
    lm, _ = make_lm(net, batch_size=2)
    tok = ByteTokenizer()
    got = lm.loglikelihood([ll_request(c, x, i) for i, (c, x) in enumerate(PAIRS)], disable_tqdm=True)
    for (ctx, cont), (score, greedy) in zip(PAIRS, got, strict=True):
        n_sp = len(ctx) - len(ctx.rstrip())  # lm-eval moves the context's trailing spaces into the continuation
        ctx_ids = tok.encode(ctx[: len(ctx) - n_sp]) or [tok.eos_id]
        cont_ids = tok.encode(ctx[len(ctx) - n_sp :] + cont)
        want_score, want_greedy = direct_continuation(net, ctx_ids, cont_ids, max_length=2048)
        assert score == pytest.approx(want_score, abs=ATOL)
        assert greedy == want_greedy


def test_one_forward_unit_per_batch_in_request_order(net):
    lm, unit = make_lm(net, batch_size=2)
    reqs = [ll_request(c, x, i) for i, (c, x) in enumerate(PAIRS)]
    lm.loglikelihood(reqs, disable_tqdm=True)
    assert lm.n_units == len(unit.calls) == 3  # 5 requests, batches of 2
    assert [shape[0] for shape in unit.calls] == [2, 2, 1]
    tok = ByteTokenizer()
    first_two = [len(tok.encode(c.rstrip() + c[len(c.rstrip()) :] + x)) - 1 for c, x in PAIRS[:2]]
    assert unit.calls[0][1] == max(first_two)  # batch 0 holds requests 0 and 1 (no length sort)


def test_scores_do_not_depend_on_batch_size(net):
    reqs = [ll_request(c, x, i) for i, (c, x) in enumerate(PAIRS)]
    one = make_lm(net, batch_size=1)[0].loglikelihood(reqs, disable_tqdm=True)
    many = make_lm(net, batch_size=8)[0].loglikelihood(reqs, disable_tqdm=True)
    for (a, ga), (b, gb) in zip(one, many, strict=True):
        assert a == pytest.approx(b, abs=ATOL)
        assert ga == gb


def test_greedy_flag_true_exactly_when_continuation_is_argmax(net):
    lm, _ = make_lm(net)
    ctx = [5, 17, 99, 300]
    best = int(direct_logprobs(net, ctx)[-1].argmax())
    other = (best + 1) % 4096
    (s_best, g_best), (s_other, g_other) = lm._loglikelihood_tokens([(None, ctx, [best]), (None, ctx, [other])])
    assert g_best is True and g_other is False
    assert s_best >= s_other
    # two-token continuation: greedy only if every token is the argmax given the tokens before it
    second = int(direct_logprobs(net, ctx + [best])[-1].argmax())
    (_, g2), (_, g2_bad) = lm._loglikelihood_tokens([(None, ctx, [best, second]), (None, ctx, [other, second])])
    assert g2 is True and g2_bad is False


def test_contexts_are_left_truncated_to_max_length(net):
    lm, unit = make_lm(net, max_length=16)
    ctx, cont = list(range(10, 60)), [70, 71, 72]
    ((score, greedy),) = lm._loglikelihood_tokens([(None, ctx, cont)])
    assert unit.calls == [(1, 16)]
    want_score, want_greedy = direct_continuation(net, ctx, cont, max_length=16)
    assert score == pytest.approx(want_score, abs=ATOL)
    assert greedy == want_greedy


def rolling_oracle(net: torch.nn.Module, tokens: list[int], max_length: int, eos: int) -> float:
    """Disjoint windows of ``max_length`` predictions; window ending at ``e`` reads ``([eos] + tokens)[e-L:e]``."""
    full = [eos] + tokens
    total, done = 0.0, 0
    while done < len(tokens):
        end = min(done + max_length, len(tokens))
        start = max(0, end - max_length)
        lp = direct_logprobs(net, full[start:end])
        for j in range(done, end):  # token j is predicted at input position j - start
            total += float(lp[j - start, tokens[j]])
        done = end
    return total


@pytest.mark.parametrize("max_length", [2048, 7, 1])
def test_rolling_loglikelihood_is_sum_of_token_logprobs(net, max_length):
    lm, unit = make_lm(net, batch_size=3, max_length=max_length)
    texts = ["Hello world, this is a rolling test.", "x", "Another, somewhat longer document for windows."]
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])
    tok = ByteTokenizer()
    for text, score in zip(texts, got, strict=True):
        assert score == pytest.approx(rolling_oracle(net, tok.encode(text), max_length, tok.eos_id), abs=ATOL * 10)
    n_windows = sum(-(-len(tok.encode(t)) // max_length) for t in texts)
    assert lm.n_units == len(unit.calls) == -(-n_windows // 3)


def test_generate_until_is_not_supported(net):
    lm, _ = make_lm(net)
    with pytest.raises(NotImplementedError, match="loglikelihoods only"):
        lm.generate_until([Instance("generate_until", {}, ("Q:", {"until": ["\n"]}), 0)])


def test_registered_under_ue5m3_and_reports_eos():
    assert get_model("ue5m3") is UE5M3LM
    lm = UE5M3LM(Unit(torch.nn.Identity()), ByteTokenizer())
    assert lm.eot_token_id == lm.prefix_token_id == 2
    assert lm.tok_encode("ab") == [3 + 97, 3 + 98]


def test_arg_string_without_inference_module_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ue5m3.evaluation.inference", None)  # import of it raises ImportError
    with pytest.raises(ImportError, match="ue5m3.evaluation.inference.load_for_inference"):
        UE5M3LM.create_from_arg_string("run_dir=/nonexistent,step=30000,policy=bf16,tokenizer=/t.json")


def test_arg_string_loads_through_load_for_inference(monkeypatch, net):
    seen = {}

    def load_for_inference(run_dir, step, policy=None, **kw):
        seen.update(run_dir=run_dir, step=step, policy=policy, **kw)
        return Unit(net), ByteTokenizer()

    monkeypatch.setitem(
        sys.modules, "ue5m3.evaluation.inference", types.SimpleNamespace(load_for_inference=load_for_inference)
    )
    lm = UE5M3LM.create_from_arg_string(
        "run_dir=/runs/a,step=30000,policy=current_tensor,device=cpu", {"batch_size": 4}
    )
    assert seen == {"run_dir": "/runs/a", "step": 30000, "policy": "current_tensor", "device": "cpu"}
    assert lm.batch_size == 4 and lm.max_length == 2048


def test_rejects_models_without_forward_unit():
    with pytest.raises(TypeError, match="forward_unit"):
        UE5M3LM(torch.nn.Identity(), ByteTokenizer())


def test_arg_string_rejects_unknown_arguments():
    with pytest.raises(ValueError, match="unknown ue5m3 model_args"):
        UE5M3LM.create_from_arg_string("run_dir=/r,policy=bf16,pretrained=gpt2")
