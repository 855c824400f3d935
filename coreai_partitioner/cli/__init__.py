"""The command lines: ``python -m coreai_partitioner`` and ``coreai-export-llm``.

- :mod:`.main`: ``verify``, ``inspect``, ``export-optimum``, and ``export-llm`` handed to :mod:`.export_llm`.
- :mod:`.export_llm`: the LLM exporter (``examples/export_llm.py`` is a thin wrapper over it).
"""
