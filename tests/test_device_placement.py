"""Every recipe's training and evaluation step on torch's ``meta`` device: no misplaced tensor, no host read.

On ``meta`` a CPU tensor (other than a 0-dim scalar) meeting a meta one raises, as it would on CUDA, and
``.item()``, ``float()``, ``bool()`` and data-dependent shapes cannot run. So a forward, backward and AdamW step of
every recipe there, with the device-generic (torch) backend, proves that the emulated path places every tensor on
the model's device and never synchronises with the host in the loop (placement, not speed).
"""

import pytest
import torch

from helpers.recipes import for_debug
from ue5m3 import models
from ue5m3.layers import recipes
from ue5m3.layers.linear import QuantLinear, convert, find_quant_stats, find_scale_state
from ue5m3.numerics.philox import SRState

RECIPES = recipes.names()


def _meta_model(recipe_name: str, model_name: str):
    model = models.build(model_name, device="meta")
    records = convert(
        model,
        for_debug(recipe_name, model_name),
        select=models.eligible_linears(model),
        sr_state=SRState(1),
        backend="torch",
    )
    return model, records


@pytest.mark.parametrize("model_name", ["dense_debug", "nemotron_h_debug"])
@pytest.mark.parametrize("recipe_name", RECIPES)
def test_training_step_on_meta_places_everything_on_the_device_and_never_reads_back(recipe_name, model_name):
    model, records = _meta_model(recipe_name, model_name)
    assert all(p.device.type == "meta" for p in model.parameters())
    if recipe_name != "bf16":
        assert any(r.status == "converted" for r in records)
    state = find_scale_state(model)
    if state is not None:
        state.begin_step(1)
    vocab = models.config(model_name).vocab_size
    tokens = torch.randint(0, vocab, (2, 32), device="meta")
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), tokens.reshape(-1))
    loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    optimizer.step()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.device.type == "meta" for g in grads)
    stats = find_quant_stats(model)
    if stats is not None:  # the deferred checks and diagnostics live on the device too
        counts = stats.counts()
        assert counts and all(c.device.type == "meta" for c in counts) and len(stats.checks) > 0


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_evaluation_forward_on_meta_places_everything_on_the_device(recipe_name):
    model, _ = _meta_model(recipe_name, "dense_debug")
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.set_inference()
    state = find_scale_state(model)
    if state is not None:
        state.begin_step(1)
    tokens = torch.randint(0, models.config("dense_debug").vocab_size, (1, 32), device="meta")
    with torch.no_grad():
        logits = model(tokens)
    assert logits.device.type == "meta"
