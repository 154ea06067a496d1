"""Hugging Face round trips with the installed transformers (5.x): both config spellings, transformers-saved
directories loaded by the project, project exports loaded by transformers, and a run's checkpoint exported in one
call (``ue5m3 export-hf``). Everything is built locally from configs (random init); nothing touches the hub.

Logit tolerance: both sides compute in FP32, but the chunked SSD scan, the causal conv and attention are different
implementations (different summation orders), so logits of magnitude <= ~1 differ by a few FP32 ulps (observed
<= 2e-7). ``ATOL = 1e-6`` (~8 ulps at 1) allows that and no more; a wrong weight, name or block order moves
logits by orders of magnitude more. One forward-pass difference is by design of transformers 5 and is compared
separately: it clamps the Mamba-2 ``dt`` from below at ``time_step_min``, not at ``time_step_limit[0]``, so the
comparisons run our model with that clamp (:func:`as_transformers`), and
``test_transformers_clamps_dt_at_time_step_min_not_at_time_step_limit`` pins the difference itself.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from helpers.ports import free_port
from ue5m3 import cli, models
from ue5m3.models import hf
from ue5m3.models.nemotron_h import NemotronH

ATOL = 1e-6
PATTERN = "M-*-M"
HF_BLOCKS = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}

pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def tiny_hf_config(transformers, **changes):
    """A small transformers ``NemotronHConfig`` (every dimension a multiple of the groups; chunk 16 < T)."""
    fields = dict(
        vocab_size=320,
        hidden_size=64,
        layers_block_type=[HF_BLOCKS[c] for c in PATTERN],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        mamba_num_heads=8,
        mamba_head_dim=8,
        ssm_state_size=16,
        n_groups=2,
        chunk_size=16,
    )
    return transformers.NemotronHConfig(**{**fields, **changes})


def as_transformers(path: Path, **overrides) -> NemotronH:
    """Our model of ``path`` with transformers 5's dt clamp, ``[time_step_min, inf)``."""
    cfg = hf.config_from_hf(path)
    return hf.load_pretrained(path, time_step_limit=(cfg.time_step_min, math.inf), **overrides)


def token_ids(vocab: int, shape=(2, 40), seed=1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def our_logits(model: NemotronH, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


# ----- config spellings (no transformers needed) ------------------------------------------------------------


def test_config_from_hf_reads_the_transformers_5_infinity_encoding():
    raw = hf.hf_config_dict(models.config("nemotron_h_debug"))
    assert raw["time_step_limit"] == [0.0, {"__float__": "Infinity"}]  # what transformers 5 writes
    assert json.loads(json.dumps(raw)) == raw  # strict JSON: no bare Infinity
    assert hf.config_from_hf(raw).time_step_limit == (0.0, math.inf)
    raw["time_step_limit"] = [{"__float__": "-Infinity"}, {"__float__": "NaN"}]
    with pytest.raises(ValueError, match="time_step_limit"):  # decoded to floats, then refused by validation
        hf.config_from_hf(raw)


def test_current_and_legacy_keys_describe_the_same_model():
    cfg = models.config("nemotron_h_cpu")
    current = hf.hf_config_dict(cfg)
    legacy = hf.hf_config_dict(cfg, legacy_keys=True)
    assert current["layers_block_type"] == [HF_BLOCKS[c] for c in cfg.hybrid_override_pattern]
    assert "hybrid_override_pattern" not in current and "layers_block_type" not in legacy
    assert legacy["hybrid_override_pattern"] == cfg.hybrid_override_pattern
    assert legacy["time_step_limit"] == [0.0, math.inf]  # json.dumps writes the bare Infinity transformers 4 reads
    assert hf.config_from_hf(current) == hf.config_from_hf(legacy) == cfg
    both = {**current, "hybrid_override_pattern": cfg.hybrid_override_pattern}
    assert hf.config_from_hf(both) == cfg
    with pytest.raises(ValueError, match="disagrees with hybrid_override_pattern"):
        hf.config_from_hf({**both, "hybrid_override_pattern": "M" * cfg.num_hidden_layers})


def test_gelu_is_written_as_the_tanh_approximation_and_exact_gelu_is_refused():
    cfg = models.config("nemotron_h_debug", mlp_hidden_act="gelu")
    raw = hf.hf_config_dict(cfg)
    assert raw["mlp_hidden_act"] == "gelu_pytorch_tanh"
    assert hf.config_from_hf(raw) == cfg
    with pytest.raises(ValueError, match="exact erf GELU"):
        hf.config_from_hf({**raw, "mlp_hidden_act": "gelu"})


def test_save_pretrained_refuses_a_non_empty_directory_and_other_models(tmp_path):
    model = models.build("nemotron_h_debug", "cpu", generator=torch.Generator().manual_seed(0))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        hf.save_pretrained(model, tmp_path / "out")
    hf.save_pretrained(model, tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary directory left behind
    with pytest.raises(TypeError, match="Nemotron-H"):
        hf.save_pretrained(models.build("dense_debug", "cpu"), tmp_path / "dense")


# ----- transformers -> project ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_transformers_saved_model_loads_with_the_project_and_gives_its_logits(tmp_path, transformers):
    torch.manual_seed(0)
    theirs = transformers.NemotronHForCausalLM(tiny_hf_config(transformers)).eval()
    theirs.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert "layers_block_type" in raw and raw["time_step_limit"][1] == {"__float__": "Infinity"}
    ours = hf.load_pretrained(tmp_path)
    assert ours.config.hybrid_override_pattern == PATTERN and ours.config.time_step_limit == (0.0, math.inf)
    # the weights are theirs bit for bit (transformers names them model.* in memory, backbone.* in the file)
    theirs_state = {k.replace("model.", "backbone.", 1): v for k, v in theirs.state_dict().items()}
    assert theirs_state.keys() == ours.state_dict().keys()
    assert all(torch.equal(v, theirs_state[k]) for k, v in ours.state_dict().items())
    ids = token_ids(320)
    torch.testing.assert_close(our_logits(as_transformers(tmp_path), ids), hf_logits(theirs, ids), atol=ATOL, rtol=0)


# ----- project -> transformers ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("legacy_keys", [False, True])
@pytest.mark.parametrize("act", ["relu2", "gelu"])
def test_a_project_model_saved_in_one_call_loads_in_transformers_with_the_same_logits(
    tmp_path, transformers, legacy_keys, act
):
    model = models.build("nemotron_h_debug", "cpu", generator=torch.Generator().manual_seed(3), mlp_hidden_act=act)
    hf.save_pretrained(model, tmp_path, legacy_keys=legacy_keys)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(theirs).__name__ == "NemotronHForCausalLM" and theirs.dtype == torch.float32
    assert theirs.config.layers_block_type == [HF_BLOCKS[c] for c in model.config.hybrid_override_pattern]
    assert theirs.config.time_step_limit[1] == math.inf
    ids = token_ids(model.config.vocab_size)
    torch.testing.assert_close(hf_logits(theirs, ids), our_logits(as_transformers(tmp_path), ids), atol=ATOL, rtol=0)


@pytest.mark.slow
def test_bf16_weights_keep_their_dtype_through_transformers(tmp_path, transformers):
    model = models.build("nemotron_h_debug", "cpu", generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    hf.save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert theirs.dtype == torch.bfloat16
    theirs_state = {k.replace("model.", "backbone.", 1): v for k, v in theirs.state_dict().items()}
    assert all(torch.equal(v, theirs_state[k]) for k, v in model.state_dict().items())
    back = hf.load_pretrained(tmp_path)
    assert all(p.dtype == torch.bfloat16 for p in back.parameters())


@pytest.mark.slow
def test_transformers_clamps_dt_at_time_step_min_not_at_time_step_limit(tmp_path, transformers):
    model = models.build("nemotron_h_debug", "cpu", generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for layer in model.backbone.layers:
            if layer.kind == "mamba":
                layer.mixer.dt_bias.fill_(-12.0)  # dt = softplus(dt_raw - 12) ~ 6e-6, far below time_step_min
    hf.save_pretrained(model, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = token_ids(model.config.vocab_size)
    want = hf_logits(theirs, ids)
    torch.testing.assert_close(our_logits(as_transformers(tmp_path), ids), want, atol=ATOL, rtol=0)
    assert (our_logits(model.eval(), ids) - want).abs().max() > 100 * ATOL  # the config's (0, inf) clamp


# ----- a run's checkpoint in one call -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step nemotron_h_debug run (BF16, vocab 300, sequence 32) with a trained BPE in its data dir."""
    from ue5m3.data import Corpus, DataConfig, RandomTokenStream
    from ue5m3.data.tokenizer import train_tokenizer
    from ue5m3.training import loop
    from ue5m3.training.config import OptimConfig, TrainConfig

    root = tmp_path_factory.mktemp("hf_export")
    data = DataConfig(corpus=Corpus.SOTU_CPYTHON, vocab_size=300, sequence_length=32, data_dir=str(root / "data"))
    texts = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(200)]
    train_tokenizer(texts, 300, root / "data" / "tokenizer.json", min_frequency=1)
    cfg = TrainConfig(
        run_dir=str(root / "run"),
        model="nemotron_h_debug",
        model_overrides={"vocab_size": 300},
        recipe="bf16",
        seed=5,
        steps=2,
        micro_batch=1,
        accumulation=1,
        data=data.to_dict(),
        checkpoint_every=2,
        optim=OptimConfig(lr=3e-3),
    )
    loop.train(cfg, RandomTokenStream(300, 32, seed=0))
    return root / "run"


@pytest.mark.slow
def test_export_hf_writes_the_run_checkpoint_that_transformers_and_the_project_load(tmp_path, run, transformers):
    from ue5m3.data import load_tokenizer
    from ue5m3.evaluation.inference import load_checkpoint_weights, load_for_inference

    out = tmp_path / "hf"
    assert cli.main(["export-hf", "--run-dir", str(run), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "ue5m3_export.json"]
    record = json.loads((out / "ue5m3_export.json").read_text())
    state, manifest, _ = load_checkpoint_weights(run)
    assert record["checkpoint_step"] == 2 and record["run_recipe"] == "bf16"
    config = json.loads((out / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["max_position_embeddings"]) == (1, 2, 32)

    ours = hf.load_pretrained(out)
    assert ours.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in ours.state_dict().items())
    ids = token_ids(300, (2, 32))
    # the project's own evaluation of the checkpoint (bf16 policy, FP32 on the CPU) is the loaded model's forward
    inference = load_for_inference(run, policy="bf16", device="cpu")
    torch.testing.assert_close(our_logits(ours, ids), inference.forward_unit(ids), atol=0, rtol=0)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    torch.testing.assert_close(hf_logits(theirs, ids), our_logits(as_transformers(out), ids), atol=ATOL, rtol=0)

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "the lazy fox jumps"
    assert tokenizer(text).input_ids == load_tokenizer(run.parent / "data" / "tokenizer.json").encode(text)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")

    # an existing --out is refused (exit 2), a checkpoint directory is accepted as the source
    assert cli.main(["export-hf", "--run-dir", str(run), "--out", str(out)]) == 2
    ckpt = run / "checkpoints" / "step-00000002"
    assert cli.main(["export-hf", "--run-dir", str(ckpt), "--out", str(tmp_path / "b"), "--legacy-keys"]) == 0
    assert "hybrid_override_pattern" in json.loads((tmp_path / "b" / "config.json").read_text())
    assert (tmp_path / "b" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="one checkpoint"):
        from ue5m3.evaluation.export import export_hf

        export_hf(ckpt, tmp_path / "c", step=2)


def _lm_eval_results(out_dir: Path) -> dict:
    (path,) = out_dir.rglob("results_*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_lm_evals_own_hf_backend_scores_an_export_offline_and_the_verb_alike_without_torchao_noise(
    tmp_path, run, transformers
):
    """What a transformers user runs: ``lm_eval --model hf --model_args pretrained=<export>`` on a local task folder
    (the eval extra carries accelerate, which lm-eval's HF backend imports), offline. ``ue5m3 lm-eval`` with the same
    arguments (lm-eval's CLI in-process, after the project's logging setup) scores the same and its stderr holds no
    line of the third-party noise that ``ue5m3.logs.NOISE`` drops (torchao's extensions that do not load here)."""
    from helpers.lm_eval_tools import run_lm_eval_cli, write_tiny_task

    export = tmp_path / "hf"
    assert cli.main(["export-hf", "--run-dir", str(run), "--out", str(export)]) == 0
    task = write_tiny_task(tmp_path / "tasks")
    args = ["--model", "hf", "--model_args", f"pretrained={export},dtype=float32", "--device", "cpu"]
    args += ["--include_path", str(tmp_path / "tasks"), "--tasks", task, "--limit", "2", "--batch_size", "1"]
    users = run_lm_eval_cli(["-m", "lm_eval", *args, "--output_path", str(tmp_path / "users")], cwd=tmp_path)
    assert users.returncode == 0, users.stderr[-4000:]
    results = _lm_eval_results(tmp_path / "users")
    assert results["n-samples"][task]["effective"] == 2
    assert 0.0 <= results["results"][task]["acc,none"] <= 1.0

    verb = run_lm_eval_cli(["-m", "ue5m3", "lm-eval", *args, "--output_path", str(tmp_path / "verb")], cwd=tmp_path)
    assert verb.returncode == 0, verb.stderr[-4000:]
    assert _lm_eval_results(tmp_path / "verb")["results"][task] == results["results"][task]
    noise = ("torchao/_C_", "is an Enum subclass and is now natively supported", "Custom kwargs can be passed")
    assert [n for n in noise if n in verb.stderr] == []
    assert any(n in users.stderr for n in noise)  # lm-eval alone prints them here: the filter is what drops them


@pytest.mark.slow
def test_a_sharded_checkpoint_exports_the_same_weights(tmp_path, run):
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ue5m3.evaluation.export import export_hf
    from ue5m3.evaluation.inference import load_checkpoint_weights
    from ue5m3.training import checkpoint

    state, _, _ = load_checkpoint_weights(run)
    model = models.build("nemotron_h_debug", vocab_size=300)
    model.load_state_dict(state, assign=True)
    optimizer = torch.optim.AdamW(model.parameters())
    sharded_run = tmp_path / "run"
    sharded_run.mkdir()
    shutil.copy(run / "config.resolved.json", sharded_run)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        path = checkpoint.save_sharded(
            sharded_run / "checkpoints",
            2,
            {"model": model_sd, "optimizer": optim_sd},
            {"trainer": {"step": 2}},
            meta={},
        )
    finally:
        dist.destroy_process_group()
    assert checkpoint.verify(path)["format"] == checkpoint.SHARDED
    full = export_hf(run, tmp_path / "full")["weights"].read_bytes()
    assert export_hf(sharded_run, tmp_path / "sharded", step=2)["weights"].read_bytes() == full


def test_export_hf_refuses_a_dense_run(tmp_path):
    from ue5m3.data import Corpus, DataConfig
    from ue5m3.evaluation.export import export_hf
    from ue5m3.training import checkpoint
    from ue5m3.training.config import RESOLVED_CONFIG, TrainConfig

    data = DataConfig(corpus=Corpus.SOTU_CPYTHON, vocab_size=4096, data_dir=str(tmp_path / "data"))
    cfg = TrainConfig(
        run_dir=str(tmp_path / "run"),
        model="dense_debug",
        recipe="bf16",
        seed=0,
        steps=1,
        micro_batch=1,
        accumulation=1,
        data=data.to_dict(),
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RESOLVED_CONFIG).write_text(json.dumps(cfg.to_dict()))
    state = models.build("dense_debug", "cpu").state_dict()
    parts = {"model": state, "optimizer": {}, "trainer": {"step": 1}}
    checkpoint.save(tmp_path / "run" / "checkpoints", 1, parts, meta={})
    with pytest.raises(ValueError, match="only Nemotron-H models"):
        export_hf(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()
