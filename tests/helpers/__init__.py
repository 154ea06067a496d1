"""Helpers shared by the test modules, which import them from here and never from one another (tests/conftest.py
holds the shared fixtures; tests/test_test_suite.py checks both rules). pytest puts tests/ on ``sys.path`` (tests/ is
a rootdir without ``__init__.py``), so the package imports as ``helpers``.

* ``backends``: whether the native Transformer Engine path runs here;
* ``benchmark_scripts``: a script of benchmarks/ loaded as a module;
* ``bits``: bit-for-bit comparisons (float32 data, tensors, quantization results);
* ``data``: the OLMo-mix fixture records, a DataConfig over them and a byte tokenizer double;
* ``distributed``: the multi-process training command lines; ``distributed_worker.py`` is the script they run;
* ``files``: the SHA-256 of every file under a folder;
* ``format_oracles``: the numerics spec's format table and exact rounding references;
* ``identify``: the small emulator identification probe corpus;
* ``inference``: the tiny trained run of the evaluation tests (the ``tiny_run`` fixtures);
* ``lm_eval_tools``: lm-eval doubles (tokenizer, inference wrapper), a tiny task and lm-eval's CLI;
* ``olmes``: the OLMES task-data skip mark, built task docs, a local MMLU-Pro copy;
* ``ports``: a free TCP port;
* ``rational``: exact rational FP32 rounding and lattice snapping;
* ``recipes``: packaged recipes resolved for the 8B and the debug models;
* ``threads``: torch's thread count set for a block;
* ``tiny_dag``: the whole DAG on the tiny `.test/` config, in ``.test/dag/`` (shared with the system tests);
* ``training``: the training tests' run config and token stream, and readers of a run's checkpoints and metrics.
"""
