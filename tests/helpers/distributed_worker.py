"""Worker of the multi-process training tests (``helpers.distributed`` launches it), run as a script:
``torchrun --nproc-per-node N tests/helpers/distributed_worker.py CFG [LOG]``.

With LOG, every collective the run issues through ``torch.distributed`` (FSDP2's all-gathers and reduce-scatters,
DDP's and the trainer's all-reduces, the scale references' MAX all-reduces) is appended to ``LOG.<rank>.jsonl`` as
one record: the optimizer step it ran in (0: building and resuming), its kind, dtype and element count.

With ``UE5M3_LOG_HASHES=PREFIX``, every file a checkpoint verification hashes is appended to ``PREFIX.<rank>.jsonl``
(the rank and the path).

With ``UE5M3_NATIVE_WIRING_STAND_IN=1`` the run takes the ``native_te`` build path with plain ``nn.Linear`` modules
standing in for ``te.Linear``: a test of the wiring only (checkpointing, attributes kept across ``fully_shard``,
sharding); Transformer Engine does not run.

Run as a script, this file's folder (tests/helpers) heads ``sys.path``: the worker imports nothing from it, and
tests/test_test_suite.py checks that no helper module's name shadows an installed module.
"""

import contextlib
import functools
import json
import os
import sys

import torch
import torch.distributed as dist

from ue5m3.data import RandomTokenStream
from ue5m3.training import loop as train
from ue5m3.training.config import TrainConfig

COLLECTIVES = (
    "all_gather_single",
    "reduce_scatter_single",
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
)


def _log_collectives(path: str) -> None:
    """Wrap torch.distributed's collectives (and the trainer's step) to record each call."""
    current = {"step": 0}
    log = open(f"{path}.{dist.get_rank()}.jsonl", "a")  # noqa: SIM115 - open for the whole run

    def wrap(name, fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            tensor = args[0] if args else next(iter(kwargs.values()))
            record = {"step": current["step"], "op": name, "dtype": str(tensor.dtype), "numel": tensor.numel()}
            log.write(json.dumps(record) + "\n")
            log.flush()
            return fn(*args, **kwargs)

        return run

    for name in COLLECTIVES:
        setattr(dist, name, wrap(name, getattr(dist, name)))
    step = train.train_step

    def counted_step(number, *args, **kwargs):
        current["step"] = number
        try:
            return step(number, *args, **kwargs)
        finally:
            current["step"] = 0

    train.train_step = counted_step


def _log_hashes(prefix: str, rank: int) -> None:
    """Record each file that checkpoint verification hashes (``ue5m3.training.manifest.file_sha256``)."""
    from ue5m3.training import manifest

    hash_file = manifest.file_sha256

    def logged(path):
        with open(f"{prefix}.{rank}.jsonl", "a") as log:
            log.write(json.dumps({"rank": rank, "path": str(path)}) + "\n")
        return hash_file(path)

    manifest.file_sha256 = logged


def _native_wiring_stand_in() -> None:
    """The native build path with plain nn.Linear standing in for te.Linear (wiring only: TE never runs). The
    stand-in "conversion" marks each selected linear's weight with a custom attribute, as TE marks its parameters,
    so the test can see that the attributes survive fully_shard."""
    from ue5m3.layers import native_te
    from ue5m3.layers.linear import ConversionRecord, layer_index

    def convert(model, recipe, *, select):
        records = []
        for name, module in model.named_modules():
            if name in select:
                module.weight.stand_in_for_te = name
                records.append(
                    ConversionRecord(
                        name,
                        layer_index(name),
                        module.in_features,
                        module.out_features,
                        "converted",
                        "nvfp4",
                        "stand-in",
                    )
                )
        return tuple(records)

    native_te.require_native = lambda: None
    native_te.convert_native = convert
    native_te.recompute_contexts = lambda recipe: lambda: (contextlib.nullcontext(), contextlib.nullcontext())
    native_te.autocast = lambda recipe: contextlib.nullcontext()
    native_te.te_recipe = lambda recipe: None  # the final record's provenance: no TE recipe object stands in

    from ue5m3.training import build, parallelize

    built = build._build_native

    def checked(cfg, recipe, device, model, select):
        model, records = built(cfg, recipe, device, model, select)
        converted = [r.name for r in records if r.status == "converted"]
        report = {
            "sharded": parallelize.is_sharded(model),
            "converted": len(converted),
            "attributes_kept": all(
                getattr(model.get_submodule(name).weight, "stand_in_for_te", None) == name for name in converted
            ),
        }
        with open(os.environ["UE5M3_NATIVE_WIRING_REPORT"] + f".{dist.get_rank()}.json", "w") as out:
            json.dump(report, out)
        return model, records

    build._build_native = checked


def main() -> None:
    torch.set_num_threads(1)
    cfg = TrainConfig.from_yaml(sys.argv[1])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 or len(sys.argv) > 2:
        dist.init_process_group("gloo")
    if len(sys.argv) > 2:
        _log_collectives(sys.argv[2])
    if os.environ.get("UE5M3_NATIVE_WIRING_STAND_IN") == "1":
        _native_wiring_stand_in()
    rank = dist.get_rank() if world > 1 else 0
    if os.environ.get("UE5M3_LOG_HASHES"):
        _log_hashes(os.environ["UE5M3_LOG_HASHES"], rank)
    try:
        train.train(cfg, RandomTokenStream(4096, 64, seed=1, rank=rank, world_size=world))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
