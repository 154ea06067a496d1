"""Shared helpers of the emulator identification tests (``tests/test_identify_*.py``): the small probe corpus
configuration (the ``corpus`` fixture built from it lives in tests/conftest.py)."""

from __future__ import annotations

from ue5m3.identify.probes import CorpusConfig

SMALL = CorpusConfig(
    order_k=512, order_permutations=32, threshold_k=512, threshold_cells=256, broad_m=32, broad_n=32,
    broad_k=512, broad_cells=128,
)  # fmt: skip
