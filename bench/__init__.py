"""vllm-graphsafe's benchmarks: ``python bench/run.py [--quick] [--out DIR]``."""
