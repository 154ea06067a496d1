"""The FP4 conformance matrix: every implementation researchers use, compared with this one on the CPU.

A shared corpus of tensors (:mod:`.corpus`) goes through each peer's own code (:mod:`.adapters`, one module per peer)
and through this project's, operation by operation (:mod:`.operations`), and each (operation, peer) cell is judged
(:mod:`.judge`): bit-exact, within N ulp, equal in distribution (the test and its p-value), or different, with the
smallest counterexample saved as a file a reader can load and every known difference named with its cause
(:mod:`.known`). :func:`ue5m3.conformance.run.run` writes the matrix with the peers' versions; ``ue5m3 conformance``
and the pipeline's rule ``conformance`` call it. A peer that is not installed is a cell of its own ("not installed"),
never a silent skip.
"""
