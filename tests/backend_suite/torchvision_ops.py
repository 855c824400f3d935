"""torchvision's operator schemas, defined before ``import torchvision`` so it imports beside our CPU torch.

The registry's torchvision 0.28.0 (installed with ``--no-deps``) links a CUDA
build of torch; its C extension, which defines ``torchvision::nms`` and
``torchvision::qnms``, fails to load on torch 2.13.0+cpu, and torchvision's
``_meta_registrations`` then registers fake kernels for operators that do not
exist ("operator torchvision::nms does not exist").  The models the backend
suite builds use neither operator: their schemas are enough.
"""

from __future__ import annotations

import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


def _define() -> torch.library.Library | None:
    missing = [name for name in _SCHEMAS if not _exists(name)]
    if not missing:
        return None
    library = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        library.define(_SCHEMAS[name])
    return library


def _exists(name: str) -> bool:
    return hasattr(torch.ops.torchvision, name)


#: kept alive: a Library object's definitions go when it is collected
LIBRARY = _define()
