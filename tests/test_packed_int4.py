"""int4 integers held two a byte (coreai_partitioner/quantize/packed_int4.py), rounded a few rows at a time."""

import pytest
import torch

from coreai_partitioner import _compat  # noqa: F401 - coreai-torch without its version warning
from coreai_partitioner.quantize import packed_int4, weight_forms
from coreai_partitioner.quantize.weight_forms import Form, compress


def test_packed_int4_is_coreai_torchs_int4_layout_and_unpacks_to_the_integers():
    from coreai_torch._compression._intx import pack_intx

    data = torch.randint(-8, 8, (3, 5, 10), dtype=torch.int8)
    packed = packed_int4.pack(data)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, 5)
    assert torch.equal(packed.reshape(-1), pack_intx(data, 4))
    assert torch.equal(packed_int4.unpack(packed), data)
    assert torch.equal(packed_int4.UNPACK_INT4(packed), data)
    with pytest.raises(ValueError, match="odd last dim"):
        packed_int4.pack(data[..., :9])


@pytest.mark.parametrize("form, shape, axis", [
    (Form("int", 4, 16), (40, 64), 0),
    (Form("int", 4), (6, 12, 32), 1),
    (Form("int", 8, 16), (40, 64), 0),
    (Form("int", 4), (8, 4, 3, 3), 0),  # a 3x3 kernel: rows of odd width stay a byte a value
])
def test_an_int_form_rounded_or_read_a_few_rows_at_a_time_stores_what_the_whole_weight_gives(monkeypatch, form, shape, axis):
    torch.manual_seed(0)
    weight = torch.randn(shape, dtype=torch.float16)
    whole = compress(weight, form, axis=axis)
    monkeypatch.setattr(weight_forms, "ROUNDED_AT_ONCE", 70)  # one or two rows of dim 0 at a time
    rows = compress(weight, form, axis=axis)
    # as a weight streamed from its checkpoint: a data-less weight and its rows read on demand
    read = compress(torch.empty(shape, dtype=weight.dtype, device="meta"), form, axis=axis, read=lambda a, b: weight[a:b])
    for name in whole.buffers:
        assert torch.equal(whole.buffers[name], rows.buffers[name]), name
        assert torch.equal(whole.buffers[name], read.buffers[name]), name
    assert packed_int4.is_packed(rows.buffers["quantized"]) == (form.bits == 4 and shape[-1] % 2 == 0)
    transposed = rows.transpose(0, 1)
    assert torch.equal(transposed.expand(), rows.expand().transpose(0, 1))
