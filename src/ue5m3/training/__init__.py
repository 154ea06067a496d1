"""Pretraining: the run config, the build order, the training loop (one process, FSDP2 or DDP), run identity, the
resumable state, the metrics file and verified checkpoints; :mod:`ue5m3.training.loop` is the entry point."""
