"""Text-to-image: a diffusers Stable Diffusion pipeline to one ``.pte`` with three methods, and the loop that runs them.

- :mod:`.pipeline`: a pipeline directory read (its family, parts and scheduler), its parts loaded;
- :mod:`.stable_diffusion`: ``text_encoder``, ``denoiser`` and ``vae_decoder``, :func:`~.stable_diffusion.lower_stable_diffusion`;
- :mod:`.schedulers`: the diffusers schedulers the loop steps;
- :mod:`.loop`: :func:`~.loop.generate` (``StableDiffusionPipeline.__call__``'s loop through a ``.pte``), :func:`~.loop.write_png`;
- :mod:`.tiny`: the tiny random pipeline (``--config stable-diffusion``).
"""

from coreai_partitioner.text_to_image.loop import ImageProgram, generate, write_png
from coreai_partitioner.text_to_image.pipeline import UnsupportedPipeline
from coreai_partitioner.text_to_image.schedulers import UnsupportedScheduler
from coreai_partitioner.text_to_image.stable_diffusion import METHODS, lower_stable_diffusion

__all__ = [
    "METHODS", "ImageProgram", "UnsupportedPipeline", "UnsupportedScheduler", "generate", "lower_stable_diffusion",
    "write_png",
]
