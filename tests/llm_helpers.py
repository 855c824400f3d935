"""Shared by the LLM tests: tiny Hugging Face models, their greedy continuation, lowered decoders."""

from __future__ import annotations

import pytest
import torch

from coreai_partitioner import text_generation


def composites(norms: int, ropes: int, attentions: int, experts: int = 0, deltas: int = 0) -> dict[str, int]:
    """What an asset invokes: ``experts`` counts ``gather_mm`` (two per MoE layer), ``deltas`` ``gated_delta_update``."""
    return {
        "rms_norm": norms,
        "rope": ropes,
        "scaled_dot_product_attention": attentions,
        "gather_mm": experts,
        "gated_delta_update": deltas,
    }


def ci_sample(values, in_ci, *, several_names: bool = False):
    """``values`` as pytest parameters, those not in ``in_ci`` marked ``benchmark``: CI runs the sample
    (conftest.py deselects the rest), ``pytest -m benchmark`` the rest, ``pytest -m "slow or benchmark"`` all.

    ``several_names``: each value is a tuple of the values of several names (``"model_type, layers"``); else a
    tuple is one value (a fixture's ``param``)."""
    unpacked = lambda value: value if several_names else (value,)  # noqa: E731
    unknown = set(in_ci) - set(values)
    assert not unknown, f"not among the values: {sorted(unknown)}"
    return [value if value in in_ci else pytest.param(*unpacked(value), marks=pytest.mark.benchmark) for value in values]


#: model_type -> the composites its tiny config's asset invokes (``tests/test_llm_families.py`` counts them in the
#: asset, ``tests/test_transformers_rc1.py`` at the exported call sites on transformers 5.0.0rc1).
ROWS = {
    "llama": composites(5, 4, 2),
    "mistral": composites(5, 4, 2),  # every layer slides
    "ministral": composites(5, 4, 2),  # sliding and full layers
    "ministral3": composites(5, 4, 2),  # yarn, Llama 4 query scaling
    "qwen2": composites(5, 4, 2),  # the second layer slides
    "qwen3": composites(9, 4, 2),  # q and k norms
    "smollm3": composites(9, 4, 4),  # two NoPE layers: no RoPE there
    "granite": composites(5, 4, 2),
    "olmo2": composites(17, 8, 4),  # post-norms; q/k norms over the whole projection
    "olmo3": composites(17, 8, 4),  # and sliding layers
    "phi3": composites(5, 4, 2),  # fused projections, partial LongRoPE
    "gemma": composites(5, 4, 2),  # (1 + w) norms
    "gemma2": composites(17, 8, 0),  # soft-capped attention logits: plain ops
    "gemma3_text": composites(25, 8, 4),  # q/k norms, a RoPE table per layer type
    "gemma4_text": composites(46, 10, 6),  # per-layer inputs, KV sharing, k == v, proportional RoPE
    # mixtures of experts
    "qwen3_moe": composites(13, 6, 3, experts=4),  # a dense layer between two sparse ones
    "mixtral": composites(5, 4, 2, experts=4),
    "olmoe": composites(9, 4, 2, experts=4),
    "gpt_oss": composites(5, 4, 2, experts=4),  # attention sinks; sliding and full layers
    # hybrid linear attention
    "qwen3_5_text": composites(15, 4, 2, deltas=2),  # gated delta rule beside gated attention
    "qwen3_next": composites(15, 4, 2, experts=6, deltas=2),  # and experts with a shared one
    "qwen3_5_moe_text": composites(15, 4, 2, experts=8, deltas=2),
    "lfm2": composites(13, 4, 2),  # short convolutions (plain ops) beside attention
}

#: The families CI lowers and runs in the device form, one of each kind: dense, sliding windows with per-layer inputs
#: and KV sharing, experts with attention sinks, gated delta rules with experts, short convolutions.
DEVICE_IN_CI = ("llama", "gemma4_text", "gpt_oss", "qwen3_next", "lfm2")
#: The families CI lowers and runs in the host form, the device sample's complement, one of each feature: sliding
#: windows on every layer, NoPE layers, post-norms, fused projections, soft-capped logits, a RoPE table per layer type,
#: a dense layer between sparse ones, gated delta rules.  ``pytest -m benchmark`` runs the other ten, variants of
#: those rows.  Every family's adaptation runs against Hugging Face eager in CI
#: (``test_adapted_decoder_prefill_and_decode_equal_hf_eager``).
HOST_IN_CI = ("mistral", "smollm3", "olmo2", "phi3", "gemma2", "gemma3_text", "qwen3_moe", "qwen3_5_text")


def tiny(model_type: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The family's tiny random model, eager attention (HF's reference implementation), seeded.

    Parameters HF initializes to one value (norm weights: ones, or zeros for
    ``1 + w`` norms) are made random too, so a norm that scaled by ``w``
    instead of ``1 + w`` shows, and no two norms are the same function.
    """
    import transformers

    torch.manual_seed(0)
    config = text_generation.tiny_config(model_type)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.empty_like(parameter).uniform_(-0.5, 0.5))
    return model.to(dtype)


def prompt_tokens(length: int = 8, vocab: int = 256, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


#: A processor's per-token inputs beside ``input_ids``, by the value a text token appended to the prompt takes.
TEXT_TOKEN_INPUTS = {"attention_mask": 1, "token_type_ids": 0, "mm_token_type_ids": 0}


def continued(prompt, tokens: list[int]):
    """``prompt`` and then ``tokens``: a list of ids, or a processor's inputs (an image's pixels beside the ids),
    whose per-token inputs take a text token's values for them."""
    if isinstance(prompt, list):
        return prompt + tokens
    extended = dict(prompt)
    for name, value in TEXT_TOKEN_INPUTS.items():
        if name in prompt:
            extended[name] = torch.cat([prompt[name], torch.full((1, len(tokens)), value, dtype=prompt[name].dtype)], 1)
    extended["input_ids"] = torch.cat([prompt["input_ids"], torch.tensor([tokens], dtype=prompt["input_ids"].dtype)], 1)
    return extended


def hf_greedy(model, prompt, new_tokens: int, eos: int | None = None) -> tuple[list[int], list[float], list[int]]:
    """Hugging Face ``generate``'s greedy new tokens, at each step the margin of its top two logits, and the second.

    ``prompt`` is a list of ids or a processor's inputs (a vision-language
    model's).  It stops at ``eos``, by default the model's own as ``generate`` does.
    """
    import copy

    config = copy.deepcopy(model.generation_config)
    if eos is not None:
        config.eos_token_id = eos
    config.pad_token_id = 0
    config.do_sample, config.max_new_tokens = False, new_tokens
    config.output_scores, config.return_dict_in_generate = True, True
    inputs = {"input_ids": torch.tensor([prompt])} if isinstance(prompt, list) else dict(prompt)
    with torch.no_grad():
        out = model.generate(**inputs, generation_config=config)
    tokens = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    margins, seconds = [], []
    for scores, chosen in zip(out.scores, tokens):
        others = scores[0].float().clone()
        others[chosen] = -torch.inf  # the best other token, whichever way a tie was ordered
        seconds.append(int(others.argmax()))
        margins.append(float(scores[0, chosen].float() - others[seconds[-1]]))
    return tokens, margins, seconds


#: Logit margins below which two tokens tie: what each dtype's rounding can move two logits of these models by
#: (fp32 about 1e-7 of a logit here; fp16 resolves about 1e-3 at the logits' scale).
TIES = {torch.float32: 1e-5, torch.float16: 2e-3}


def assert_hf_greedy(got: list[int], model, prompt, new_tokens: int, eos: int | None = None, tie: float | None = None) -> None:
    """``got`` (new tokens) is HF's greedy continuation of ``prompt`` (ids, or a processor's inputs), stopping at
    ``eos`` as ``generate`` does.

    A token may differ only where HF's top two logits tie (fp16 ties are real
    in a random tiny model: either side may pick either token), and then it
    must be HF's second token there; the rest must be HF's greedy
    continuation of the tokens ``got`` took, compared the same way.
    """
    tie = TIES[model.dtype] if tie is None else tie
    wanted, margins, seconds = hf_greedy(model, prompt, new_tokens, eos)
    for step, (expected, margin, second) in enumerate(zip(wanted, margins, seconds)):
        if step == len(got):
            raise AssertionError(f"stopped after {got}; HF goes on: {wanted}")
        if got[step] != expected:
            assert margin < tie and got[step] == second, (
                f"step {step}: {got} != HF {wanted} (HF's top two {expected}, {second} are {margin:.3g} apart; "
                f"a tie is below {tie:g})"
            )
            taken = step + 1
            if taken < new_tokens and (eos is None or got[step] != eos) and got[step] not in _eos_ids(model, eos):
                assert_hf_greedy(got[taken:], model, continued(prompt, got[:taken]), new_tokens - taken, eos, tie)
            else:
                assert len(got) == taken, f"{got} goes on past its end at step {step}"
            return
    assert len(got) == len(wanted), f"{got} goes on past HF's {wanted}"


def _eos_ids(model, eos: int | None) -> set[int]:
    """The ids ``generate`` stops at: ``eos``, or the model's own."""
    if eos is not None:
        return {eos}
    ids = model.generation_config.eos_token_id
    return set() if ids is None else {ids} if isinstance(ids, int) else set(ids)


# ---------------------------------------------------------------- broken twins


#: What a wrong conversion might compute instead of the model, by name: each makes a twin of a Hugging Face model
#: or of the eager program a quantized export hands back (``lower_decoder(..., quantized_reference=)``), the same
#: change to either.  ``tests/test_fidelity.py``, ``test_quantized_schemes.py`` and the real-model tests judge a
#: right ``.pte`` against each twin's logits: ``text_generation.check`` must fail it.
TWINS = ("a perturbed weight", "the first two layers swapped", "SiLU converted as ReLU")

#: Twins that convert every SiLU as another activation: its module, its op, its name in a config.  GELU is subtler
#: than ReLU (benchmarks/results/verify_twins.txt shows where the tolerance can tell it).
ACTIVATIONS = {
    "SiLU converted as ReLU": (torch.nn.ReLU, torch.ops.aten.relu.default, "relu"),
    "SiLU converted as GELU": (torch.nn.GELU, torch.ops.aten.gelu.default, "gelu"),
}


def perturb_channels(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` with each output channel (row) scaled in place by a seeded factor in [0, 2]: a perturbed weight."""
    factor = 2 * torch.rand(weight.shape[0], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return weight.mul_(factor.to(weight.dtype).reshape(-1, *[1] * (weight.dim() - 1)))


def broken_twin(model: torch.nn.Module, twin: str, swap: tuple[int, int] = (0, 1)) -> torch.nn.Module:
    """A copy of ``model`` changed as ``twin`` (one of :data:`TWINS` or :data:`ACTIVATIONS`, or ``"layers swapped"``
    with ``swap``).

    - a perturbed weight: each output channel of the last layer's MLP down
      projection scaled by a seeded factor in [0, 2] (in a quantized
      program, its per-channel scales);
    - layers swapped: every weight of one layer in the other's place;
    - SiLU converted as ReLU (or GELU): every SiLU of the model computes ReLU (GELU).
    """
    import copy
    import re

    twin_model = copy.deepcopy(model)
    state = twin_model.state_dict()
    layer = re.compile(r"(?<![A-Za-z0-9])layers[._](\d+)[._]")
    if twin == "a perturbed weight":
        last = max(int(m.group(1)) for key in state for m in [layer.search(key)] if m)
        down = [k for k in state if re.search(rf"layers[._]{last}[._]mlp[._]down(_proj)?[._]weight([._]scale)?$", k)]
        perturb_channels(state[next((k for k in down if k.endswith("scale")), down[0])])
    elif "swapped" in twin:
        first, second = swap
        other = {str(first): str(second), str(second): str(first)}
        renamed = {layer.sub(lambda m: m.group(0).replace(m.group(1), other.get(m.group(1), m.group(1))), k, count=1): v
                   for k, v in state.items()}
        twin_model.load_state_dict({k: renamed[k] for k in state}, strict=True)
    elif twin in ACTIVATIONS:
        module_type, op, name = ACTIVATIONS[twin]
        if isinstance(twin_model, torch.fx.GraphModule):
            found = [n for n in twin_model.graph.nodes if n.target is torch.ops.aten.silu.default]
            for node in found:
                node.target = op
            twin_model.recompile()
        else:
            found = [m for m in twin_model.modules() if type(getattr(m, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")]
            for module in found:
                module.act_fn = module_type()
            twin_model.config.get_text_config().hidden_act = name  # what text_generation.adapt reads, to export the twin
        assert found, f"{type(model).__name__} computes no SiLU"
    else:
        raise ValueError(f"no broken twin {twin!r}: {TWINS}")
    return twin_model


def adapted_and_eager(model_type: str, shapes, prompt: int, steps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position's logits of the family's adapted decoder (a prefill of ``prompt`` tokens, then ``steps``
    single-token calls, after a prefill of other tokens) and of Hugging Face eager over the same tokens."""
    model = tiny(model_type)
    tokens = prompt_tokens(prompt + steps)
    decoder = text_generation.adapt(model, shapes, full_logits=True)
    with torch.no_grad():
        expected = model(tokens).logits
        decoder(prompt_tokens(prompt, seed=2), torch.arange(prompt))  # another prompt first: position 0 starts over
        got = [decoder(tokens[:, :prompt], torch.arange(prompt))]
        got += [decoder(tokens[:, t : t + 1], torch.tensor([t])) for t in range(prompt, prompt + steps)]
    return torch.cat(got, 1), expected
