"""Activation checkpointing: a run that recomputes its blocks equals the run that keeps their activations, bit for
bit (losses, diagnostics counts, weights, optimizer state), for every packaged recipe; the recomputed FP4 forward
uses the same references, SR streams and cached weights and counts nothing; the chunked loss and the scan's passes
agree with the whole computation to FP32 rounding and enter the run identity."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers.training import final_state, metric_records, same_tensors
from ue5m3 import models
from ue5m3.data import RandomTokenStream
from ue5m3.layers import linear, recipes
from ue5m3.training import build, parallelize
from ue5m3.training import loop as train
from ue5m3.training.config import OptimConfig, TrainConfig
from ue5m3.training.identity import fingerprint, run_identity
from ue5m3.training.loss import chunked_cross_entropy, lm_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HYBRID = {"hybrid_override_pattern": "M-*-"}  # a Mamba, an MLP, an attention and an MLP block
MODELS = {"nemotron_h_debug": HYBRID, "dense_debug": {}}


def _debug_overrides(recipe: str) -> dict:
    """The packaged recipe's layer keys cut to the debug models' depth: the last layer BF16 where the recipe keeps
    its final layers BF16, the T = 2048 override on the down projections of the last two layers where it has one."""
    packaged = recipes.get(recipe)
    overrides = {}
    if packaged.bf16_layers:
        overrides["bf16_layers"] = {"first": 0, "last": 1, "kind": None}
    if packaged.target_overrides:
        overrides["target_overrides"] = [
            {
                "operand": "wgrad_upstream_gradient",
                "module": "*.down_proj",
                "layers": {"first": 0, "last": 2, "kind": None},
                "target": 2048.0,
            }
        ]
    return overrides


def _config(tmp_path, name, model="nemotron_h_debug", recipe="ue5m3_b16", **kw) -> TrainConfig:
    values = dict(
        run_dir=str(tmp_path / name),
        model=model,
        model_overrides=MODELS[model],
        recipe=recipe,
        recipe_overrides=_debug_overrides(recipe),
        seed=3,
        steps=2,
        micro_batch=2,
        accumulation=2,
        data=None,
        checkpoint_every=2,
        optim=OptimConfig(lr=3e-3),
    )
    values.update(kw)
    return TrainConfig(**values)


def _assert_same_run(a: TrainConfig, b: TrainConfig) -> None:
    assert metric_records(a.run_dir) == metric_records(b.run_dir)
    (model_a, optim_a), (model_b, optim_b) = final_state(a.run_dir), final_state(b.run_dir)
    assert same_tensors(model_a, model_b)
    assert optim_a["state"].keys() == optim_b["state"].keys()
    for i in optim_a["state"]:
        for k, v in optim_a["state"][i].items():
            assert torch.equal(v, optim_b["state"][i][k]), (i, k)


def _train(cfg: TrainConfig) -> TrainConfig:
    train.train(cfg, RandomTokenStream(4096, 64))
    return cfg


def _recipe_model_cases():
    fast = {("ue5m3_b16", "nemotron_h_debug"), ("bf16", "dense_debug")}
    for recipe in recipes.names():
        for model in MODELS:
            marks = () if (recipe, model) in fast else (pytest.mark.slow,)
            yield pytest.param(recipe, model, marks=marks, id=f"{recipe}-{model}")


def _outcome(cfg: TrainConfig) -> str | None:
    """Train ``cfg``; None, or the message of the NonFiniteError that stopped it."""
    try:
        _train(cfg)
    except train.NonFiniteError as err:
        return str(err)
    return None


@pytest.mark.parametrize(("recipe", "model"), list(_recipe_model_cases()))
def test_checkpointing_every_block_reproduces_the_run_bit_for_bit(tmp_path, recipe, model):
    plain, recomputed = _config(tmp_path, "plain", model, recipe), _config(tmp_path, "ac", model, recipe)
    recomputed = dataclasses.replace(recomputed, activation_checkpointing="every_block")
    stopped = _outcome(plain)
    assert _outcome(recomputed) == stopped  # a recipe that stops on a non-finite operand stops the same way
    if stopped is not None:
        return
    _assert_same_run(plain, recomputed)
    if recipes.get(recipe).gemm.model.value != "bf16":  # the diagnostics are in the records compared
        assert metric_records(plain.run_dir)[0]["quantized_blocks"] > 0


@pytest.mark.parametrize(
    ("mode", "accumulation"), [("selective", 2), pytest.param("every_block", 1, marks=pytest.mark.slow)]
)
def test_selective_checkpointing_and_one_microbatch_reproduce_the_run_bit_for_bit(tmp_path, mode, accumulation):
    """Accumulation 1 quantizes the weights afresh in the recomputation (no weight caching): the same bits."""
    plain = _train(_config(tmp_path, "plain", accumulation=accumulation))
    recomputed = _train(_config(tmp_path, "ac", activation_checkpointing=mode, accumulation=accumulation))
    _assert_same_run(plain, recomputed)


def test_selective_checkpoints_the_blocks_of_the_chosen_kinds(tmp_path):
    hybrid = models.build("nemotron_h_debug", **HYBRID)
    dense = models.build("dense_debug")
    default = _config(tmp_path, "sel", activation_checkpointing="selective")
    assert parallelize.checkpointed_blocks(hybrid, default) == [0, 2]  # M and *, not the MLPs
    only_mlp = _config(tmp_path, "mlp", activation_checkpointing="selective", checkpoint_kinds=["mlp"])
    assert parallelize.checkpointed_blocks(hybrid, only_mlp) == [1, 3]
    assert parallelize.checkpointed_blocks(dense, default) == [0, 1]  # a dense layer is attention and MLP
    assert parallelize.checkpointed_blocks(
        hybrid, _config(tmp_path, "all", activation_checkpointing="every_block")
    ) == [
        0,
        1,
        2,
        3,
    ]
    assert parallelize.checkpointed_blocks(hybrid, _config(tmp_path, "none")) == []
    with pytest.raises(ValueError, match="checkpoint_kinds"):
        _config(tmp_path, "bad", activation_checkpointing="selective", checkpoint_kinds=["moe"])
    with pytest.raises(ValueError, match="activation_checkpointing: must be one of"):
        _config(tmp_path, "bad", activation_checkpointing="full")


def test_the_recomputed_forward_runs_and_is_left_uncounted(tmp_path, monkeypatch):
    """The recomputation does run the FP4 forward GEMMs again (a spy counts them); without the scratch routing its
    fprop counts would be added twice (the records would differ), with it they are not."""
    from ue5m3.layers import matmul

    calls = {"n": 0}
    original = matmul.run_gemm

    def spy(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(matmul, "run_gemm", spy)
    plain = _train(_config(tmp_path, "plain"))
    plain_calls, calls["n"] = calls["n"], 0
    recomputed = _train(_config(tmp_path, "ac", activation_checkpointing="every_block"))
    assert calls["n"] > plain_calls  # the forward GEMMs ran twice
    _assert_same_run(plain, recomputed)

    monkeypatch.setattr(linear, "is_recomputing", lambda: False)  # the recomputation counted as a forward pass
    doubled = _train(_config(tmp_path, "doubled", activation_checkpointing="every_block"))
    counted, once = metric_records(doubled.run_dir)[0], metric_records(plain.run_dir)[0]
    assert counted["quantized_blocks"] > once["quantized_blocks"]
    assert {k: v for k, v in counted.items() if "blocks" not in k and k != "telemetry"} == {
        k: v for k, v in once.items() if "blocks" not in k and k != "telemetry"
    }


def _fp4_node(tensor: torch.Tensor):
    """The FP4Matmul backward node (its context) in ``tensor``'s graph."""
    stack = [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and hasattr(node, "wgrad_x"):
            return node
        stack.extend(n for n, _ in (node.next_functions if node is not None else ()))
    raise AssertionError("no FP4Matmul in the graph")


def test_the_packed_activation_is_held_by_autograd_alone():
    """FP4Matmul keeps only the layout of the packed wgrad X on its context; the tensors are saved for backward,
    so activation checkpointing can drop them (an attribute holding them would keep them alive)."""
    model = models.build("dense_debug", device="cpu")
    linear.convert(model, recipes.get("mxfp4"), select=["model.layers.0.mlp.up_proj"])
    layer = model.get_submodule("model.layers.0.mlp.up_proj")
    ctx = _fp4_node(layer(torch.randn(64, 128)))
    assert all(t is None for t in ctx.wgrad_x.tensors())
    assert len(ctx.saved_tensors) == 1 + len(ctx.wgrad_x.tensors())


def test_a_call_resolved_while_recomputing_holds_the_same_state_and_counts_into_scratch():
    import dataclasses

    from ue5m3.layers.telemetry import recomputing
    from ue5m3.numerics.philox import SRState

    model = models.build("dense_debug", device="cpu")
    recipe = dataclasses.replace(recipes.get("ue5m3_b16"), target_overrides=())
    sr = SRState(7)
    linear.convert(model, recipe, select=["model.layers.0.mlp.up_proj"], sr_state=sr)
    layer = model.get_submodule("model.layers.0.mlp.up_proj")
    layer.scale_state.begin_step(1)
    sr.begin_step(1)
    x = torch.randn(64, 128)
    first = layer.resolve_call(x)
    with recomputing():
        again = layer.resolve_call(x * 2)  # even another tensor: the references are held for the step
    assert torch.equal(again.activation_reference, first.activation_reference)
    assert torch.equal(again.weight_reference, first.weight_reference)
    assert again.dy_bits.keys() == first.dy_bits.keys()
    assert all(again.dy_bits[k][0] == first.dy_bits[k][0] for k in first.dy_bits)  # the same Philox streams
    assert again.weights is first.weights and again.weight_epoch == first.weight_epoch
    assert again.counts is not first.counts and again.counts is not layer.telemetry.counts
    assert again.checks is not layer.telemetry.checks and first.checks is layer.telemetry.checks
    assert layer.resolve_call(x).counts is layer.telemetry.counts  # outside the recomputation: the real ones


def _saved_bytes(fn) -> int:
    """Bytes of the tensors other than parameters that autograd saves for the backward pass while ``fn`` runs
    (outside checkpointed regions: inside one, the checkpoint's own hooks take them and keep none)."""
    total = [0]

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def test_checkpointed_blocks_keep_no_activations_across_the_forward_pass(tmp_path):
    def forward(mode):
        cfg = _config(tmp_path, mode, activation_checkpointing=mode, recipe="ue5m3_b16")
        model, _ = build.build_model(cfg, cfg.resolved_recipe(), torch.device("cpu"))
        linear.find_scale_state(model).begin_step(1)
        linear.find_sr_state(model).begin_step(1)
        tokens = torch.randint(0, 4096, (2, 65))
        return _saved_bytes(lambda: lm_loss(model, tokens[:, :-1], tokens[:, 1:], chunk=32))

    plain, every = forward("none"), forward("every_block")
    # what stays: the embedding's indices, the blocks' inputs (held by the checkpoints, not saved), the final norm
    # and the chunked loss's hidden states
    assert every < plain / 10


# ----- the chunked loss -----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [16, 48, 128])
def test_the_chunked_loss_equals_the_whole_one_to_fp32_rounding(chunk):
    model = models.build("dense_debug", device="cpu", generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 4096, (2, 65), generator=torch.Generator().manual_seed(1))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss_and_grads(chunk):
        model.zero_grad(set_to_none=True)
        loss = lm_loss(model, inputs, targets, chunk=chunk)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    whole, whole_grads = loss_and_grads(0)
    chunked, chunked_grads = loss_and_grads(chunk)
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=0)
    for name, grad in whole_grads.items():  # the head's weight gradient sums its chunks; the rest agree too
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert model.lm_head.weight.grad is not None


def test_the_chunked_loss_never_holds_the_whole_logits():
    model = models.build("dense_debug", device="cpu")
    hidden = torch.randn(1, 256, 128, requires_grad=True)
    targets = torch.randint(0, 4096, (1, 256))
    vocab = model.config.vocab_size
    whole = _saved_bytes(lambda: F.cross_entropy(model.lm_head(hidden).reshape(-1, vocab), targets.reshape(-1)))
    chunked = _saved_bytes(lambda: chunked_cross_entropy(model.lm_head, hidden, targets, 32))
    assert whole >= 256 * vocab * 4  # the FP32 logits' softmax, kept for the backward pass
    assert chunked < 256 * vocab * 4 / 8  # only the hidden states and the chunks' sums
    with torch.no_grad():
        torch.testing.assert_close(
            chunked_cross_entropy(model.lm_head, hidden, targets, 32),
            F.cross_entropy(model.lm_head(hidden).reshape(-1, vocab), targets.reshape(-1)),
            rtol=1e-6,
            atol=0,
        )
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_cross_entropy(model.lm_head, hidden, targets, 0)


@pytest.mark.slow
def test_a_run_with_the_chunked_loss_and_scan_passes_stays_within_fp32_rounding(tmp_path):
    plain = _train(_config(tmp_path, "plain", recipe="bf16"))
    lean = _train(
        _config(
            tmp_path,
            "lean",
            recipe="bf16",
            loss_chunk=48,
            ssd_groups_per_pass=1,
            activation_checkpointing="every_block",
        )
    )
    a, b = metric_records(plain.run_dir), metric_records(lean.run_dir)
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-5)
    assert [r["grad_norm"] for r in a] == pytest.approx([r["grad_norm"] for r in b], rel=1e-4)


# ----- the run identity -----------------------------------------------------------------------------------


def test_only_the_settings_that_change_the_bits_enter_the_identity(tmp_path):
    base = _config(tmp_path, "run")

    def print_of(**kw):
        cfg = _config(tmp_path, "run", **kw)
        return fingerprint(run_identity(cfg, cfg.resolved_recipe(), 2))

    same = print_of()
    # the same bits: checkpointing, FSDP2's reshard, prefetch and sync cadence, and a scan pass of all groups
    for settings in (
        {"activation_checkpointing": "every_block"},
        {"activation_checkpointing": "selective", "checkpoint_kinds": ["mlp"]},
        {"fsdp_reshard_after_forward": "never", "fsdp_prefetch": 2, "gradient_sync": "every_microbatch"},
        {"ssd_groups_per_pass": 2},  # the debug model has 2 groups: one pass
    ):
        assert print_of(**settings) == same, settings
    # other bits: BF16 parameters (and what the FP4 linears quantize then), the chunked loss, fewer scan passes
    changed = [
        print_of(param_dtype="bfloat16"),
        print_of(param_dtype="bfloat16", fp4_weight_dtype="float32"),
        print_of(loss_chunk=256),
        print_of(ssd_groups_per_pass=1),
    ]
    assert len(set(changed)) == len(changed) and same not in changed
    identity = run_identity(base, base.resolved_recipe(), 2)
    assert not {"param_dtype", "loss_chunk", "ssd_groups_per_pass"} & set(identity)  # absent unless set


def test_memory_and_fsdp_settings_are_checked(tmp_path):
    for key, value in (
        ("loss_chunk", -1),
        ("ssd_groups_per_pass", -2),
        ("fsdp_prefetch", True),
        ("param_dtype", "float16"),
        ("fp4_weight_dtype", "bfloat16"),
        ("gradient_sync", "never"),
        ("fsdp_reshard_after_forward", "sometimes"),
    ):
        with pytest.raises(ValueError, match=key):
            _config(tmp_path, "bad", **{key: value})


@pytest.mark.parametrize("recipe", ["ue5m3_b16", "nvfp4_te"])
def test_a_non_finite_operand_is_reported_once_and_the_same_with_checkpointing(tmp_path, recipe):
    """The recomputation defers no check of its own: the step's one read of the deferred checks raises the same
    first failure, counted the same, with or without checkpointing."""

    def failure(mode):
        cfg = _config(tmp_path, mode, recipe=recipe, activation_checkpointing=mode)
        model, _ = build.build_model(cfg, cfg.resolved_recipe(), torch.device("cpu"))
        optimizer = build.build_optimizer(model, cfg.optim)
        stream = RandomTokenStream(4096, 64)
        train.train_step(1, model, optimizer, stream, cfg)
        with torch.no_grad():
            model.get_submodule("backbone.layers.1.mixer.up_proj").weight[0, 0] = float("inf")
        with pytest.raises(train.NonFiniteError) as err:
            train.train_step(2, model, optimizer, stream, cfg)
        return str(err.value)

    plain = failure("none")
    assert "backbone.layers.1.mixer.up_proj" in plain
    assert failure("every_block") == plain
