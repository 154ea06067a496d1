"""The ue5m3 lm-eval adapter on the random dense debug model: all three request types, slicing, work units, and
``model_args`` defaults read from the run directory (through lm-eval's CLI arg string and ``simple_evaluate``)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from helpers.lm_eval_tools import ByteTokenizer, Unit
from helpers.olmes import needs_wheel
from ue5m3 import models
from ue5m3.evaluation.lm_eval import UE5M3LM

# Batched (right-padded) and single-row forwards run GEMMs of different shapes, so float32 sums may differ in the
# last bits; 1e-4 absolute on log-probs of ~-8 per token is far below any accuracy-relevant difference.
ATOL = 1e-4


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


def test_scoring_logs_its_progress_in_requests_and_work_units(net, caplog, monkeypatch):
    import logging

    from ue5m3 import logs

    monkeypatch.setattr(logs, "interactive", lambda: False)  # a log file, not a terminal
    caplog.set_level(logging.INFO, logger="ue5m3.evaluation.lm_eval")
    lm, _ = make_lm(net, batch_size=2)
    lm.loglikelihood([ll_request(c, x, i) for i, (c, x) in enumerate(PAIRS)])
    (line,) = [r.getMessage() for r in caplog.records if r.name == "ue5m3.evaluation.lm_eval"]
    assert line.startswith("scoring: request 5/5, work_units 3, ") and "request/s" in line


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


def test_lm_eval_has_no_plugin_discovery_so_ue5m3_is_registered_by_importing_the_adapter():
    """Why the CLI is ``ue5m3 lm-eval`` and not ``lm_eval --model ue5m3``: lm-eval 0.4.13 finds models only in its
    own table (``lm_eval.models.MODEL_MAPPING``) and in what imported code registered; it reads no entry points (its
    registry accepts EntryPoint placeholders but nothing loads any), and its CLI imports no external package. The day
    lm-eval discovers plugins this test fails: then register ``ue5m3`` as an entry point and document plain
    ``lm_eval --model ue5m3``. A fresh interpreter, so that nothing imported the adapter before."""
    import lm_eval

    source = Path(lm_eval.__file__).parent
    readers = [p for p in source.rglob("*.py") if "entry_points(" in p.read_text(encoding="utf-8", errors="replace")]
    assert readers == [], f"lm-eval {lm_eval.__version__} now reads entry points: {readers}"
    script = (
        "from lm_eval.api.registry import get_model\n"
        "import lm_eval.__main__, lm_eval.evaluator, lm_eval.models\n"  # what `lm_eval --model ...` imports
        "try:\n"
        "    get_model('ue5m3')\n"
        "except ValueError as err:\n"
        "    assert 'no model for this name found' in str(err), err\n"
        "else:\n"
        "    raise AssertionError('lm-eval knows ue5m3 without the adapter')\n"
        "import ue5m3.evaluation.lm_eval as adapter\n"
        "assert get_model('ue5m3') is adapter.UE5M3LM\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr[-3000:]


def test_importing_the_adapter_keeps_lm_evals_own_models():
    """lm-eval loads its own table only while its registry is empty; the adapter fills it first, so that
    ``ue5m3 lm-eval --model hf`` (and ``simple_evaluate(model="hf")`` after importing the adapter) still work."""
    from lm_eval.api.registry import model_registry

    assert {"ue5m3", "hf", "dummy"} <= set(model_registry)
    assert get_model("dummy").__name__ == "DummyLM"


def test_arg_string_without_inference_module_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ue5m3.evaluation.inference", None)  # import of it raises ImportError
    with pytest.raises(ImportError, match="ue5m3.evaluation.inference.load_for_inference"):
        UE5M3LM.create_from_arg_string("run_dir=/nonexistent,step=30000,policy=bf16,tokenizer=/t.json")


RUN_SEQUENCE_LENGTH = 48


def write_run_dir(root: Path, *, vocab_size: int = 300) -> Path:
    """A run directory as far as the adapter reads it: ``config.resolved.json`` whose data section names a data
    dir holding a trained ``tokenizer.json`` (no checkpoint: the tests stub ``load_for_inference``)."""
    from ue5m3.data import Corpus, DataConfig
    from ue5m3.data.tokenizer import train_tokenizer
    from ue5m3.training.config import RESOLVED_CONFIG, TrainConfig

    data = DataConfig(
        corpus=Corpus.SOTU_CPYTHON,
        vocab_size=vocab_size,
        sequence_length=RUN_SEQUENCE_LENGTH,
        data_dir=str(root / "data"),
    )
    texts = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(100)]
    train_tokenizer(texts, vocab_size, root / "data" / "tokenizer.json", min_frequency=1)
    cfg = TrainConfig(
        run_dir=str(root / "run"),
        model="dense_debug",
        model_overrides={"vocab_size": vocab_size},
        recipe="bf16",
        seed=0,
        steps=1,
        micro_batch=1,
        accumulation=1,
        data=data.to_dict(),
    )
    (root / "run").mkdir(parents=True)
    (root / "run" / RESOLVED_CONFIG).write_text(json.dumps(cfg.to_dict()))
    return root / "run"


def stub_loader(monkeypatch, result) -> dict:
    """Replace ``ue5m3.evaluation.inference.load_for_inference`` by one returning ``result``; returns its calls."""
    seen: dict = {}

    def load_for_inference(run_dir, step, policy=None, **kw):
        seen.update(run_dir=run_dir, step=step, policy=policy, **kw)
        return result

    monkeypatch.setitem(
        sys.modules, "ue5m3.evaluation.inference", types.SimpleNamespace(load_for_inference=load_for_inference)
    )
    return seen


def test_arg_string_loads_through_load_for_inference(monkeypatch, net, tmp_path):
    run_dir = write_run_dir(tmp_path)
    seen = stub_loader(monkeypatch, (Unit(net), ByteTokenizer()))
    lm = UE5M3LM.create_from_arg_string(
        f"run_dir={run_dir},step=30000,policy=current_tensor,device=cpu", {"batch_size": 4}
    )
    assert seen == {"run_dir": str(run_dir), "step": 30000, "policy": "current_tensor", "device": "cpu"}
    assert lm.batch_size == 4 and lm.max_length == RUN_SEQUENCE_LENGTH
    assert isinstance(lm.ue5m3_tokenizer, ByteTokenizer)  # the loader's tokenizer beats the run's


def test_tokenizer_and_max_length_default_from_the_run_directory(monkeypatch, net, tmp_path):
    run_dir = write_run_dir(tmp_path)
    stub_loader(monkeypatch, Unit(net))  # a model only: the tokenizer must come from the run
    lm = UE5M3LM.create_from_arg_string(f"run_dir={run_dir},policy=bf16")
    assert lm.ue5m3_tokenizer.path == tmp_path / "data" / "tokenizer.json"
    assert lm.max_length == RUN_SEQUENCE_LENGTH
    assert lm.tok_encode("the lazy fox") == lm.ue5m3_tokenizer.encode("the lazy fox")
    assert lm.eot_token_id == 2  # the trained BPE's </s>


def test_explicit_tokenizer_and_max_length_win_over_the_run_directory(monkeypatch, net, tmp_path):
    run_dir = write_run_dir(tmp_path / "a")
    other = write_run_dir(tmp_path / "b", vocab_size=280).parent / "data" / "tokenizer.json"
    stub_loader(monkeypatch, (Unit(net), ByteTokenizer()))
    lm = UE5M3LM.create_from_arg_string(f"run_dir={run_dir},policy=bf16,tokenizer={other},max_length=16")
    assert lm.ue5m3_tokenizer.path == other and lm.ue5m3_tokenizer.vocab_size == 280
    assert lm.max_length == 16


def test_explicit_values_need_no_run_config_and_a_missing_one_is_named(monkeypatch, net, tmp_path):
    other = write_run_dir(tmp_path / "b").parent / "data" / "tokenizer.json"
    stub_loader(monkeypatch, Unit(net))
    lm = UE5M3LM.create_from_arg_string(f"run_dir={tmp_path / 'bare'},policy=bf16,tokenizer={other},max_length=8")
    assert lm.max_length == 8
    with pytest.raises(FileNotFoundError, match="config.resolved.json"):
        UE5M3LM.create_from_arg_string(f"run_dir={tmp_path / 'bare'},policy=bf16,tokenizer={other}")


@pytest.mark.slow
@needs_wheel
def test_simple_evaluate_with_model_args_scores_as_the_adapter_built_from_the_run(tiny_run, tmp_path, monkeypatch):
    """The documented Python path: ``lm_eval.simple_evaluate(model="ue5m3", model_args="run_dir=..,policy=..")``
    scores a real run exactly as ``UE5M3LM`` built from the run's tokenizer and sequence length does."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from ue5m3.data import open_tokenizer
    from ue5m3.evaluation import olmes
    from ue5m3.evaluation.inference import load_for_inference

    run_dir, data = tiny_run
    names = olmes.build_core9_tasks(tmp_path / "tasks", ["arc_easy"], ["mc"], n=4)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = lm_eval.simple_evaluate(
        model="ue5m3",
        model_args=f"run_dir={run_dir},policy=cold_d50_replay",
        tasks=names,
        task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
        num_fewshot=0,
        limit=4,
        log_samples=False,
    )
    loaded = load_for_inference(run_dir, policy="cold_d50_replay")
    lm = UE5M3LM(loaded, open_tokenizer(data), max_length=data.sequence_length)
    want = olmes.run_suite(lm, tmp_path / "tasks", names, limit=4, log_samples=False)
    assert {n: out["results"][n]["acc,none"] for n in names} == want["scores"]


def test_rejects_models_without_forward_unit():
    with pytest.raises(TypeError, match="forward_unit"):
        UE5M3LM(torch.nn.Identity(), ByteTokenizer())


def test_arg_string_rejects_unknown_arguments():
    with pytest.raises(ValueError, match="unknown ue5m3 model_args"):
        UE5M3LM.create_from_arg_string("run_dir=/r,policy=bf16,pretrained=gpt2")
