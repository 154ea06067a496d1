"""The paper's analyses that sit on top of the library: dynamic-range analysis, FP32 accumulation statistics
(appendix C), training summaries, and the comparisons of our numbers with the paper's."""
