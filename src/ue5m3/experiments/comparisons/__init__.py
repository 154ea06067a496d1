"""Our numbers beside the paper's: the ``figures/*_vs_paper.csv`` tables (and the backend parity table).

Each figure notebook writes, next to its figures, one CSV that puts this project's measurements row by row
beside the numbers the paper reports (:mod:`ue5m3.reference`; never typed in). The tables are built here, as
pure functions of the result tables the pipeline writes and the reference table as
:func:`ue5m3.reference.load` returns it, so they are tested and the notebooks only load, call and draw.

Every comparison table ends with the same four agreement columns
(:func:`ue5m3.experiments.agreement.with_agreement`): our value minus the paper's, that difference over the
paper's magnitude, the tolerance in words (its rule and why it means something there) and the verdict. Each
table's tolerance is a module constant here (``*_TOLERANCE`` or ``*_TOLERANCES``, per metric). Where both sides
ran the same experiment (accumulation statistics, the tiny grid control) it is a sampling spread; where our runs
are CPU scale beside the paper's 8B runs the comparison is qualitative (the sign of an effect against BF16).

- :func:`accumulation_vs_paper` (appendix C): RTZ magnitude bias and gain error of BF16 operands, and the
  final-grid sweep, one row per reference row;
- :func:`training_vs_paper`: each recipe's final-window mean loss and its gap to BF16, ours (mean and spread
  over seeds) beside the paper's 8B single-seed numbers; the gap is the comparable quantity, scales differ;
- :func:`validation_vs_paper`: held-out NLL per recipe and checkpoint (ours: mean, min and max over seeds, and
  the widest single-evaluation interval: the replay's order range or a bootstrap interval) and its percent
  against BF16, beside the paper's at the same fraction of training;
- :func:`policy_sensitivity_vs_paper`: one recipe's NLL under each inference policy at the last checkpoint, as
  percent against BF16, beside the paper's for the policy it used;
- :func:`scale_snapshot_vs_paper` (section 5.3): zero-rounded and saturated scale codes of the checkpoint
  snapshot, beside the paper's (none);
- :func:`downstream_vs_paper`: Core 9, MMLU and MMLU-Pro MC accuracy in percent (mean, min, max and number
  of seeds) and its gap to BF16, beside the paper's step-30,000 aggregates;
- :func:`emulator_identification_vs_paper`: per fit, the cells each GEMM output model reproduces bit for bit
  in the paper's identification tables, beside the paper's native-Blackwell counts;
- :func:`grid_regression_control_vs_paper`: the tiny grid-regression control's mean final eval MSE per arm
  and whether each arm is bit-identical across the final grids, ours beside the paper's, one row per metric;
- :func:`throughput_vs_paper` (table 10): model-body tokens/s, time per 100 steps and the speed-up of the
  no-RHT/all-linears ablation over the TE recipe within each of our runs, beside the paper's native numbers;
- :func:`parity_table`: not a paper comparison but the other table a notebook builds: two GEMM backends
  compared per tensor group after one training run each.

The pipeline's CSVs are these frames written with :func:`ue5m3.artifacts.write_csv` (columns in frame
order), so a frame's columns, row order, values and dtypes are the file's contents; changing any of them
changes a pipeline output.
"""

from ue5m3.experiments.comparisons.common import BASELINE, Record, reference_by_recipe
from ue5m3.experiments.comparisons.measurements import *  # noqa: F403
from ue5m3.experiments.comparisons.measurements import __all__ as _measurements
from ue5m3.experiments.comparisons.recipes import *  # noqa: F403
from ue5m3.experiments.comparisons.recipes import __all__ as _recipes

__all__ = ["Record", "BASELINE", "reference_by_recipe", *_recipes, *_measurements]
