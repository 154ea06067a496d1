"""Packaged recipes resolved for the models the tests build.

The packaged recipes name their layers relative to the model's depth ("the final 8 layers"). The 8B model is what
they were written for; the debug models (2 and 7 layers) are shallower than that, so :func:`for_debug` first cuts
each selector to at most half the layers it counts, which keeps the BF16 exemption and the overrides on the final
layers while leaving FP4 layers in front of them.
"""

from __future__ import annotations

import dataclasses

from ue5m3.layers import recipes
from ue5m3.layers.recipes import LayerSelector, Recipe
from ue5m3.training.config import model_layers

__all__ = ["eight_b", "for_8b", "for_debug"]


def eight_b() -> recipes.ModelLayers:
    """The 52 layers and 112 eligible linears of Nemotron-H 8B (a cached meta-device build)."""
    return model_layers("nemotron_h_8b")


def for_8b(recipe: Recipe | str) -> Recipe:
    """``recipe`` (or a packaged name) resolved for the 8B model: the absolute indices the paper names."""
    recipe = recipes.get(recipe) if isinstance(recipe, str) else recipe
    return recipe.for_model(eight_b())


def for_debug(recipe: Recipe | str, model: str, **model_overrides) -> Recipe:
    """``recipe`` (or a packaged name) resolved for a small model, its selectors cut to half what they count."""
    recipe = recipes.get(recipe) if isinstance(recipe, str) else recipe
    layers = model_layers(model, model_overrides)

    def cut(selection):
        if not isinstance(selection, LayerSelector):
            return selection
        cap = max(1, len(layers.of_kind(selection.kind)) // 2)
        last = min(selection.last, cap)
        return dataclasses.replace(selection, first=min(selection.first, cap - last), last=last)

    overrides = tuple(dataclasses.replace(o, layers=cut(o.layers)) for o in recipe.target_overrides)
    cut_recipe = dataclasses.replace(recipe, bf16_layers=cut(recipe.bf16_layers), target_overrides=overrides)
    return cut_recipe.for_model(layers)
