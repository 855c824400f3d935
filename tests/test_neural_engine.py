"""Per-block integer weights and the Neural Engine: the device form warns, once, citing Apple's report.

Apple's coreai-models #279 measured 8-bit per-block int weights at cosine
0.367 against fp32 on the Neural Engine (0.999 on the GPU, 8-bit palettized
0.9975 on the Neural Engine); nothing here runs a Neural Engine
(docs/quantization.md says what is known and what is not measured).
"""

from __future__ import annotations

import warnings

import pytest

from coreai_partitioner.quantize.schemes import (
    NEURAL_ENGINE_SCHEMES, SCHEMES, per_block_int, scheme, warn_per_block_int_on_device,
)


def neural_engine_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "coreai-models#279" in str(w.message)]


def test_only_per_block_int_schemes_warn_and_the_warning_names_the_report_and_the_schemes_without_blocks():
    assert [name for name in SCHEMES if per_block_int(name)] == ["int4"]
    assert per_block_int(scheme("int4", block_size=64)) and not per_block_int(scheme("palettize4", group_size=16))
    assert not any(per_block_int(name) for name in NEURAL_ENGINE_SCHEMES)
    for quiet in (None, *(name for name in SCHEMES if name != "int4")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warn_per_block_int_on_device(quiet)
    with pytest.warns(UserWarning) as caught:
        warn_per_block_int_on_device("int4")
    (message,) = neural_engine_warnings(caught.list)
    for says in ("quantize='int4'", "0.367", "0.9975", "Neural Engine", "int4-channel, palettize4, palettize4-mixed"):
        assert says in message


@pytest.mark.slow
def test_a_device_form_int4_export_warns_once_citing_the_neural_engine_report():
    """The static layout exports two methods (``forward``, ``prefill``) over one asset: one warning, not one a method;
    the host form gives none."""
    from llm_helpers import tiny

    from coreai_partitioner import text_generation

    model = tiny("llama")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shapes = text_generation.DecoderShapes(max_context_len=16, prefill_chunk=4, target="device", device_shapes="static")
        text_generation.lower_decoder(model, shapes, quantize="int4")
    assert len(neural_engine_warnings(caught)) == 1, [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text_generation.lower_decoder(model, text_generation.DecoderShapes(max_context_len=16, prefill_chunk=4), quantize="int4")
    assert neural_engine_warnings(caught) == []
