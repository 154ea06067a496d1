"""Evaluation of trained runs: quantized inference policies, validation NLL, the checkpoint scale snapshot, the
lm-eval model and OLMES-style downstream tasks."""
