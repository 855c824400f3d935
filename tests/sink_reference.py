"""An eager StreamingLLM reference over a Hugging Face Llama's own modules: attention sinks the literal way.

A token at a time: each layer keeps the *unrotated* keys and the values of
the first ``sinks`` positions and of the last ``size - sinks`` (the current
one included), and every step rotates the kept keys at their positions
within the cache (``0, 1, ...`` in the order of their positions) and the
query at the last of them (Xiao et al., 2023, section 3.2).  It shares no
code with :mod:`coreai_partitioner.blocks.sinks`, which keeps the keys rotated
at their true positions and turns only the sinks.
"""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv


def sink_logits(model, tokens: list[int], sinks: int, size: int) -> torch.Tensor:
    """``[len(tokens), vocab]``: the logits at every step of ``model`` (a ``LlamaForCausalLM``) fed ``tokens`` one a
    call under a cache of ``sinks`` sink tokens and a ring of ``size - sinks`` recent ones."""
    base, config = model.model, model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    caches = [[] for _ in base.layers]  # per layer: (position, unrotated key [1, kv, 1, D], value [1, kv, 1, D])
    rows = []
    with torch.no_grad():
        for position, token in enumerate(tokens):
            hidden = base.embed_tokens(torch.tensor([[token]]))
            for layer, cache in zip(base.layers, caches):
                attn = layer.self_attn
                x = layer.input_layernorm(hidden)
                q = attn.q_proj(x).view(1, 1, -1, head_dim).transpose(1, 2)
                k = attn.k_proj(x).view(1, 1, -1, head_dim).transpose(1, 2)
                v = attn.v_proj(x).view(1, 1, -1, head_dim).transpose(1, 2)
                cache.append((position, k, v))
                cache[:] = [e for e in cache if e[0] < sinks or e[0] > position - (size - sinks)]
                within = torch.arange(len(cache))[None]  # positions within the cache
                cos, sin = base.rotary_emb(x, within)
                keys = torch.cat([e[1] for e in cache], dim=2)
                values = torch.cat([e[2] for e in cache], dim=2)
                _, keys = apply_rotary_pos_emb(keys, keys, cos, sin)
                query, _ = apply_rotary_pos_emb(q, q, cos[:, -1:], sin[:, -1:])
                groups = config.num_attention_heads // config.num_key_value_heads
                keys, values = repeat_kv(keys, groups), repeat_kv(values, groups)
                weights = torch.softmax((query @ keys.transpose(2, 3)) * attn.scaling, dim=-1)
                out = (weights @ values).transpose(1, 2).reshape(1, 1, -1)
                hidden = hidden + attn.o_proj(out)
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            rows.append(model.lm_head(base.norm(hidden))[0, 0])
    return torch.stack(rows)
