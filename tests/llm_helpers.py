"""Shared by the LLM tests: tiny Hugging Face models, their greedy continuation, lowered decoders."""

from __future__ import annotations

import torch

from coreai_partitioner import llm


def tiny(model_type: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The family's tiny random model, eager attention (HF's reference implementation), seeded.

    Parameters HF initializes to one value (norm weights: ones, or zeros for
    ``1 + w`` norms) are made random too, so a norm that scaled by ``w``
    instead of ``1 + w`` shows, and no two norms are the same function.
    """
    import transformers

    torch.manual_seed(0)
    config = llm.tiny_config(model_type)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.empty_like(parameter).uniform_(-0.5, 0.5))
    return model.to(dtype)


def prompt_tokens(length: int = 8, vocab: int = 256, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def hf_greedy(model, prompt: list[int], new_tokens: int, eos: int | None = None) -> tuple[list[int], list[float]]:
    """Hugging Face ``generate``'s greedy new tokens, and at each step the margin of its top two logits.

    It stops at ``eos``, by default the model's own as ``generate`` does.
    """
    import copy

    config = copy.deepcopy(model.generation_config)
    if eos is not None:
        config.eos_token_id = eos
    config.pad_token_id = 0
    config.do_sample, config.max_new_tokens = False, new_tokens
    config.output_scores, config.return_dict_in_generate = True, True
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    top2 = [scores[0].float().topk(2).values for scores in out.scores]
    return out.sequences[0, len(prompt) :].tolist(), [float(a - b) for a, b in top2]


#: Logit margins below which two tokens tie: fp16 resolves about 1e-3 at the logits' scale.
TIES = {torch.float32: 1e-5, torch.float16: 2e-3}


def assert_hf_greedy(got: list[int], model, prompt: list[int], new_tokens: int, eos: int | None = None) -> None:
    """``got`` (new tokens) is HF's greedy continuation of ``prompt``, stopping at ``eos`` as ``generate`` does.

    A token may differ only where HF's top two logits tie (fp16 ties are real
    in a random tiny model: either side may pick either token); the sequences
    owe each other nothing after that.
    """
    wanted, margins = hf_greedy(model, prompt, new_tokens, eos)
    for step, (expected, margin) in enumerate(zip(wanted, margins)):
        if step == len(got):
            raise AssertionError(f"stopped after {got}; HF goes on: {wanted}")
        if got[step] != expected:
            assert margin < TIES[model.dtype], f"step {step}: {got} != HF {wanted} (HF's top-two margin {margin:.3g})"
            return
    assert len(got) == len(wanted), f"{got} goes on past HF's {wanted}"


def adapted_and_eager(model_type: str, shapes, prompt: int, steps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position's logits of the family's adapted decoder (a prefill of ``prompt`` tokens, then ``steps``
    single-token calls, after a prefill of other tokens) and of Hugging Face eager over the same tokens."""
    model = tiny(model_type)
    tokens = prompt_tokens(prompt + steps)
    decoder = llm.adapt(model, shapes, full_logits=True)
    with torch.no_grad():
        expected = model(tokens).logits
        decoder(prompt_tokens(prompt, seed=2), torch.arange(prompt))  # another prompt first: position 0 starts over
        got = [decoder(tokens[:, :prompt], torch.arange(prompt))]
        got += [decoder(tokens[:, t : t + 1], torch.tensor([t])) for t in range(prompt, prompt + steps)]
    return torch.cat(got, 1), expected
