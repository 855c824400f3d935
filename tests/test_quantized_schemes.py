"""Every ``quantize=`` scheme on one model whose weights are most of its ``.pte``: size, composites, runtime.

The model is the tiny Llama made wider (d 256, MLP 1024, vocab 1024, two
layers: 2.2M weights, 4.4 MB in fp16, the embedding 12% of them, the Core AI
program and ExecuTorch's own bytes about 1%), random weights, fp32, lowered once per scheme
with ``text_generation.lower_decoder``.  Each scheme's ``.pte`` is:

- as small as its bits say: at most what the scheme's forms store for the
  weights (:meth:`~coreai_partitioner.quantize.weight_forms.Form.stored_bits`; tables
  and scales in fp32, as this model's dtype) plus the other parameters and
  :data:`FIXED` bytes of program; ``palettize4`` at most 0.30x the fp16 weights;
- the same composites as the float model (the family's row in ``ROWS``);
- what ``export-llm --verify`` passes: ``text_generation.check`` finds its logits within
  the fp32 runtime's rounding of the quantized eager model's (the program
  ``quantize`` made, before lowering) over the verify tokens, and fails it
  against each broken twin of that eager model (``llm_helpers.TWINS``).
"""

from __future__ import annotations

import pytest
import torch

from requires import require

require("transformers", "hf")
require("coreai_opt", "quantize")

from llm_helpers import ROWS, TWINS, broken_twin  # noqa: E402
from test_llm_families import asset_composites, wider  # noqa: E402

from coreai_partitioner import text_generation, save_pte  # noqa: E402
from coreai_partitioner.quantize.schemes import SCHEMES, scheme  # noqa: E402

pytestmark = pytest.mark.slow

SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8, verify_len=0)  # forward's composites counted in the asset alone; verify's are tests/test_speculative.py's
SIZES = dict(hidden_size=256, intermediate_size=1024, vocab_size=1024)
#: The .pte's bytes besides the weights: ExecuTorch's own and the Core AI program with its dequantizing ops
#: (5 kB and 13 kB float at this depth: README, "Quantized weights"), with room.
FIXED = 40_000


class Lowered:
    """The model, its ``.pte`` under one scheme, and the quantized eager model."""

    def __init__(self, name: str, directory) -> None:
        self.scheme = name
        self.model = wider("llama", **SIZES)
        reference: list = []
        lowered = text_generation.lower_decoder(self.model, SHAPES, quantize=name, quantized_reference=reference)
        self.pte = save_pte(lowered, directory / f"{name}.pte")
        self.eager = text_generation.reset_state(reference[0])


_built: dict[str, Lowered] = {}


@pytest.fixture(scope="module", params=list(SCHEMES))
def lowered(request, tmp_path_factory) -> Lowered:
    if request.param not in _built:
        _built.clear()  # one scheme's programs in memory at a time
        _built[request.param] = Lowered(request.param, tmp_path_factory.mktemp("schemes"))
    return _built[request.param]


def weights_bits(model: torch.nn.Module, name: str) -> float:
    """The most bits scheme ``name`` stores for ``model``'s parameters, by its forms; the rest at 32 bits.

    Every Linear and embedding weight takes its form (the embedding's, or the
    Linear one); a mixed scheme may promote up to its share of the Linear
    weights to its wider form.
    """
    found = scheme(name)
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    stored = {id(m.weight): m.weight for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))}
    bits = 0.0
    linear = [w for key, w in stored.items() if key not in embedded]
    for key, weight in stored.items():
        bits += (found.embedding if key in embedded else found.linear).stored_bits(weight.shape, float_bits=32)
    if found.promoted is not None:
        extra = max(
            (found.promoted.stored_bits(w.shape, float_bits=32) - found.linear.stored_bits(w.shape, float_bits=32)) / w.numel()
            for w in linear
        )
        bits += found.promoted_share * sum(w.numel() for w in linear) * extra
    others = {id(p): p for p in model.parameters() if id(p) not in stored}
    return bits + 32 * sum(p.numel() for p in others.values())


def test_each_schemes_pte_is_as_small_as_its_bits_say(lowered):
    size = lowered.pte.stat().st_size
    bound = weights_bits(lowered.model, lowered.scheme) / 8 + FIXED
    fp16_weights = 2 * sum(p.numel() for p in {id(p): p for p in lowered.model.parameters()}.values())
    assert size <= bound, f"{lowered.scheme}: {size:,} bytes, its forms say at most {bound:,.0f} ({size / fp16_weights:.3f}x fp16)"
    if lowered.scheme == "palettize4":
        assert size <= 0.30 * fp16_weights, (size, fp16_weights)


def test_each_scheme_keeps_every_composite(lowered):
    counts = asset_composites(lowered.pte)
    assert {name: counts[name] for name in ROWS["llama"]} == ROWS["llama"]


def test_llm_check_passes_each_schemes_pte_against_its_quantized_eager_model_and_fails_its_broken_twins(lowered):
    reference = text_generation.check.reference(lowered.model, SHAPES)  # the fp32 model: its tokens, and the quality report
    eager = text_generation.check.eager_logits(lowered.eager, reference, SHAPES)
    logits = text_generation.check.program_logits(lowered.pte, reference, SHAPES)
    report = text_generation.check.judge(logits, reference, eager=eager, quantize=lowered.scheme)
    assert report.ok, report
    assert report.picked == report.eager_picked, report  # each step's top-1 is the quantized eager model's
    for twin in TWINS:
        wrong = text_generation.check.eager_logits(broken_twin(lowered.eager, twin), reference, SHAPES)
        report = text_generation.check.judge(logits, reference, eager=wrong, quantize=lowered.scheme)
        row = report.signal.outputs[0]
        assert not report.ok and row.snr < row.threshold.snr, (lowered.scheme, twin, str(report))


def test_tables_expand_by_one_gather_as_coreai_torchs_lut_to_dense():
    from coreai_partitioner import _compat
    from coreai_partitioner.quantize.weight_forms import expand_tables

    generator = torch.Generator().manual_seed(0)
    for shape, groups in (((64, 48), (2, 1)), ((3, 64, 16), (3, 4, 1))):  # a Linear; experts, a table each
        indices = torch.randint(0, 16, shape, generator=generator, dtype=torch.uint8)
        lut = torch.randn(*groups, 16, 1, generator=generator)
        expected = _compat.compression_ops().lut_to_dense.default(indices, lut, 0)
        assert torch.equal(expand_tables(indices, lut, 0), expected), shape


def test_expanding_a_quantized_eager_models_weights_once_leaves_its_logits_as_they_were(lowered):
    import copy

    from coreai_partitioner.quantize.weight_forms import expand_weights

    tokens, positions = torch.arange(3, 3 + SHAPES.prefill_chunk)[None], torch.arange(SHAPES.prefill_chunk)
    with torch.no_grad():
        expected = text_generation.reset_state(copy.deepcopy(lowered.eager))(tokens, positions)
        expanded = expand_weights(text_generation.reset_state(copy.deepcopy(lowered.eager)))
        assert any(n.op == "get_attr" and n.target.endswith("_expanded") for n in expanded.graph.nodes)
        assert torch.equal(expanded(tokens, positions), expected)
