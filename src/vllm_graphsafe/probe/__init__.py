"""Check a running vLLM server for graph-dispatch corruption, over HTTP.

With K speculative tokens, a prompt chunk of exactly K+1 tokens has the shape of
a uniform spec-decode batch and can be replayed through the FULL decode CUDA
graph although it is prefill. Hybrid and recurrent models then answer with
garbage. The probe sends prompts whose (chunk) length lands on K+1, or on a block
or chunk boundary plus K+1, next to control prompts one token shorter and longer,
and judges the answers with small pure checks (``checks``).

Modules, each one concept: ``settings`` (what to probe, checked before any
request; the server's statistics), ``plan`` (which lengths), ``client`` (HTTP
through httpx), ``session`` (the requests, in order), ``overlap`` (how the
inserted prompts met the long decode), ``checks``, ``redaction`` (the API key
out of everything returned), ``run`` (the entry point; the JSON report's data).
Nothing here prints: the command line (:mod:`vllm_graphsafe.cli.probe`) shows
the result and writes the report. Nothing here imports vLLM; httpx and tqdm
are imported only once a probe runs.

Usage::

    from vllm_graphsafe.probe import ProbeSettings, run_probe

    result = run_probe(ProbeSettings(base_url="http://127.0.0.1:8000"))
    print(result.exit_code, [check.status for check in result.checks])
"""

from vllm_graphsafe.probe.run import ProbeResult, run_probe
from vllm_graphsafe.probe.settings import ProbeSettings

__all__ = ["ProbeResult", "ProbeSettings", "run_probe"]
