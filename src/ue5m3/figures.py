"""The registry of the reproduction's figures and comparison tables: one entry each, from which ``rule all``, the
report's views and captions, the notebooks' messages and the READMEs' tables are generated.

:data:`FIGURES` lists every figure and comparison table: the rule and output key that draw it, its stage (in
:data:`ue5m3.stages.STAGES`), its title and its caption. ``rule all`` asks for every figure here, each figure's
report view and caption come from its entry, and nothing else lists them.

Captions are Jinja templates rendered by Snakemake's report with the job's ``snakemake`` object (``snakemake.config``
is the pipeline config with every default filled in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ue5m3.stages import STAGES, stage

__all__ = ["Figure", "FIGURES", "figure", "figures_of", "figure_rules", "stage_table", "figures_table"]


@dataclass(frozen=True)
class Figure:
    """One figure (``pdf``) or comparison table (``csv``) of ``figures/``."""

    name: str  # the file's stem in figures/ and its report view's in results/report/
    kind: Literal["pdf", "csv"]
    rule: str  # the notebook rule that writes it
    key: str  # its name among that rule's outputs (the notebook's ``snakemake.output.<key>``)
    stage: str
    title: str
    caption: str

    @property
    def file(self) -> str:
        return f"{self.name}.{self.kind}"

    @property
    def view(self) -> str:
        """The report view: a PNG of the figure, an HTML page of the table."""
        return f"{self.name}.{'png' if self.kind == 'pdf' else 'html'}"


_SCALE = (
    "{{ 'paper scale (config/paper.yaml)' if snakemake.config['training']['model'] == 'nemotron_h_8b' else "
    "'CPU scale (config/config.yaml): small models and short runs, so compare directions and orderings with the "
    "paper, not magnitudes' }}"
)

FIGURES: tuple[Figure, ...] = (
    Figure(
        "claims",
        "csv",
        "claims_figures",
        "table",
        "claims",
        "The claims table",
        "Each claim of the paper with the experiment that tests it, the scale it ran at ("
        + "{{ snakemake.config['training']['model'] }}), our effect paired over seeds with its 95% t interval and "
        "minimum detectable effect at 80% power, the paper's effect, and the verdict: reproduced (the interval "
        "excludes zero on the paper's side), contradicted (on the other side), inconclusive, or not run.",
    ),
    Figure(
        "claims_effects",
        "pdf",
        "claims_figures",
        "figure",
        "claims",
        "The claims on one axis",
        "Every claim's paired effect in units of the paper's effect (1 = the paper's effect, in its direction; the "
        "equivalence claim in units of its margin), our 95% interval as a bar, the paper's value as a hollow marker; "
        "the verdict beside each claim's name.",
    ),
    Figure(
        "range_codebooks",
        "pdf",
        "range_figures",
        "codebooks",
        "range_analysis",
        "Codebooks of the block-scale formats",
        "Every positive finite value of E4M3 (the block scale of TE's recipe) and of UE5M3, one panel each, on a "
        "shared log axis: both have three fraction bits (8 codes per binade); UE5M3 spans 2^-17 to 61,440, E4M3 "
        "2^-9 to 448 (paper section 4.1). Analytic, the same at every scale.",
    ),
    Figure(
        "range_headroom",
        "pdf",
        "range_figures",
        "headroom",
        "range_analysis",
        "Stale-growth headroom",
        "The headroom U / T of each block-scale format (U its largest scale, T the target) against T in "
        "{{ snakemake.config['range_analysis']['targets'] }}, both axes log: how far a tensor's amax may rise above "
        "a stale reference before the block scales saturate; below 1 a format cannot hold the current amax (paper "
        "section 5.2: about 137x at T = 448 and 30x at T = 2048 for UE5M3). Analytic.",
    ),
    Figure(
        "range_worked_example",
        "pdf",
        "range_figures",
        "worked_example",
        "range_analysis",
        "Worked example of scale placement",
        "The worked example of the paper: tensor reference g = "
        "{{ snakemake.config['range_analysis']['example_reference'] }} mapped to T in "
        "{{ snakemake.config['range_analysis']['example_targets'] }}: for each target the range of nonzero block "
        "maxima UE5M3 scales represent, with the scale code of a block whose amax is g. Analytic.",
    ),
    Figure(
        "accumulation_rtz_bias",
        "pdf",
        "accumulation_figures",
        "rtz_bias",
        "accumulation",
        "Bias of round-toward-zero accumulation",
        "Relative bias of round-toward-zero cross-slice FP32 accumulation against exact sums: "
        "{{ snakemake.config['accumulation']['dots'] }} dot products of K = {{ snakemake.config['accumulation']['k'] }}"
        " per cell (the paper: 4,096), {{ snakemake.config['accumulation']['slice_width'] }}-wide exact slices, per "
        "operand distribution and operand type. The bias is negative in magnitude (toward zero); the paper's values "
        "are in accumulation_vs_paper.",
    ),
    Figure(
        "accumulation_cancellation",
        "pdf",
        "accumulation_figures",
        "cancellation",
        "accumulation",
        "Near cancellation",
        "Error of the probe-matched accumulation as cancellation grows (the exact sum small against the sum of "
        "magnitudes), RNE against RTZ slice combination, with and without the 1/"
        "{{ snakemake.config['accumulation']['grid'] }} lattice snap.",
    ),
    Figure(
        "accumulation_grid_sweep",
        "pdf",
        "accumulation_figures",
        "grid_sweep",
        "accumulation",
        "Final-grid sweep",
        "Effect of the final lattice denominator on the accumulated output (the paper keeps 1/1024: the coarsest grid "
        "preserving all native permutation matches).",
    ),
    Figure(
        "accumulation_vs_paper",
        "csv",
        "accumulation_figures",
        "comparison",
        "accumulation",
        "Accumulation statistics against the paper",
        "Our accumulation statistics beside the paper's (appendix C table), with the difference, the relative "
        "difference and a verdict against the stated tolerance. Seed {{ snakemake.config['accumulation']['seed'] }}; "
        "{{ snakemake.config['accumulation']['dots'] }} dots per cell here.",
    ),
    Figure(
        "training_loss",
        "pdf",
        "training_figures",
        "loss",
        "training",
        "Training loss",
        "Training loss of every recipe ({{ snakemake.config['training']['recipes'] | join(', ') }}), "
        "{{ snakemake.config['training']['summary']['smoothing_steps'] }}-step moving means, seeds "
        "{{ snakemake.config['training']['seeds'] }}; model {{ snakemake.config['training']['model'] }}, "
        "{{ snakemake.config['training']['steps'] }} steps. " + _SCALE + ". Paper: the proposed B16 recipe ends at "
        "2.3090 against 2.3474 for Transformer Engine NVFP4.",
    ),
    Figure(
        "training_final_window",
        "pdf",
        "training_figures",
        "final_window",
        "training",
        "Final-window training loss",
        "Each recipe's final-window mean training loss (the last "
        "{{ snakemake.config['training']['summary']['final_window'] }} logged points) minus BF16's of the same seed: "
        "ours as the mean with its 95% t interval over seeds, the paper's 8B single-seed gap beside it, each bar's "
        "verdict under it. "
        + _SCALE
        + ". Paper (section 7.3): B16 2.3090, B32 2.3241, TE NVFP4 2.3474 against BF16 2.2651.",
    ),
    Figure(
        "training_stability",
        "pdf",
        "training_figures",
        "stability",
        "training",
        "Training stability",
        "Stability counters per recipe: losses above 3 and gradient norms above 1 (moving median of the gradient "
        "norm). Paper: none for the proposed recipe after step 2,500; 205 and 89 for the native no-RHT/all-linears "
        "ablation.",
    ),
    Figure(
        "control_override",
        "pdf",
        "training_figures",
        "control",
        "override_control",
        "The T = 2048 override control",
        "The T = 2048 override control (the paper's 350M dense experiment): the proposed recipe with T = 448 "
        "everywhere against T = 2048 on the wgrad dY of the second MLP matrix in the final layers; model "
        "{{ snakemake.config['control']['model'] }}. Paper: final-window mean 2.9090 (T = 448) against 2.9025 "
        "(override), a difference of -0.0066.",
    ),
    Figure(
        "training_vs_paper",
        "csv",
        "training_figures",
        "table",
        "training",
        "Training against the paper",
        "Our training results beside the paper's table (final-window means, endpoints, stability counters) with "
        "difference, relative difference and the agreement verdict (tolerance stated in the table). " + _SCALE + ".",
    ),
    Figure(
        "validation_nll",
        "pdf",
        "evaluation_figures",
        "nll",
        "validation",
        "Validation NLL",
        "Held-out validation NLL at every evaluated checkpoint ({{ snakemake.config['evaluation']['steps'] }}) under "
        "each recipe's inference policy (B16, B32, torch control: cold D = 50 replay; TE settings and NVFP4: current "
        "scaling; BF16 unquantized), with bootstrap intervals where the path is stateless. Paper: step-30,000 NLL "
        "2.32230 (B16) against 2.32592 (TE NVFP4).",
    ),
    Figure(
        "validation_vs_bf16",
        "pdf",
        "evaluation_figures",
        "vs_bf16",
        "validation",
        "Validation NLL against BF16",
        "Validation NLL relative to BF16 at each checkpoint: 100 x (BF16 - candidate) / BF16 percent.",
    ),
    Figure(
        "policy_sensitivity",
        "pdf",
        "evaluation_figures",
        "sensitivity",
        "policy_sensitivity",
        "Sensitivity to the inference policy",
        "Sensitivity of the proposed recipe ({{ snakemake.config['evaluation']['sensitivity_recipe'] }}) to the "
        "activation-scale policy at its last checkpoint: "
        "{{ snakemake.config['evaluation']['sensitivity_policies'] | join(', ') }}, with the replay-order spread "
        "({{ snakemake.config['evaluation']['nll']['replay_orders'] }} orders). Paper: the largest difference among "
        "the three policies is 8.99e-5 NLL, each below TE NVFP4's 2.325921.",
    ),
    Figure(
        "scale_snapshot",
        "pdf",
        "evaluation_figures",
        "snapshot",
        "scale_snapshot",
        "Checkpoint scale-target snapshot",
        "Checkpoint scale-target snapshot: raw UE5M3 codes of the block-16 maxima of dY^T in the late down projections "
        "for T = 448 and T = 2048, as histograms over the log10 of their magnitude; counts of zero, below-2^-17 and "
        "saturated codes. Paper finding: no pre-repair zero-rounded or saturated codes for either target.",
    ),
    Figure(
        "validation_vs_paper",
        "csv",
        "evaluation_figures",
        "table",
        "validation",
        "Validation NLL against the paper",
        "Our validation NLL beside the paper's 84-point table (12 checkpoints x 7 trajectories), checkpoints paired "
        "by their fraction of training, with seed and order ranges, with difference, relative difference and "
        "verdict. " + _SCALE + ".",
    ),
    Figure(
        "policy_sensitivity_vs_paper",
        "csv",
        "evaluation_figures",
        "sensitivity_table",
        "policy_sensitivity",
        "Policy sensitivity against the paper",
        "The policy-sensitivity numbers beside the paper's, with difference, relative difference and verdict.",
    ),
    Figure(
        "scale_snapshot_vs_paper",
        "csv",
        "evaluation_figures",
        "snapshot_table",
        "scale_snapshot",
        "Scale snapshot against the paper",
        "The snapshot's code counts beside the paper's finding, with the agreement verdict.",
    ),
    Figure(
        "downstream",
        "pdf",
        "downstream_figures",
        "figure",
        "downstream",
        "Downstream accuracy",
        "Downstream accuracy (OLMES-style Core 9 MC/RC and MMLU, offline task data) at the last evaluated "
        "checkpoint of {{ snakemake.config['evaluation']['downstream_recipes'] | join(', ') }}; "
        "{{ snakemake.config['evaluation']['downstream']['examples'] or 'all' }} examples per task. Paper: B16 minus "
        "TE NVFP4 = +0.13, +1.01, +0.01 points on Core 9, MMLU, MMLU-Pro MC.",
    ),
    Figure(
        "downstream_vs_paper",
        "csv",
        "downstream_figures",
        "table",
        "downstream",
        "Downstream aggregates against the paper",
        "Downstream aggregates beside the paper's, with difference and verdict.",
    ),
    Figure(
        "emulator_identification",
        "pdf",
        "identification_figures",
        "figure",
        "identification",
        "Emulator identification",
        "Fit of the candidate GEMM output models to the oracle's labels: how many witness outputs each candidate "
        "(slice width, combination rounding, final grid) reproduces. The paper identifies 64-wide slices, RTZ "
        "combination and the 1/1024 lattice: 366 of 512 native FP32 values matched against 6 for RNE accumulation.",
    ),
    Figure(
        "emulator_identification_vs_paper",
        "csv",
        "identification_figures",
        "table",
        "identification",
        "Emulator identification against the paper",
        "The identified emulator parameters and match counts beside the paper's, with the verdict.",
    ),
    Figure(
        "parity",
        "csv",
        "identification_figures",
        "parity",
        "identification",
        "Backend parity",
        "Parity of two GEMM backends on one training run: loss difference, gradient relative L2 and maximum absolute "
        "error (the paper: exactly zero on the 1.2B control between native TE and the emulator).",
    ),
    Figure(
        "grid_regression_control",
        "pdf",
        "grid_control_figures",
        "figure",
        "grid_control",
        "Grid-regression control",
        "The grid-regression control at the paper's full size (paper appendix C): left, the training MSE per arm "
        "(BF16, UE5M3 B16 with RNE or stochastic dY rounding; mean over seeds, band the seed range) for every final "
        "grid, which draw on top of each other when the grids are bit-identical; right, each arm's mean final eval "
        "MSE, ours beside the paper's, on a log axis.",
    ),
    Figure(
        "grid_regression_control_vs_paper",
        "csv",
        "grid_control_figures",
        "table",
        "grid_control",
        "Grid-regression control against the paper",
        "The grid-regression control beside the paper's numbers, one row per (arm, metric), with the difference, the "
        "relative difference and the verdict (MSE within 10%, bit identity exact).",
    ),
    Figure(
        "throughput_ablation",
        "pdf",
        "throughput_figures",
        "figure",
        "throughput",
        "Throughput ablation",
        "Model-body throughput (forward + backward, no data loading, optimizer or head) of the TE NVFP4 recipe and the "
        "no-RHT/all-linears ablation, beside the BF16 body timed in the same run. Ours: the configured runs "
        "({% for name, run in snakemake.config['throughput']['runs'].items() %}{{ name }}: {{ run['execution'] }} on "
        "{{ run['device'] }}{{ '; ' if not loop.last }}{% endfor %}); the paper: native NVFP4 on one GB200, 3,212 "
        "against 3,894 tokens/s, +21.2%.",
    ),
    Figure(
        "throughput_vs_paper",
        "csv",
        "throughput_figures",
        "table",
        "throughput",
        "Throughput against the paper",
        "Throughput ratios beside the paper's table 10, with the agreement verdict (an emulated CPU-scale ratio is not "
        "expected to match the native one).",
    ),
)


def figure(name: str) -> Figure:
    """The figure or table named ``name`` (its file's stem)."""
    for entry in FIGURES:
        if entry.name == name:
            return entry
    raise KeyError(f"unknown figure {name!r}; figures: {[f.name for f in FIGURES]}")


def figures_of(rule: str) -> tuple[Figure, ...]:
    """The figures and tables one notebook rule writes, in registry order."""
    return tuple(f for f in FIGURES if f.rule == rule)


def figure_rules() -> tuple[str, ...]:
    """Every notebook rule that draws figures, in registry order."""
    return tuple(dict.fromkeys(f.rule for f in FIGURES))


def stage_table() -> str:
    """The README's table of stages: each stage with the paper's section and its figures and tables (Markdown)."""
    lines = ["| stage | paper | figures and tables (`figures/`) | drawn by |", "|---|---|---|---|"]
    for s in sorted(STAGES, key=lambda entry: entry.order):
        items = [f for f in FIGURES if f.stage == s.name]
        files = ", ".join(f"`{f.file}`" for f in items)
        rules = ", ".join(f"`{rule}`" for rule in dict.fromkeys(f.rule for f in items))
        lines.append(f"| {s.title} | {s.paper} | {files} | {rules} |")
    return "\n".join(lines) + "\n"


def figures_table() -> str:
    """``figures/README.md``'s table: every figure and comparison table with its stage, the paper's section and the
    rule that draws it (Markdown)."""
    lines = ["| file | stage (paper) | drawn by | shows |", "|---|---|---|---|"]
    for f in sorted(FIGURES, key=lambda entry: stage(entry.stage).order):
        s = stage(f.stage)
        lines.append(f"| `{f.file}` | {s.title} ({s.paper}) | `{f.rule}` | {f.title} |")
    return "\n".join(lines) + "\n"


FIGURES += (
    Figure(
        "conformance",
        "pdf",
        "conformance_figures",
        "figure",
        "conformance",
        "The FP4 conformance matrix",
        "Each operation (rows) against each peer implementation (columns), run on the CPU on one corpus of tensors "
        "(Gaussian, heavy-tailed, outlier channels, E2M1 and scale-code midpoints, FP32 extremes, zeros, signed "
        "zeros, a ragged shape, NaN/inf for the casts): green bit-exact, yellow within N ulp, blue equal in "
        "distribution (the test's p-value), red different (the cell names the known difference that explains it, "
        "its counterexample is in results/conformance/counterexamples/), grey not installed (pip install "
        "'ue5m3[conformance]') or not run. Transformer Engine needs CUDA: its column is a transcription of its "
        "reference code at the commit named in the table. Beyond the paper.",
    ),
    Figure(
        "conformance_matrix",
        "csv",
        "conformance_figures",
        "table",
        "conformance",
        "The FP4 conformance matrix as a table",
        "One row per cell: the verdict, its detail (ulp, test and p-value), the elements compared, differing and "
        "excluded (outside what the peer's arithmetic defines), the known differences with their causes, the "
        "counterexample file, the peer's version and whether its own code or a transcription ran.",
    ),
)

FIGURES += (
    Figure(
        "format_study",
        "pdf",
        "format_study_figures",
        "figure",
        "format_study",
        "The block-scale format study",
        "Each trained recipe's final-window training loss minus the reference arm's (the study's ue5m3_t448, else the "
        "proposed ue5m3_b16) and minus BF16's, paired per seed (seeds "
        "{{ snakemake.config['training']['seeds'] }}), with the 95% t interval and the verdict, grouped by "
        "scale-format family; model {{ snakemake.config['training']['model'] }}, "
        "{{ snakemake.config['training']['steps'] }} steps. The study's arms, each one factor away from the "
        "reference (scale format, target, top-code convention, 4/6 selection, power-of-two scale rounding and block "
        "size, reference period D), are listed in config/study_formats.yaml and drawn when trained. Beyond the paper.",
    ),
    Figure(
        "format_study_table",
        "csv",
        "format_study_figures",
        "table",
        "format_study",
        "The block-scale format study as a table",
        "One row per recipe: its scale format, block, target(s), D, scale rule and selection, how it differs from the "
        "reference arm, its paired effects against the reference and BF16 with 95% t intervals, the minimum "
        "detectable effect at 80% power and the verdicts, and its runs' scale telemetry totals.",
    ),
    Figure(
        "scale_telemetry",
        "pdf",
        "format_study_figures",
        "telemetry",
        "scale_telemetry",
        "Scale telemetry over training",
        "Per operand role and recipe over the logged steps (every "
        "{{ snakemake.config['training']['log_every'] }} steps): the largest headroom margin T * rho / U of a held "
        "reference (Proposition 1: blocks saturate above 1), the share of blocks whose scale rounded to zero before "
        "repair, and the E2M1 dead-zone share, means over linears and seeds. Beyond the paper.",
    ),
    Figure(
        "early_warning",
        "csv",
        "format_study_figures",
        "warnings",
        "scale_telemetry",
        "The early warning per run",
        "Per run: the first logged step the early warning flags (the thresholds of format_study.warning, "
        "docs/format_study.md: the headroom margin, saturated and top-code shares of held references, the "
        "zero-rounded and underflowed shares), the condition that crossed, the step the loss diverged (a stated "
        "rise above its first logged value) "
        "and the lead. The healthy runs of the pipeline are not expected to be flagged.",
    ),
)
