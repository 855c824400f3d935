"""A real trained model, quantized, still answers factual chat prompts through ExecuTorch's TextLLMRunner.

SmolLM2-135M-Instruct (the ``real_checkpoint`` fixture), fp32 activations
(coreai-core's Linux fp16 is software), exported once per scheme in the host
form (``llm.lower_decoder``: the runner prefills the whole prompt in one
call).  Each question goes through the checkpoint's chat template to
``llm.runner.generate``, ExecuTorch's own ``TextLLMRunner`` over the
``.pte`` and the checkpoint's ``tokenizer.json``; its answer must name what
the fp32 Hugging Face model's greedy answer names.
"""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("coreai_opt")

from coreai_partitioner import llm, save_pte  # noqa: E402
from coreai_partitioner.llm import runner  # noqa: E402

pytestmark = pytest.mark.slow

#: question -> the word its answer must hold (the fp32 model's answer holds it too: checked first).
QUESTIONS = {
    "What is the capital of Japan?": "Tokyo",
    "What is the capital of France?": "Paris",
    "What is the chemical symbol for gold?": "Au",
}
NEW_TOKENS = 10
SHAPES = llm.DecoderShapes(max_context_len=96, prefill_chunk=64)


@pytest.fixture(scope="module")
def chat(real_checkpoint):
    """Each question in the checkpoint's chat template, after checking the fp32 model's answer names its word."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(real_checkpoint, dtype=torch.float32).eval()
    prompts = {}
    for question, word in QUESTIONS.items():
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            answer = tokenizer.decode(model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0, ids.shape[1] :])
        assert word in answer, (question, answer)
        prompts[question] = text
    return prompts


#: The issue's two schemes.  Neither keeps every answer of this 135M model yet (benchmarks/results/quality.txt:
#: perplexity 32.5 and 205 against 21.2 in fp32): int4-channel answers "Hg2+" for gold, palettize4 (4-bit tables per
#: 32 output channels, with no per-channel scale, and a 4-bit embedding that is also the lm_head) answers nothing.
#: Strict: once a scheme keeps them, its mark must go.
SCHEMES = [
    pytest.param("int4-channel", marks=pytest.mark.xfail(strict=True, reason="int4-channel loses the gold answer")),
    pytest.param("palettize4", marks=pytest.mark.xfail(strict=True, reason="palettize4 loses every answer")),
]


@pytest.fixture(scope="module", params=SCHEMES)
def quantized_pte(request, real_checkpoint, tmp_path_factory):
    """The real model's ``.pte`` under one scheme, its tokenizer beside it."""
    from transformers import AutoModelForCausalLM

    directory = tmp_path_factory.mktemp(request.param)
    model = AutoModelForCausalLM.from_pretrained(real_checkpoint, dtype=torch.float32).eval()
    path = save_pte(llm.lower_decoder(model, SHAPES, quantize=request.param), directory / "model.pte")
    shutil.copy(real_checkpoint / "tokenizer.json", directory / "tokenizer.json")
    return request.param, path


def test_a_quantized_real_model_keeps_its_factual_answers_through_text_llm_runner(quantized_pte, chat):
    scheme, path = quantized_pte
    answers = {
        question: runner.generate(path, path.parent / "tokenizer.json", chat[question], max_new_tokens=NEW_TOKENS).text
        for question in QUESTIONS
    }
    lost = {question: answer for question, answer in answers.items() if QUESTIONS[question] not in answer}
    assert not lost, f"{scheme} lost {len(lost)} of {len(QUESTIONS)} answers: {lost}"
