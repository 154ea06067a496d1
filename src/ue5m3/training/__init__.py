"""Pretraining: the run config, the training loop (one process or FSDP2) and verified checkpoints."""
