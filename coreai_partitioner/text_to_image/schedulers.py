"""The schedulers the text-to-image loop steps: diffusers' own, built from the pipeline's ``scheduler_config.json``.

The loop (:mod:`.loop`) steps exactly what diffusers' pipeline steps, so a
seed, a scheduler and a step count give the image diffusers gives.  It takes
the schedulers of :data:`SCHEDULERS` its family takes (noise prediction for
SD 1.x/2.x, flow matching for SD3); another (SD 1.5's ``PNDMScheduler``) is
refused naming the ones it takes, and ``--scheduler NAME`` builds one of them
from the same config instead (as ``EulerDiscreteScheduler.from_config`` does
in diffusers).
"""

from __future__ import annotations

from coreai_partitioner import _compat

import importlib
from typing import Any

#: ``--scheduler`` names, the diffusers class each builds, and the module that holds it.
SCHEDULERS = {
    "ddim": ("DDIMScheduler", "scheduling_ddim"),
    "euler": ("EulerDiscreteScheduler", "scheduling_euler_discrete"),
    "euler-ancestral": ("EulerAncestralDiscreteScheduler", "scheduling_euler_ancestral_discrete"),
    "flow-match-euler": ("FlowMatchEulerDiscreteScheduler", "scheduling_flow_match_euler_discrete"),
}


class UnsupportedScheduler(ValueError):
    """A scheduler the loop does not step; names it and the ones it takes."""


def name_of(class_name: str) -> str | None:
    """The ``--scheduler`` name of a diffusers scheduler class, or ``None``."""
    return next((name for name, (cls, _) in SCHEDULERS.items() if cls == class_name), None)


def check_scheduler(config: dict[str, Any], override: str | None, takes: tuple[str, ...]) -> str:
    """The ``--scheduler`` name the loop will step for ``config`` (``override`` where given), one of ``takes`` (a
    family's: :attr:`~.pipeline.Family.schedulers`); refused otherwise."""
    name = override or name_of(config.get(_compat.DIFFUSERS_CLASS, ""))
    if name not in takes:
        said = f"--scheduler {override}" if override else f"scheduler_config.json's _class_name {config.get(_compat.DIFFUSERS_CLASS)!r}"
        raise UnsupportedScheduler(
            f"{said}: the text-to-image loop steps {', '.join(SCHEDULERS[n][0] for n in takes)} for this pipeline; give "
            f"--scheduler with one of {', '.join(takes)} (built from the same config, as diffusers' from_config does)"
        )
    return name


def build_scheduler(config: dict[str, Any], override: str | None, takes: tuple[str, ...]) -> Any:
    """The diffusers scheduler :func:`check_scheduler` names, made from ``config``."""
    class_name, module = SCHEDULERS[check_scheduler(config, override, takes)]
    cls = getattr(importlib.import_module(f"diffusers.schedulers.{module}"), class_name)
    return cls.from_config(config)
