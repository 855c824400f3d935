"""optimum-executorch's ``ExecuTorchModelForMultiModalToText`` with the ``coreai`` recipe on Voxtral, on transformers 5.0.0rc1.

Run by ``tests/test_audio.py`` with that transformers first on ``sys.path``.
Saves a tiny random Voxtral, exports it through
``ExecuTorchModelForMultiModalToText.from_pretrained(dir, recipe="coreai",
task="multimodal-text-to-text")`` (optimum's own export, loading and
runtime), generates greedily with optimum's ``generate`` from Voxtral's
prompt over a real recording's features, and prints one JSON object with
those tokens and Hugging Face ``generate``'s over the same input.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
import transformers

import coreai_partitioner.recipes.optimum  # noqa: F401 - registers the coreai recipes
from coreai_partitioner import audio_text_to_text
from coreai_partitioner.speech_recognition.features import read_wav

from optimum.executorch import ExecuTorchModelForMultiModalToText  # noqa: E402

NEW_TOKENS = 32


def main() -> None:
    config = audio_text_to_text.tiny_config("voxtral")
    torch.manual_seed(0)
    model = transformers.VoxtralForConditionalGeneration(config).eval()
    family = audio_text_to_text.family_of(config)
    extractor, tokenizer = family.tiny_processor(config)
    audio = read_wav(Path(__file__).parent.parent / "speech" / "fox.wav")
    features = extractor(audio, sampling_rate=16000, return_tensors="pt", padding="max_length")["input_features"]
    ids = torch.tensor([family.prompt_ids(tokenizer, config, 1, "What is said?")])
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        exported = ExecuTorchModelForMultiModalToText.from_pretrained(
            directory, recipe="coreai", task="multimodal-text-to-text", max_length=512
        )
        methods = sorted(exported.model.method_names())

        class Tokenizer:  # what optimum's generate prints the tokens with
            def decode(self, tokens):
                return ""

        exported.tokenizer = Tokenizer()
        # echo=True: with echo=False optimum 1.1.0 drops len(prompt_tokens) = 1 (a [1, L] tensor's length) generated tokens
        got = exported.generate(ids, echo=True, multimodal_features=features, max_seq_len=ids.shape[1] + NEW_TOKENS)
    with torch.no_grad():
        wanted = model.generate(
            input_ids=ids, input_features=features, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
            do_sample=False, pad_token_id=0,
        )
    print(json.dumps({
        "transformers": transformers.__version__, "methods": methods, "optimum": got[ids.shape[1]:] if len(got) > NEW_TOKENS else got,
        "hf": wanted[0, ids.shape[1]:].tolist(),
    }))


if __name__ == "__main__":
    main()
