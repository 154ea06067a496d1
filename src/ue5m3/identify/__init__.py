"""Emulator identification (gemm spec section 3): probe corpora, oracles, and the candidate fitter.

``fit(corpus, oracle, candidates)`` matches every candidate output model against an oracle's outputs on a
probe corpus and returns the match table; ``ue5m3 fit-emulator`` is the command-line entry point.
"""

from ue5m3.identify.candidates import MMA_SIM, PROBE_MATCHED, Candidate, accumulate_cells, candidate_grid, parse
from ue5m3.identify.corpus import Corpus, make_corpus
from ue5m3.identify.fit import MatchTable, fit
from ue5m3.identify.oracles import EmulatorOracle, OracleUnavailable, RecordedOracle, make_oracle, record
from ue5m3.identify.probes import CorpusConfig, Probe

__all__ = [
    "Candidate",
    "Corpus",
    "CorpusConfig",
    "EmulatorOracle",
    "MMA_SIM",
    "MatchTable",
    "OracleUnavailable",
    "PROBE_MATCHED",
    "Probe",
    "RecordedOracle",
    "accumulate_cells",
    "candidate_grid",
    "fit",
    "make_corpus",
    "make_oracle",
    "parse",
    "record",
]
