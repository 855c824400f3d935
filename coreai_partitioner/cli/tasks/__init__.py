"""The tasks of ``python -m coreai_partitioner export``, a module each, by optimum's task names: each supplies only what is
its own (:class:`coreai_partitioner.cli.task.Task`) and how it is detected (``DETECT``), the command the rest.

- :mod:`.text_generation`: a decoder-only LLM, for ExecuTorch's ``TextLLMRunner`` (``export-llm``);
- :mod:`.image_text_to_text`: a vision-language model, for ``MultimodalRunner``;
- :mod:`.audio_text_to_text`: an audio-language model (Voxtral), for ``MultimodalRunner``;
- :mod:`.automatic_speech_recognition`: Whisper, for ExecuTorch's ASR runner;
- :mod:`.text_to_speech`: a text-to-speech family (VITS / MMS-TTS, Kokoro-82M: ``text_to_speech/families/``) as
  ``durations`` and ``decoder``, run by ``generate-speech``;
- :mod:`.text_to_image`: a Stable Diffusion pipeline (1.x/2.x, 3) as text encoder, denoiser and VAE decoder, run by
  ``generate-image``;
- :mod:`.text2text_generation`: T5 and Flan-T5, in the speech task's methods, for optimum's ``ExecuTorchModelForSeq2SeqLM``;
- :mod:`.fill_mask`, :mod:`.feature_extraction`: a BERT-class encoder's logits or sentence embeddings, one
  ``forward`` (the steps both share: :mod:`coreai_partitioner.cli.text_encoders`);
- :mod:`.image_classification`: a ViT, DeiT or any image classifier's logits, one ``forward``.
"""
