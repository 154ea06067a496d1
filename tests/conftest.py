"""Shared fixtures of the tests; the helpers the test modules import are in the ``helpers`` package (tests/helpers/:
its ``__init__`` lists what is where; no test module imports another, tests/test_test_suite.py checks).

Fixtures: ``one_torch_thread`` (per test) and ``one_torch_thread_per_module``; ``byte_streams`` for the data
pipeline tests and the small identification probe ``corpus``; ``tiny_run`` and ``tiny_bf16_run``, the tiny trained
runs of the evaluation tests (trained once per session, read-only); ``local_mmlu_pro``, a local copy of lm-eval's
leaderboard_mmlu_pro per test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers.threads import torch_threads

# `make test` runs the suite on one pytest-xdist worker per core (`-n $(TEST_WORKERS) --dist loadfile`): each gets its
# share of the cores as its torch thread count, and so do the processes its tests start (OMP_NUM_THREADS), so that the
# workers do not oversubscribe the machine. Tests that compare thread counts set their own.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    _SHARE = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(_SHARE)
    torch.set_num_threads(_SHARE)

HEAVIEST_MODULES = (
    "test_tiny_dag.py",
    "test_train_distributed.py",
    "test_pipeline.py",
    "test_triton_cuda_pin.py",
    "test_device_placement.py",
    "test_telemetry.py",
    "test_hf.py",
    "test_triton_gemm.py",
    "test_early_warning.py",
    "test_triton_planning.py",
    "test_reliability.py",
    "test_gpu_check.py",
    "test_grid_control.py",
    "test_triton_linear.py",
    "test_checkpoint_verification.py",
    "test_triton_compile.py",
)
"""The modules that hold most of the suite's time, heaviest first (`pytest --durations=150`, 2026-12-07: 403 s down to
25 s each; together 1,450 of the suite's 1,865 s). They are collected first, so that `--dist loadfile` hands them
out first and the workers finish together instead of one waiting on a heavy module it was given last."""


def pytest_collection_modifyitems(config, items):
    """Collect the heaviest modules first (in HEAVIEST_MODULES's order), then the rest as pytest found them."""
    missing = [name for name in HEAVIEST_MODULES if not (Path(__file__).parent / name).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py HEAVIEST_MODULES names modules that do not exist: {missing}")
    rank = {name: i for i, name in enumerate(HEAVIEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# Without a GPU the Triton kernels can only run in Triton's interpreter. Set it before any test module imports
# triton (torchao does): triton reads the variable once, at import time.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_torch_thread():
    """Run the test with one torch thread (bit-exact comparisons of CPU runs, as the pipeline runs jobs)."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def one_torch_thread_per_module():
    """One torch thread for a whole module (tiny CPU models: extra intra-op threads only add synchronisation, and
    thrash on a shared 2-core runner); use it as an autouse or ``usefixtures`` fixture of the module."""
    with torch_threads(1):
        yield


# ----- data, identification and evaluation fixtures (imports are local: the numerics tests do not need them) -----


@pytest.fixture(scope="session")
def byte_streams(tmp_path_factory):
    """Two token-shard streams of synthetic documents under the byte tokenizer: 37 documents in several shards of
    at most 200 tokens (stream A) and 11 in one shard (stream B); shared by the shard and loader tests."""
    from helpers.data import ByteTokenizer, synthetic_docs
    from ue5m3.data import TokenShards, tokenize_to_shards

    root = tmp_path_factory.mktemp("streams")
    tokenizer = ByteTokenizer(root / "tokenizer.txt")
    a = tokenize_to_shards(synthetic_docs("A", 37), tokenizer, root / "a", shard_tokens=200)
    b = tokenize_to_shards(synthetic_docs("B", 11), tokenizer, root / "b")
    return TokenShards(a.parent), TokenShards(b.parent)


@pytest.fixture(scope="session")
def corpus():
    """The small identification probe corpus (helpers.identify.SMALL), built once and shared by the
    identification tests; tests/test_cli_identify.py overrides it with its own on-disk corpus."""
    from helpers.identify import SMALL
    from ue5m3.identify import make_corpus

    return make_corpus(SMALL)


def _shared_run(tmp_path_factory, recipe: str):
    """Train :func:`helpers.inference.make_run` once; after the session, fail if any test changed a file of it (a
    test that writes into the run works on a ``shutil.copytree`` of it in its ``tmp_path``)."""
    from helpers.files import file_digests
    from helpers.inference import make_run

    root = tmp_path_factory.mktemp(f"tiny_run_{recipe}")
    run = make_run(root, recipe=recipe)
    before = file_digests(root)
    yield run
    assert file_digests(root) == before, f"a test changed the shared tiny run in {root}: copy it before writing into it"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """(run directory, DataConfig) of :func:`helpers.inference.make_run` with the ue5m3_b16 recipe, trained once per
    session and shared by the inference, evaluation, snapshot and downstream tests; read-only."""
    yield from _shared_run(tmp_path_factory, "ue5m3_b16")


@pytest.fixture(scope="session")
def tiny_bf16_run(tmp_path_factory):
    """:func:`helpers.inference.make_run` with the bf16 recipe, trained once per session; read-only."""
    yield from _shared_run(tmp_path_factory, "bf16")


@pytest.fixture
def local_mmlu_pro(tmp_path):
    """:func:`helpers.olmes.make_local_mmlu_pro` in the test's ``tmp_path``: (TaskManager reading it, its rows)."""
    from helpers.olmes import make_local_mmlu_pro

    return make_local_mmlu_pro(tmp_path)
