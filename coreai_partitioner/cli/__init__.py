"""The command lines: ``python -m coreai_partitioner`` and ``coreai-export-llm``.

- :mod:`.main`: ``verify``, ``inspect``, ``export-optimum``, and ``export`` and ``export-llm`` handed to :mod:`.export`.
- :mod:`.export`: one export command for every task (the plan, loading, the export road, ``--verify``);
  :mod:`.tasks`, a module a task, supplies what is its own.  ``export-llm`` (``coreai-export-llm``,
  ``examples/export_llm.py``) is its ``text-generation`` task.
- :mod:`.detect`: which task a checkpoint is, from what each task module declares; the registry of tasks.
- :mod:`.flags`: every flag two commands or tasks share, defined once, one meaning per name.
- :mod:`.task`: what a task module supplies, its plan, and the steps several tasks take.
- :mod:`.command`: what every command does around its work: one line per warning or error, no traceback.
"""
