"""Which optional compute paths this machine offers, for skip conditions."""

from __future__ import annotations


def native_te_available() -> bool:
    """Whether the native Transformer Engine NVFP4 path runs here (Transformer Engine and a Blackwell GPU)."""
    from ue5m3.layers import native_te

    try:
        native_te.require_native()
    except native_te.NativeUnavailable:
        return False
    return True
