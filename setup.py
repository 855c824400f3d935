"""coreai-partitioner: an ExecuTorch partitioner that keeps Core AI composite ops.

Like ExecuTorch's own setup.py maps its ``backends/`` folder into the
``executorch.backends`` namespace, this one maps ``backends/`` into
``coreai_partitioner.backends``.
"""

from setuptools import setup

setup(
    name="coreai-partitioner",
    version="0.1.0",
    description=(
        "ExecuTorch partitioner that carries coreai-torch externalized submodules "
        "(composite ops) into a Core AI delegate"
    ),
    # README's opening paragraph: the whole of README (and docs/) is the checkout's to read.
    long_description=open("README.md", encoding="utf-8").read().split("\n## ", 1)[0],
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=[
        "coreai_partitioner",
        "coreai_partitioner._compat",
        "coreai_partitioner.records",
        "coreai_partitioner.partition",
        "coreai_partitioner.partition.claims",
        "coreai_partitioner.lowering",
        "coreai_partitioner.checkpoints",
        "coreai_partitioner.quantize",
        "coreai_partitioner.adapters",
        "coreai_partitioner.recipes",
        "coreai_partitioner.verify",
        "coreai_partitioner.text_generation",
        "coreai_partitioner.blocks",
        "coreai_partitioner.text_decoder",
        "coreai_partitioner.text_decoder.families",
        "coreai_partitioner.image_text_to_text",
        "coreai_partitioner.image_text_to_text.families",
        "coreai_partitioner.speech_recognition",
        "coreai_partitioner.text_to_speech",
        "coreai_partitioner.text_to_speech.families",
        "coreai_partitioner.text_to_image",
        "coreai_partitioner.seq2seq",
        "coreai_partitioner.text2text",
        "coreai_partitioner.text_encoder",
        "coreai_partitioner.image_classification",
        "coreai_partitioner.cli",
        "coreai_partitioner.cli.tasks",
        "coreai_partitioner.backends",
        "coreai_partitioner.backends.apple_coreai",
        "coreai_partitioner.backends.apple_coreai.runtime",
    ],
    package_dir={
        "coreai_partitioner": "coreai_partitioner",
        "coreai_partitioner.backends": "backends",
    },
    # The host Core AI runtime backend is compiled from these on first use.
    package_data={"coreai_partitioner.backends.apple_coreai.runtime": ["*.cpp", "*.h"]},
    entry_points={"console_scripts": ["coreai-export-llm = coreai_partitioner.cli.export:export_llm"]},
    install_requires=[
        "torch==2.13.0",
        "executorch==1.5.1",
        "coreai-torch==0.4.3",
        "coreai-core==1.0.0b3",
        "coremltools==9.0",
    ],
    extras_require={
        # gguf and accelerate load the real trained checkpoint the tests use (tests/real_checkpoint.py).
        "test": ["pytest>=8", "pytest-xdist==3.8.0", "pytest-timeout==2.4.0", "pytest-json-report==1.5.0", "hypothesis>=6", "transformers==5.24.0", "coreai-opt==0.4.0", "gguf==0.19.0", "accelerate==1.15.0", "sentence-transformers==6.3.0", "peft==0.21.2", "diffusers==0.42.1", "loguru==0.7.3"],
        "quantize": ["coreai-opt==0.4.0"],
        # PEFT LoRA adapters over one base (export --adapter); the test extra trains two (tests/real_adapters.py).
        "adapters": ["peft==0.21.2"],
        # Stable Diffusion pipelines (export's text-to-image task; generate-image steps diffusers' schedulers).
        "diffusers": ["diffusers==0.42.1"],
        # Kokoro (export's text-to-speech task): its model code's one dependency beyond torch and transformers; the
        # kokoro package itself installs with --no-deps (its G2P, misaki[en] with spaCy, is the app's).
        "kokoro": ["loguru==0.7.3"],
        # Tested on 5.24.0 and on 5.0.0rc1 (what optimum-executorch 1.1.0 pins): tests/test_transformers_rc1.py.
        "hf": ["transformers>=5.0.0rc1,<=5.24.0"],
        "bench": ["matplotlib>=3.8"],
    },
)
