"""The encoder primitives (``blocks/encoder.py``) compute what Hugging Face's encoder layers compute."""

from __future__ import annotations

import torch
from requires import require

require("transformers", "hf")

from transformers import SiglipVisionConfig, WhisperConfig  # noqa: E402
from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer  # noqa: E402
from transformers.models.whisper.modeling_whisper import WhisperEncoderLayer  # noqa: E402

from coreai_partitioner.blocks import MLP, EncoderAttention, EncoderLayer  # noqa: E402


def _randomized(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0, 0.2)
    return module.eval()


def test_an_encoder_layer_over_siglips_own_modules_matches_its_forward():
    config = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, hidden_act="gelu_pytorch_tanh")
    config._attn_implementation = "eager"
    hf = _randomized(SiglipEncoderLayer(config))
    a = hf.self_attn
    layer = EncoderLayer(
        EncoderAttention("layer", 4, 8, q=a.q_proj, k=a.k_proj, v=a.v_proj, o=a.out_proj, scale=a.scale),
        MLP(config.hidden_act, fc1=hf.mlp.fc1, fc2=hf.mlp.fc2),
        norm1=hf.layer_norm1,
        norm2=hf.layer_norm2,
    )
    x = torch.randn(1, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), hf(x, attention_mask=None), rtol=1e-5, atol=1e-5)


def test_an_encoder_layer_over_whispers_own_modules_matches_its_forward():
    config = WhisperConfig(d_model=32, encoder_attention_heads=4, encoder_ffn_dim=64, activation_function="gelu")
    config._attn_implementation = "eager"
    hf = _randomized(WhisperEncoderLayer(config))
    a = hf.self_attn
    layer = EncoderLayer(
        EncoderAttention("layer", 4, 8, q=a.q_proj, k=a.k_proj, v=a.v_proj, o=a.out_proj, scale=a.scaling),
        MLP(config.activation_function, fc1=hf.fc1, fc2=hf.fc2),
        norm1=hf.self_attn_layer_norm,
        norm2=hf.final_layer_norm,
    )
    x = torch.randn(1, 10, 32)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), hf(x, attention_mask=None), rtol=1e-5, atol=1e-5)
