"""Export a Hugging Face decoder-only LLM to a .pte for ExecuTorch's LLM runner, with Core AI composites.

    python examples/export_llm.py --config qwen3 --verify --generate "Hello"
    python examples/export_llm.py --checkpoint path/to/checkpoint --dtype fp16 --verify --out out/model.pte
    python examples/export_llm.py --checkpoint path/to/checkpoint --chat "What is the capital of France?"

The package's own command, ``python -m coreai_partitioner export-llm`` (or
``coreai-export-llm``), with the same options: the ``text-generation`` task of
:mod:`coreai_partitioner.cli.export`.
"""

import os
import sys

if "-v" in sys.argv or "--verbose" in sys.argv:
    os.environ["COREAI_PARTITIONER_VERBOSE"] = "1"  # before coreai_partitioner imports its dependencies

from coreai_partitioner import console

console.quiet_dependencies()  # a command line's own run: before the dependencies are imported, as they log then

from coreai_partitioner.cli.export import export_llm  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(export_llm())
