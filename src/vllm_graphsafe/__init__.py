"""vllm-graphsafe: phase-safe CUDA graph dispatch for the vLLM releases people run.

Importing this package imports no vLLM; the patches bind lazily.
"""

__version__ = "0.1.0"
