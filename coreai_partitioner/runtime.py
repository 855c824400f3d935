"""Run Core AI assets on this machine's Core AI runtime (Linux CPU included).

coreai-core's runtime is asynchronous; this module gives it a synchronous
face by running one event loop on a background thread, so it works the same
from scripts, pytest and notebooks (which already run a loop of their own).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _run(coroutine: Any) -> Any:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="coreai-runtime", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coroutine, _loop).result()


class LoadedAsset:
    """A Core AI asset loaded for execution (compiled once, callable many times)."""

    def __init__(self, path: str | os.PathLike, function: str = "main") -> None:
        from coreai.authoring import AIModelAsset

        self.path = Path(path)
        self._context = AIModelAsset.load(self.path).executable()
        model = _run(self._context.__aenter__())
        self._function = model.load_function(function)
        desc = self._function.desc
        self.input_names: list[str] = list(desc.input_names)
        self.output_names: list[str] = list(desc.output_names)
        self.state_names: list[str] = list(desc.state_names)
        _open_assets.add(self)
        logger.info("loaded Core AI asset %s", self.path)

    def __call__(
        self,
        inputs: Mapping[str, np.ndarray],
        state: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the function; ``state`` arrays are updated in place by the runtime."""
        from coreai.runtime import NDArray

        arrays = {name: NDArray(np.ascontiguousarray(value)) for name, value in inputs.items()}
        states = {name: NDArray(value) for name, value in (state or {}).items()}
        outputs = _run(self._function(arrays, state=states))
        if state is not None:
            for name, value in states.items():
                np.copyto(state[name], value.numpy())
        return {name: value.numpy() for name, value in outputs.items()}

    def close(self) -> None:
        if self in _open_assets:
            _open_assets.discard(self)
            _run(self._context.__aexit__(None, None, None))


_open_assets: set[LoadedAsset] = set()


@atexit.register
def _close_all() -> None:
    for asset in list(_open_assets):
        try:
            asset.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
