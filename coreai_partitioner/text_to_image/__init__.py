"""Text-to-image: a diffusers Stable Diffusion pipeline (SD 1.x/2.x, SD3) to one ``.pte``, and the loop that runs it.

- :mod:`.pipeline`: a pipeline directory read (its family, parts and scheduler), its parts loaded;
- :mod:`.stable_diffusion`: the methods (text encoders, ``denoiser``, ``vae_decoder``),
  :func:`~.stable_diffusion.lower_stable_diffusion`;
- :mod:`.schedulers`: the diffusers schedulers the loop steps;
- :mod:`.loop`: :func:`~.loop.generate` (the family's diffusers loop through a ``.pte``), :func:`~.loop.write_png`;
- :mod:`.reference`: diffusers' own pipeline on the parts, what the loop is judged against;
- :mod:`.tiny`: the tiny random pipelines (``--config stable-diffusion``, ``--config stable-diffusion-3``).
"""

from coreai_partitioner.text_to_image.loop import ImageProgram, generate, write_png
from coreai_partitioner.text_to_image.pipeline import UnsupportedPipeline
from coreai_partitioner.text_to_image.schedulers import UnsupportedScheduler
from coreai_partitioner.text_to_image.stable_diffusion import METHODS, lower_stable_diffusion

__all__ = [
    "METHODS", "ImageProgram", "UnsupportedPipeline", "UnsupportedScheduler", "generate", "lower_stable_diffusion",
    "write_png",
]
