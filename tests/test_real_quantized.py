"""A real trained model, quantized, still answers factual chat prompts through ExecuTorch's TextLLMRunner.

SmolLM2-135M-Instruct (the ``real_checkpoint`` fixture), fp32 activations
(coreai-core's Linux fp16 is software), exported once per scheme in the host
form (``llm.lower_decoder``: the runner prefills the whole prompt in one
call).  Each question goes through the checkpoint's chat template to
``llm.runner.Runner``, ExecuTorch's own ``TextLLMRunner`` over the
``.pte`` and the checkpoint's ``tokenizer.json`` (loaded once per scheme,
each question from an empty cache); its answer must name what the fp32
Hugging Face model's greedy answer names.
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
NEW_TOKENS = 7  # fp32 names each word by its 7th token (Tokyo and Paris 6th, Au 7th)
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


SCHEMES = ("int4-channel", "palettize4")
#: What a scheme is known to lose on this 135M model (a Q4_1 checkpoint: its weights are on a 4-bit grid in blocks
#: of 32 input channels, which int4 per output channel cannot follow): int4-channel answers "Hg2+" for gold.
#: Strict: once the scheme keeps it, the mark must go.
LOST = {("int4-channel", "What is the chemical symbol for gold?"): 'int4-channel answers "Hg2+"'}


_runners: dict[str, runner.Runner] = {}


@pytest.fixture
def quantized(real_checkpoint, tmp_path_factory):
    """The real model's ``.pte`` under a scheme, loaded in ExecuTorch's TextLLMRunner once per scheme."""
    from transformers import AutoModelForCausalLM

    def load(scheme: str) -> runner.Runner:
        if scheme not in _runners:
            _runners.clear()  # one scheme's program in memory at a time
            directory = tmp_path_factory.mktemp(scheme)
            model = AutoModelForCausalLM.from_pretrained(real_checkpoint, dtype=torch.float32).eval()
            path = save_pte(llm.lower_decoder(model, SHAPES, quantize=scheme), directory / "model.pte")
            shutil.copy(real_checkpoint / "tokenizer.json", directory / "tokenizer.json")
            _runners[scheme] = runner.Runner(path, directory / "tokenizer.json")
        return _runners[scheme]

    return load


@pytest.mark.parametrize(
    "scheme, question",
    [
        pytest.param(s, q, marks=[pytest.mark.xfail(strict=True, reason=LOST[s, q])] if (s, q) in LOST else [])
        for s in SCHEMES
        for q in QUESTIONS
    ],
)
def test_a_quantized_real_model_keeps_its_factual_answer_through_text_llm_runner(scheme, question, quantized, chat):
    answer = quantized(scheme).generate(chat[question], max_new_tokens=NEW_TOKENS).text  # from an empty cache
    assert QUESTIONS[question] in answer, f"{scheme}: {question} -> {answer!r}"
