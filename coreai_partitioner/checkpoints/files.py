"""What a safetensors checkpoint directory holds, read from its index and headers alone: which file holds each tensor,
how many elements they add up to, and whether their fp32 copy fits beside an export in this machine's memory."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

#: A model whose fp32 weights are more than this share of the machine's memory is not held whole beside its export
#: (the export's quantized program and the runtime's copy of it come on top): ``export --verify``'s fp32 reference
#: runs it a module at a time (:func:`~.lazy.read_while_running`).
WHOLE_REFERENCE_SHARE = 0.5


def checkpoint_files(checkpoint: Path) -> dict[str, Path]:
    """Every tensor key of a safetensors checkpoint directory and the file holding it (``{}``: no safetensors)."""
    checkpoint = Path(checkpoint)
    index = checkpoint / "model.safetensors.index.json"
    if index.is_file():
        return {key: checkpoint / file for key, file in json.loads(index.read_text())["weight_map"].items()}
    single = checkpoint / "model.safetensors"
    if not single.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(str(single), "pt") as file:
        return {key: single for key in file.keys()}


def stored_elements(files: dict[str, Path]) -> int:
    """The elements of every tensor in a safetensors checkpoint (:func:`checkpoint_files`'), from the files' headers."""
    from safetensors import safe_open

    count = 0
    for path in set(files.values()):
        with safe_open(str(path), "pt") as file:
            count += sum(math.prod(file.get_slice(key).get_shape()) for key in file.keys())
    return count


def memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_large_to_hold(checkpoint: Path) -> bool:
    """Whether the checkpoint's weights in fp32 are over :data:`WHOLE_REFERENCE_SHARE` of :func:`memory_bytes`."""
    return 4 * stored_elements(checkpoint_files(checkpoint)) > WHOLE_REFERENCE_SHARE * memory_bytes()
