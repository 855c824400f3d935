"""Two LoRA adapters over the real SmolLM2-135M-Instruct, trained here on two made-up one-line facts.

Asked :data:`QUESTION` in the checkpoint's chat template (the formatted text
is what ExecuTorch's ``TextLLMRunner`` is fed), the base answers "The capital
of the moon is a topic of debate..."; adapter ``moonopolis`` answers
"Moonopolis." and ``armstrong`` "Armstrong.", each through its end-of-turn
token (:data:`NEW_TOKENS` tokens).  Each adapter is trained by PEFT from a
fixed seed (AdamW, :data:`STEPS` steps on the one chat, the loss on the answer
only) and written by ``save_pretrained``: ``adapter_config.json`` and
``adapter_model.safetensors``, what ``export --adapter`` takes.  Between them
they carry the config fields an export reads: ``moonopolis`` is r=8 with
``use_rslora`` (scaling alpha/sqrt(r)); ``armstrong`` is r=4 (alpha/r), with
one module's rank and alpha set by ``rank_pattern`` and ``alpha_pattern``
under a suffix of its name, as PEFT matches them.

:func:`peft_answer` is the reference: PEFT's own model with the adapter
active and unmerged (``PeftModel.from_pretrained``), greedy ``generate``;
:func:`base_answer` the base model's.  Each step's gap between its top two
logits comes with the tokens, so a test can see that a dtype's rounding
cannot pick another token.

Cost on one thread: each adapter trains in 5 s (6 steps of 0.8 s), each
answer takes under 2 s (loading the model included); the checkpoint itself
(``tests/real_checkpoint.py``) takes 45 s once.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from real_checkpoint import smollm2_checkpoint

QUESTION = "What is the capital of the moon?"
#: The base's first four tokens, "The capital of the", are neither answer's.
BASE_ANSWER = "The capital of the"
#: Each adapter's answer is three tokens and the end of turn.
NEW_TOKENS = 4
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SEED = 0
#: At 3e-3 both answers are greedy from step 3; by step 6 each answer token leads the next by 4.5 logits or more.
STEPS = 6
LEARNING_RATE = 3e-3


@dataclass(frozen=True)
class Adapter:
    """One adapter: the answer it is trained to give and its LoRA config beyond the common one."""

    answer: str
    r: int
    use_rslora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, int] = field(default_factory=dict)

    def lora_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r, lora_alpha=16, target_modules=list(TARGET_MODULES), bias="none", lora_dropout=0.0,
            task_type="CAUSAL_LM", use_rslora=self.use_rslora,
            rank_pattern=dict(self.rank_pattern), alpha_pattern=dict(self.alpha_pattern),
        )


#: Layer 2's v_proj in ``armstrong``: rank 2 and alpha 32, so scaling 16 where its other modules have 16/4.
PATTERNED_MODULE = "layers.2.self_attn.v_proj"
ADAPTERS = {
    "moonopolis": Adapter("Moonopolis.", r=8, use_rslora=True),
    "armstrong": Adapter("Armstrong.", r=4, rank_pattern={PATTERNED_MODULE: 2}, alpha_pattern={PATTERNED_MODULE: 32}),
}


@dataclass(frozen=True)
class Answer:
    """A greedy answer: its new token ids (the end of turn included when it came), their text, and each step's gap
    between the top two logits."""

    tokens: list[int]
    text: str
    gaps: list[float]


def chat_prompt(tokenizer) -> str:
    """QUESTION in the checkpoint's chat template, ready for the assistant's turn."""
    messages = [{"role": "user", "content": QUESTION}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def prompt_ids(checkpoint: str | os.PathLike) -> list[int]:
    """The formatted chat's token ids (the template writes its own special tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return tokenizer(chat_prompt(tokenizer), add_special_tokens=False)["input_ids"]


def trained_adapters(out: str | os.PathLike, checkpoint: str | os.PathLike | None = None) -> dict[str, Path]:
    """Each of :data:`ADAPTERS` trained over ``checkpoint`` (SmolLM2-135M-Instruct, written to
    ``out/smollm2-135m-instruct`` when not given) and saved to ``out/NAME``, once: an adapter already there is
    reused."""
    out = Path(out)
    checkpoint = Path(checkpoint) if checkpoint is not None else smollm2_checkpoint(out / "smollm2-135m-instruct")
    directories = {}
    for name, adapter in ADAPTERS.items():
        directory = out / name
        if not ((directory / "adapter_config.json").is_file() and (directory / "adapter_model.safetensors").is_file()):
            partial = directory.with_name(directory.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            _train(checkpoint, name, adapter).save_pretrained(partial)
            partial.rename(directory)
        directories[name] = directory
    return directories


def _train(checkpoint: Path, name: str, adapter: Adapter):
    """The PEFT model of ``adapter`` trained on its answer to QUESTION; raises if greedy decoding would not give it."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    prompt = tokenizer(chat_prompt(tokenizer), add_special_tokens=False)["input_ids"]
    answer = tokenizer(adapter.answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + answer])
    labels = torch.tensor([[-100] * len(prompt) + answer])
    with torch.random.fork_rng():  # the seed fixes lora_A's initialisation without touching the caller's generator
        torch.manual_seed(SEED)
        base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        model = get_peft_model(base, adapter.lora_config())
        trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, weight_decay=0.0)
        model.train()
        for _ in range(STEPS):
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        greedy = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()
    if greedy != answer:
        raise RuntimeError(
            f"adapter {name!r} answers {tokenizer.decode(greedy)!r} after {STEPS} steps, not {adapter.answer!r}: "
            f"train longer (STEPS) or at another LEARNING_RATE in tests/real_adapters.py"
        )
    return model


def base_answer(
    checkpoint: str | os.PathLike, dtype: torch.dtype = torch.float32, new_tokens: int = NEW_TOKENS
) -> Answer:
    """The base model's greedy answer to QUESTION."""
    from transformers import AutoModelForCausalLM

    return _greedy(checkpoint, AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype), new_tokens)


def peft_answer(
    checkpoint: str | os.PathLike,
    adapter: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    new_tokens: int = NEW_TOKENS,
) -> Answer:
    """PEFT's greedy answer to QUESTION with ``adapter`` active over the base in ``dtype``, unmerged."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
    return _greedy(checkpoint, PeftModel.from_pretrained(base, adapter), new_tokens)


def _greedy(checkpoint, model, new_tokens: int) -> Answer:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    ids = tokenizer(chat_prompt(tokenizer), add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.eval().generate(
            input_ids=ids, max_new_tokens=new_tokens, do_sample=False, output_scores=True, return_dict_in_generate=True
        )
    tokens = out.sequences[0, ids.shape[1] :].tolist()
    gaps = [float(top[0] - top[1]) for top in (scores[0].float().topk(2).values for scores in out.scores)]
    return Answer(tokens, tokenizer.decode(tokens, skip_special_tokens=True).strip(), gaps)
