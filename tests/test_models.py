"""Model families, the flavour registry, initialisation and Hugging Face interop (experiments spec section 2)."""

import json
import math
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ue5m3 import models
from ue5m3.models import hf
from ue5m3.models.layers import apply_rope
from ue5m3.models.nemotron_h import GatedRMSNorm, Mamba2Mixer, NemotronHConfig
from ue5m3.models.ssd import ssd_sequential

PATTERN_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
DEBUG = ("nemotron_h_debug", "dense_debug")


pytestmark = pytest.mark.usefixtures("one_torch_thread_per_module")


@pytest.fixture(scope="module")
def model_8b():
    return models.build("nemotron_h_8b")


def _debug(name, seed=0, **overrides):
    return models.build(name, "cpu", generator=torch.Generator().manual_seed(seed), **overrides)


# ----- parameter counts and layout --------------------------------------------------------------------------


def test_nemotron_h_8b_has_exactly_the_papers_parameter_count(model_8b):
    assert all(p.is_meta for p in model_8b.parameters())
    assert models.count_parameters(model_8b) == 8_084_075_520


def test_nemotron_h_8b_has_112_eligible_linears_by_kind(model_8b):
    names = models.eligible_linears(model_8b)
    assert len(names) == 112
    assert "lm_head" not in names
    kinds = Counter(n.rsplit(".", 1)[1] for n in names)
    expected = {"in_proj": 24, "out_proj": 24, "up_proj": 24, "down_proj": 24}
    expected |= {"q_proj": 4, "k_proj": 4, "v_proj": 4, "o_proj": 4}
    assert kinds == expected
    assert all(n.startswith("backbone.layers.") and ".mixer." in n for n in names)
    # The recipe override "layers 44-51, *.mixer.down_proj" selects exactly the MLPs at 45, 47, 49, 51.
    late_down = [n for n in names if n.endswith("mixer.down_proj") and 44 <= int(n.split(".")[2]) <= 51]
    assert late_down == [f"backbone.layers.{i}.mixer.down_proj" for i in (45, 47, 49, 51)]
    # NVIDIA-style recipes keep blocks 44-51 in BF16: 96 FP4 linears remain.
    assert sum(int(n.split(".")[2]) < 44 for n in names) == 96


def test_nemotron_h_8b_block_layout_follows_the_pattern(model_8b):
    cfg = model_8b.config
    assert cfg.hybrid_override_pattern == PATTERN_8B and cfg.num_hidden_layers == 52
    kinds = [layer.kind for layer in model_8b.backbone.layers]
    assert [i for i, k in enumerate(kinds) if k == "attention"] == [7, 18, 29, 40]
    assert all(kinds[i] == "mlp" for i in (45, 47, 49, 51))
    mixer = model_8b.backbone.layers[0].mixer
    assert (mixer.in_proj.in_features, mixer.in_proj.out_features) == (4096, 18_560)
    assert (mixer.out_proj.in_features, mixer.out_proj.out_features) == (8192, 4096)
    assert mixer.conv1d.weight.shape == (10_240, 1, 4) and mixer.conv1d.bias.shape == (10_240,)
    assert mixer.norm.group_size == 1024 and cfg.chunk_size == 256
    attn = model_8b.backbone.layers[7].mixer
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features) == (4096, 512, 512)
    mlp = model_8b.backbone.layers[1].mixer
    assert (mlp.up_proj.out_features, mlp.down_proj.in_features) == (21_504, 21_504)
    assert model_8b.lm_head.weight.shape == (131_072, 4096)
    assert model_8b.lm_head.weight is not model_8b.backbone.embeddings.weight  # untied
    biases = [n for n, _ in model_8b.named_parameters() if n.endswith("bias") and not n.endswith("dt_bias")]
    assert len(biases) == 24 and all(n.endswith("mixer.conv1d.bias") for n in biases)  # the only biases


def test_dense_1p2b_has_exactly_the_papers_parameter_count():
    model = models.build("dense_1p2b")
    assert models.count_parameters(model) == 1_291_929_600
    names = models.eligible_linears(model)
    assert len(names) == 120
    assert sum(int(n.split(".")[2]) < 16 for n in names) == 96  # final 4 layers BF16: 96 FP4 linears
    attn = model.model.layers[0].self_attn
    assert (attn.k_proj.out_features, attn.v_proj.out_features) == (1024, 1024)  # K/V width 1,024


def test_dense_350m_parameter_count():
    model = models.build("dense_350m")
    # 419,464,192 with the untied 131,072 x 1,024 embedding and head (151,027,712 + 1,024 without them)
    assert models.count_parameters(model) == 419_464_192
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        1024,
        16,
        8,
        4,
    )
    assert cfg.intermediate_size == 3072 and cfg.rope_theta == 10_000.0 and cfg.rms_norm_eps == 1e-5
    # the 350M override applies to the second MLP matrix of layers 12-15
    downs = [n for n in models.eligible_linears(model) if n.endswith("mlp.down_proj")]
    assert downs[12:] == [f"model.layers.{i}.mlp.down_proj" for i in (12, 13, 14, 15)]


@pytest.mark.parametrize("name", ["nemotron_h_cpu", "dense_cpu", "nemotron_h_debug", "dense_debug"])
def test_small_flavours_have_fp4_block_friendly_linears(name):
    # multiples of 64: 16/32-blocks, 32x32 weight tiles and the probe-matched GEMM's 64-wide K slices all fit
    model = models.build(name)
    for module_name in models.eligible_linears(model):
        module = model.get_submodule(module_name)
        assert module.in_features % 64 == 0 and module.out_features % 64 == 0, module_name


def test_nemotron_h_debug_has_all_three_block_kinds():
    assert set(models.config("nemotron_h_debug").hybrid_override_pattern) == {"M", "*", "-"}
    assert set(models.config("nemotron_h_cpu").hybrid_override_pattern) == {"M", "*", "-"}


# ----- registry ---------------------------------------------------------------------------------------------


def test_registry_names_and_configs():
    assert set(models.names()) == {
        "nemotron_h_8b",
        "dense_350m",
        "dense_1p2b",
        "nemotron_h_cpu",
        "dense_cpu",
        "nemotron_h_debug",
        "dense_debug",
    }
    assert isinstance(models.config("nemotron_h_8b"), NemotronHConfig)
    assert isinstance(models.config("dense_cpu"), models.DenseConfig)
    assert models.config("nemotron_h_cpu").vocab_size == 8192 and models.config("dense_cpu").vocab_size == 8192
    with pytest.raises(ValueError, match="unknown model"):
        models.config("llama")


@pytest.mark.parametrize("name", ["nemotron_h_cpu", "dense_cpu"])
def test_vocab_size_is_a_build_parameter(name):
    model = models.build(name, vocab_size=5000)
    assert model.lm_head.out_features == 5000
    assert model.config.vocab_size == 5000
    assert models.config(name).vocab_size == 8192  # the registered flavour is unchanged


def test_blocks_are_the_residual_blocks_in_order(model_8b):
    assert models.blocks(model_8b) == list(model_8b.backbone.layers) and len(models.blocks(model_8b)) == 52
    dense = models.build("dense_debug")
    assert models.blocks(dense) == list(dense.model.layers)
    with pytest.raises(TypeError):
        models.blocks(nn.Linear(2, 2))


def test_invalid_configs_are_rejected():
    with pytest.raises(ValueError, match="pattern"):
        models.config("nemotron_h_debug", hybrid_override_pattern="M-E")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        models.config("dense_debug", num_key_value_heads=3)
    with pytest.raises(TypeError):
        models.config("dense_debug", not_a_field=1)
    with pytest.raises(TypeError):
        models.build_from_config({"hidden_size": 4})


# ----- forward, backward, causality --------------------------------------------------------------------------


@pytest.mark.parametrize("name", DEBUG)
def test_debug_flavour_trains_one_step_on_cpu_with_finite_gradients(name):
    model = _debug(name)
    ids = torch.randint(model.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(1))
    logits = model(ids)
    assert logits.shape == (2, 37, model.config.vocab_size) and logits.dtype == torch.float32
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    assert abs(loss.item() - math.log(model.config.vocab_size)) < 0.5  # near-uniform at init
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", DEBUG)
def test_bf16_model_computes_the_head_in_fp32(name):
    model = _debug(name).to(torch.bfloat16)
    ids = torch.randint(model.config.vocab_size, (1, 8))
    hidden = model(ids, return_hidden=True)
    assert hidden.dtype == torch.bfloat16
    logits = model(ids)
    assert logits.dtype == torch.float32
    expected = hidden.float() @ model.lm_head.weight.float().T
    torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.lm_head(model.hidden_states(ids)), logits, rtol=0, atol=0)


@pytest.mark.parametrize("name", DEBUG)
def test_changing_a_future_token_does_not_change_earlier_logits(name):
    model = _debug(name)
    ids = torch.randint(model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    changed = ids.clone()
    changed[:, 29] = (changed[:, 29] + 1) % model.config.vocab_size
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :29], b[:, :29], rtol=0, atol=1e-6)
    assert (a[:, 29:] - b[:, 29:]).abs().max() > 1e-3


def test_mamba_mixer_calls_out_proj_as_a_module(monkeypatch):
    model = _debug("nemotron_h_debug")
    mixers = [(i, layer.mixer) for i, layer in enumerate(model.backbone.layers) if layer.kind == "mamba"]
    calls = []
    for i, mixer in mixers:
        original = mixer.out_proj.forward

        def recording(x, i=i, original=original):
            calls.append(i)
            return original(x)

        monkeypatch.setattr(mixer.out_proj, "forward", recording)
    model(torch.randint(100, (1, 5)))
    assert calls == [i for i, _ in mixers]

    class Zero(nn.Module):  # a stand-in converted module: the mixer output must be exactly what it returns
        weight = mixers[0][1].out_proj.weight

        def forward(self, x):
            return torch.zeros(*x.shape[:-1], 64)

    mixer = mixers[0][1]
    mixer.out_proj = Zero()
    assert torch.equal(mixer(torch.randn(1, 5, 64)), torch.zeros(1, 5, 64))


def test_mamba_mixer_matches_a_float64_reference():
    cfg = models.config("nemotron_h_debug", chunk_size=8)
    mixer = Mamba2Mixer(cfg).double()
    mixer.init_weights(torch.Generator().manual_seed(3))
    u = torch.randn(2, 21, cfg.hidden_size, dtype=torch.float64)
    h, p, g, n, d_inner = cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups, cfg.ssm_state_size, cfg.mamba_d_inner
    with torch.no_grad():
        proj = u @ mixer.in_proj.weight.T
        z, xbc, dt = proj[..., :d_inner], proj[..., d_inner : d_inner + cfg.mamba_conv_dim], proj[..., -h:]
        w, bias = mixer.conv1d.weight[:, 0], mixer.conv1d.bias  # [C, K], [C]
        k = cfg.conv_kernel
        conv = torch.stack(
            [bias + sum(w[:, k - 1 - j] * xbc[:, t - j] for j in range(k) if t - j >= 0) for t in range(21)], dim=1
        )
        conv = conv * torch.sigmoid(conv)
        x, b, c = conv.split([d_inner, g * n, g * n], dim=-1)
        y, _ = ssd_sequential(
            x.view(2, 21, h, p),
            dt,
            -torch.exp(mixer.A_log),
            b.view(2, 21, g, n),
            c.view(2, 21, g, n),
            D=mixer.D,
            dt_bias=mixer.dt_bias,
        )
        gated = y.reshape(2, 21, d_inner) * z * torch.sigmoid(z)
        groups = gated.view(2, 21, g, d_inner // g)
        normed = (groups / torch.sqrt(groups.pow(2).mean(-1, keepdim=True) + 1e-5)).view(2, 21, d_inner)
        expected = (normed * mixer.norm.weight) @ mixer.out_proj.weight.T
        torch.testing.assert_close(mixer(u), expected, rtol=0, atol=1e-10)


def test_gated_norm_normalises_each_group_independently():
    norm = GatedRMSNorm(8, group_size=4, eps=1e-12).double()
    norm.init_weights()
    y, z = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    scaled = y.clone()
    scaled[:, :4] *= 100.0
    a, b = norm(y, z), norm(scaled, z)
    torch.testing.assert_close(a[:, 4:], b[:, 4:], rtol=0, atol=0)
    torch.testing.assert_close(a[:, :4], b[:, :4], rtol=1e-8, atol=0)  # scale-invariant up to eps


def test_rope_scores_depend_only_on_relative_position():
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64).expand(1, 1, 12, 16)
    k = torch.randn(1, 1, 1, 16, dtype=torch.float64).expand(1, 1, 12, 16)
    qr, kr = apply_rope(q, k, 10_000.0)
    scores = qr[0, 0] @ kr[0, 0].T  # [T, T]
    for offset in range(-5, 6):
        diag = torch.diagonal(scores, offset)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), rtol=0, atol=1e-12)
    torch.testing.assert_close(qr[0, 0, 0], q[0, 0, 0], rtol=0, atol=0)  # position 0 is not rotated


def test_mamba_ssm_backend_refuses_cpu():
    model = _debug("nemotron_h_debug", ssd_backend="mamba_ssm")
    with pytest.raises(ValueError, match="CUDA"):
        model(torch.randint(10, (1, 4)))


# ----- initialisation ------------------------------------------------------------------------------------


def test_init_weights_after_meta_and_to_empty_follows_the_spec():
    model = models.build("nemotron_h_debug").to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(0))
    direct = _debug("nemotron_h_debug", seed=0)
    for (name, a), (_, b) in zip(model.named_parameters(), direct.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    cfg = model.config
    mixer = model.backbone.layers[0].mixer
    torch.testing.assert_close(mixer.A_log, torch.log(torch.arange(1, cfg.mamba_num_heads + 1.0)))
    assert torch.equal(mixer.D, torch.ones(cfg.mamba_num_heads))
    dt = F.softplus(mixer.dt_bias)
    assert dt.min() >= cfg.time_step_min * (1 - 1e-5) and dt.max() <= cfg.time_step_max * (1 + 1e-5)
    assert mixer.conv1d.weight.abs().max() <= 0.5 and mixer.conv1d.bias.abs().max() <= 0.5
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
    big = torch.cat([model.backbone.embeddings.weight.flatten(), model.lm_head.weight.flatten()])
    assert abs(big.std().item() - 0.02) < 0.001 and abs(big.mean().item()) < 0.001


def test_dt_bias_init_floors_tiny_time_steps():
    cfg = models.config("nemotron_h_debug", time_step_min=1e-6, time_step_max=2e-6, time_step_floor=1e-4)
    mixer = Mamba2Mixer(cfg)
    mixer.init_weights(torch.Generator().manual_seed(0))
    torch.testing.assert_close(F.softplus(mixer.dt_bias), torch.full_like(mixer.dt_bias, 1e-4))


def test_init_weights_is_reproducible_from_a_generator():
    a, b, c = _debug("dense_debug", seed=5), _debug("dense_debug", seed=5), _debug("dense_debug", seed=6)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_no_weight_decay_lists_norms_biases_and_ssm_parameters():
    model = models.build("nemotron_h_debug")
    exempt = set(models.no_weight_decay(model))
    assert "backbone.layers.0.mixer.A_log" in exempt and "backbone.layers.0.mixer.D" in exempt
    assert "backbone.layers.0.mixer.dt_bias" in exempt and "backbone.layers.0.mixer.conv1d.bias" in exempt
    assert "backbone.layers.0.norm.weight" in exempt and "backbone.layers.0.mixer.norm.weight" in exempt
    assert "backbone.norm_f.weight" in exempt
    assert "backbone.layers.0.mixer.conv1d.weight" not in exempt
    assert "backbone.embeddings.weight" not in exempt and "lm_head.weight" not in exempt


# ----- Hugging Face interop ----------------------------------------------------------------------------------

HF_FIXTURE = {  # the shape of the public Nemotron-H 8B config.json (written here, never downloaded)
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": 131072,
    "hidden_size": 4096,
    "num_hidden_layers": 52,
    "hybrid_override_pattern": PATTERN_8B,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 21504,
    "mlp_hidden_act": "relu2",
    "attention_bias": False,
    "mlp_bias": False,
    "use_bias": False,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "expand": 2,
    "use_conv_bias": True,
    "mamba_hidden_act": "silu",
    "time_step_min": 0.001,
    "time_step_max": 0.1,
    "time_step_floor": 0.0001,
    "time_step_limit": [0.0, float("inf")],
    "layer_norm_epsilon": 1e-05,
    "initializer_range": 0.02,
    "residual_in_fp32": False,
    "tie_word_embeddings": False,
    "rescale_prenorm_residual": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def test_config_from_hf_reads_the_public_8b_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_FIXTURE))  # writes inf as Infinity, as HF does
    cfg = hf.config_from_hf(tmp_path)
    assert cfg == hf.config_from_hf(path) == hf.config_from_hf(HF_FIXTURE)
    assert cfg.num_key_value_heads == 8 and cfg.chunk_size == 128  # the public config, not the paper's
    assert cfg.time_step_limit == (0.0, math.inf)
    assert hf.config_from_hf(HF_FIXTURE, num_key_value_heads=4, chunk_size=256) == models.config("nemotron_h_8b")


def test_config_from_hf_accepts_legacy_spellings():
    legacy = {k: v for k, v in HF_FIXTURE.items() if k not in ("hybrid_override_pattern", "n_groups", "conv_kernel")}
    legacy["chunk_size"] = 256
    legacy.update(mamba_n_groups=8, mamba_d_conv=4, num_key_value_heads=4)
    legacy["layers_block_type"] = [{"M": "mamba", "*": "attention", "-": "mlp"}[c] for c in PATTERN_8B]
    assert hf.config_from_hf(legacy) == models.config("nemotron_h_8b")
    minimal = {"vocab_size": 512, "hidden_size": 64, "hybrid_override_pattern": "M*-"}
    cfg = hf.config_from_hf(minimal)
    assert cfg.num_key_value_heads == 8 and cfg.chunk_size == 128  # Hugging Face class defaults


@pytest.mark.parametrize(
    "change",
    [
        {"tie_word_embeddings": True},
        {"attention_bias": True},
        {"mamba_proj_bias": True},
        {"use_conv_bias": False},
        {"residual_in_fp32": True},
        {"hybrid_override_pattern": "M-ME"},
        {"num_hidden_layers": 51},
        {"model_type": "llama"},
    ],
)
def test_config_from_hf_rejects_what_we_do_not_implement(change):
    with pytest.raises(ValueError):
        hf.config_from_hf({**HF_FIXTURE, **change})


@pytest.mark.parametrize("name", ["nemotron_h_8b", "nemotron_h_cpu", "nemotron_h_debug"])
def test_hf_config_dict_round_trips(name):
    cfg = models.config(name)
    assert hf.config_from_hf(json.loads(json.dumps(hf.hf_config_dict(cfg)))) == cfg


@pytest.mark.parametrize("name", DEBUG)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_safetensors_round_trip_is_bit_exact(tmp_path, name, dtype):
    source = _debug(name, seed=1).to(dtype)
    path = hf.save_safetensors(source, tmp_path / "model.safetensors")
    assert os.listdir(tmp_path) == ["model.safetensors"]  # no temporary file left behind
    target = _debug(name, seed=2).to(dtype)
    hf.load_safetensors(target, tmp_path)  # the directory layout finds model.safetensors
    for (key, a), (_, b) in zip(source.state_dict().items(), target.state_dict().items(), strict=True):
        assert a.dtype == b.dtype == dtype and torch.equal(a, b), key
    on_meta = models.build(name)
    hf.load_safetensors(on_meta, path)
    assert all(torch.equal(a, b) for a, b in zip(source.parameters(), on_meta.parameters(), strict=True))


def test_safetensors_uses_hugging_face_names(tmp_path):
    from safetensors import safe_open

    path = hf.save_safetensors(_debug("nemotron_h_debug"), tmp_path / "m.safetensors")
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        assert f.metadata()["format"] == "pt"
    assert {"backbone.embeddings.weight", "backbone.norm_f.weight", "lm_head.weight"} <= keys
    assert {f"backbone.layers.0.mixer.{k}" for k in ("A_log", "D", "dt_bias", "conv1d.weight", "norm.weight")} <= keys


def test_loading_a_mismatched_checkpoint_raises(tmp_path):
    path = hf.save_safetensors(_debug("dense_debug"), tmp_path / "dense.safetensors")
    with pytest.raises(ValueError, match="missing"):
        hf.load_safetensors(_debug("nemotron_h_debug"), path)
    wider = _debug("dense_debug", vocab_size=4128)
    with pytest.raises(ValueError, match="shape"):
        hf.load_safetensors(wider, path)
    with pytest.raises(ValueError, match="meta"):
        hf.save_safetensors(models.build("dense_debug"), tmp_path / "x.safetensors")


# ----- the contract with FP4 conversion ----------------------------------------------------------------------


@pytest.mark.parametrize("name", DEBUG)
def test_every_eligible_linear_converts_and_the_model_still_trains(name):
    from helpers.recipes import for_debug
    from ue5m3.layers.linear import QuantLinear, convert, find_scale_state

    model = models.build(name)
    selected = models.eligible_linears(model)
    recipe = for_debug("ue5m3_b16", name)  # its T = 2048 override on the final layers' down projections
    records = convert(model, recipe, select=selected)
    assert [r.name for r in records] == selected and models.eligible_linears(model) == []
    with pytest.raises(TypeError):  # the FP32 head is never an FP4 candidate
        convert(model, recipe, select=["lm_head"])
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(0))  # initialisation reaches converted modules too
    for module_name in selected:
        weight = model.get_submodule(module_name).weight
        assert isinstance(model.get_submodule(module_name), QuantLinear)
        assert abs(weight.std().item() - 0.02) < 0.005, module_name
    find_scale_state(model).begin_step(1)
    ids = torch.randint(model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_meta_build_for_module_names_does_not_import_torch_dynamo():
    """What a config check builds (every shipped model on the meta device, for its linears' names) stays off
    torch._dynamo, whose import a meta normal_ (nn.Embedding's own initialisation) costs each job over a second."""
    script = (
        "import sys\n"
        "from ue5m3 import models\n"
        "from ue5m3.training.config import model_layers\n"
        "for name in models.names():\n"
        "    models.eligible_linears(models.build(name))\n"
        "model_layers('nemotron_h_debug')\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    assert shown.stdout.strip() == "False", shown.stdout + shown.stderr


def test_a_meta_embedding_is_a_shell_and_a_real_one_is_initialised_as_torch_does():
    meta = models.layers.embedding(10, 4, device="meta")
    assert meta.weight.is_meta and meta.weight.shape == (10, 4) and meta.weight.requires_grad
    torch.manual_seed(0)
    real = models.layers.embedding(10, 4, device="cpu")
    torch.manual_seed(0)
    assert torch.equal(real.weight, nn.Embedding(10, 4).weight)


def test_materialize_gives_to_emptys_tensors_without_importing_sympy():
    """A meta model materialised on the CPU: every parameter and buffer with to_empty's shape, strides, dtype and
    requires_grad, and nothing imported sympy (to_empty's meta empty_like does: 0.6-2 s of each process)."""
    script = (
        "import sys, torch\n"
        "from ue5m3 import models\n"
        "model = models.materialize(models.build('nemotron_h_debug'), 'cpu')\n"
        "print('sympy' in sys.modules)\n"
        "reference = models.build('nemotron_h_debug').to_empty(device='cpu')\n"
        "def described(m):\n"
        "    return [(n, t.device.type, tuple(t.shape), t.stride(), t.dtype, t.requires_grad, type(t).__name__)\n"
        "            for n, t in [*m.named_parameters(), *m.named_buffers()]]\n"
        "print(described(model) == described(reference), len(described(model)))\n"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    sympy_imported, same = shown.stdout.split("\n")[:2]
    assert sympy_imported == "False", shown.stdout + shown.stderr
    assert same.startswith("True") and int(same.split()[1]) > 10, shown.stdout
