"""Check a running vLLM server for graph-dispatch corruption, over HTTP.

With K speculative tokens, a prompt chunk of exactly K+1 tokens has the shape of
a uniform spec-decode batch and can be replayed through the FULL decode CUDA
graph although it is prefill; hybrid and recurrent models then answer with
garbage. The probe sends prompts whose (chunk) length lands on K+1, or on a block
or chunk boundary plus K+1, next to controls one token shorter and longer.
Nothing here prints or imports vLLM; httpx and tqdm are imported only once a
probe runs.
"""

from vllm_graphsafe.probe.run import ProbeResult, run_probe
from vllm_graphsafe.probe.settings import ProbeSettings

__all__ = ["ProbeResult", "ProbeSettings", "run_probe"]
