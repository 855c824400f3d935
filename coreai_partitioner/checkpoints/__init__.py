"""Reading checkpoints lazily: which safetensors file holds each tensor (:mod:`.files`), and a model whose weights stay
in the memory-mapped files until something reads one, a tensor or a few rows at a time (:mod:`.lazy`).  Nothing here
quantizes: ``quantize/`` reads each weight it compresses through it, and ``export --verify``'s fp32 reference of a
checkpoint larger than memory runs a module at a time through it."""

from coreai_partitioner.checkpoints.files import checkpoint_files, too_large_to_hold
from coreai_partitioner.checkpoints.lazy import (
    Place,
    is_streamed,
    load_lazily,
    materialize,
    materialize_program,
    place_of,
    read_while_running,
    row_reader,
    stream_weights,
)

__all__ = [
    "Place", "checkpoint_files", "is_streamed", "load_lazily", "materialize", "materialize_program", "place_of",
    "read_while_running", "row_reader", "stream_weights", "too_large_to_hold",
]
