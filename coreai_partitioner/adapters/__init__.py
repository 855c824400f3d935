"""LoRA adapters over one base program: read, checked, lowered as inputs of the shared asset, bound per adapter.

Every step but the task's own is here (the text-generation task's programs over one base:
:mod:`coreai_partitioner.text_generation.adapters`; its ``--adapter`` flag: ``cli/tasks/text_generation.py``).

1. **Read** (:mod:`.config`): a PEFT adapter directory's ``adapter_config.json``
   is checked before any export work (DoRA, ``modules_to_save``, trained biases
   and every other field plain LoRA does not have are refused by name), then
   resolved against the base model built on the meta device by PEFT itself:
   which modules it targets, each one's rank and scale (``r``, ``lora_alpha``,
   ``rank_pattern``, ``alpha_pattern``, ``use_rslora``), the shapes its
   safetensors must have.
2. **Slots** (:mod:`coreai_partitioner.text_decoder.slots`, beside the decoder whose layers they change: a
   model's walk through the export stays on the decoder's floor): each targeted ``nn.Linear`` of the base model
   becomes ``base(x) + (x Aᵀ) Bᵀ`` whose ``A`` and ``B`` are inputs of the
   exported program, their rank a dimension of its own.  The program is
   lowered once: the Core AI asset holds the base weights, never an adapter's.
3. **Bind** (:func:`.bind.bind_inputs`): each adapter's
   ``A`` and ``B·scale`` (and the base's zero rank-1 pair) become constants of
   a copy of the lowered program's graph that shares its delegates, so every
   ``.pte`` runs the same asset from the one ``.ptd``.
"""
