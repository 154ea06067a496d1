"""The quantized-inference policies (numerics spec section 4, paper appendix A), without importing torch: the
command line's choices and the pipeline's wildcards are built from this one enum."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["InferencePolicy", "REPLAY_INTERVAL"]

REPLAY_INTERVAL = 50
"""D of the cold replay policy (the paper's training interval)."""


class InferencePolicy(StrEnum):
    """The activation-reference policy of a post-load evaluation.

    * ``bf16``: no FP4 at all (the BF16 run, or a quantized run evaluated unquantized);
    * ``current_tensor``: each activation's own amax (D = 1);
    * ``cold_d50_replay``: D = 50 sample-and-hold from a cold start, one refresh per 50 work units;
    * ``calibrated_frozen``: the max amax over the calibration windows, then frozen.
    """

    BF16 = "bf16"
    CURRENT_TENSOR = "current_tensor"
    COLD_D50_REPLAY = "cold_d50_replay"
    CALIBRATED_FROZEN = "calibrated_frozen"
