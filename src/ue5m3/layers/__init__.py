"""FP4 layers: recipes (what each GEMM operand is quantized to), the emulated FP4 linear and its audited
conversion, and the native Transformer Engine path for Blackwell."""
