"""The tasks of ``python -m coreai_partitioner export``, a module each, by optimum's task names: each supplies only what is
its own (:class:`coreai_partitioner.cli.export.Task`), the command the rest.

- :mod:`.text_generation`: a decoder-only LLM, for ExecuTorch's ``TextLLMRunner`` (``export-llm``);
- :mod:`.image_text_to_text`: a vision-language model, for ``MultimodalRunner``;
- :mod:`.automatic_speech_recognition`: Whisper, for ExecuTorch's ASR runner.
"""
