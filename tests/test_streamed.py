"""A quantized export reads each weight its scheme stores from the checkpoint as it compresses it
(``checkpoints/lazy.py``, ``quantize/streamed.py``), and writes the ``.pte`` the float-first path wrote, byte for byte."""

from __future__ import annotations

import hashlib

import pytest
import torch
from requires import require

def checkpoint(directory, model_type: str):
    """The tiny random model of ``model_type`` saved in bf16, as checkpoints ship."""
    require("transformers", "hf")
    from transformers import AutoModelForCausalLM

    from coreai_partitioner import text_generation

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(text_generation.tiny_config(model_type), dtype=torch.bfloat16).save_pretrained(directory)
    return directory


def test_a_streamed_weight_a_program_keeps_is_read_into_it_and_one_computed_from_it_is_refused(tmp_path):
    """What ``store_weights`` leaves of a streamed weight (one the scheme did not store) is read from the checkpoint,
    cast, into the program; a data-less weight that is no streamed one would lower as zeros, and is refused."""
    from safetensors.torch import save_file

    from coreai_partitioner import checkpoints

    stored = torch.randn(3, 4).to(torch.bfloat16)
    save_file({"weight": stored}, tmp_path / "model.safetensors")
    model = torch.nn.Linear(4, 3, bias=False)
    assert checkpoints.stream_weights(model, tmp_path, ["weight"], {"weight": torch.float16}) == ["weight"]
    assert checkpoints.is_streamed(model.weight)
    sample = (torch.randn(1, 4, dtype=torch.float16),)
    program = torch.export.export(model, sample)
    assert checkpoints.materialize_program(program) == 1
    (weight,) = program.state_dict.values()
    assert not checkpoints.is_streamed(weight) and torch.equal(weight, stored.to(torch.float16))

    model.weight = torch.nn.Parameter(model.weight * 2, requires_grad=False)  # computed from it: no data, no source
    with pytest.raises(RuntimeError, match=r"weight \[3, 4\] has no data: .* --verify"):
        checkpoints.materialize_program(torch.export.export(model, sample))


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type, scheme",
    # Gemma 3: a tied embedding and lm_head, an embedding scale made in the default dtype; GPT-OSS: norms
    # transformers keeps in fp32 at fp16
    [pytest.param("gemma3_text", "int8", marks=pytest.mark.benchmark), ("gpt_oss", "int4")],  # CI: GPT-OSS's
)
def test_a_quantized_export_streams_the_stored_weights_and_writes_the_float_first_pte(tmp_path, monkeypatch, model_type, scheme):
    from transformers import AutoConfig, AutoModelForCausalLM

    from coreai_partitioner.cli.detect import tasks
    from coreai_partitioner.cli.main import main
    from coreai_partitioner.checkpoints import is_streamed
    from coreai_partitioner.quantize import streamed
    from coreai_partitioner.quantize.checks import stored_weights

    directory = checkpoint(tmp_path / model_type, model_type)
    model = streamed.load_streamed(AutoModelForCausalLM, directory, AutoConfig.from_pretrained(directory), torch.float16, scheme)
    stored = {w.name for w in stored_weights(model, scheme)}
    parameters = dict(model.named_parameters(remove_duplicate=False))
    assert stored and all(is_streamed(parameters[name]) for name in stored)  # no float copy of any
    assert not any(is_streamed(p) for name, p in parameters.items() if name not in stored | {"lm_head.weight"})

    loaded = []
    load = streamed.load_streamed
    monkeypatch.setattr(streamed, "load_streamed", lambda *args: loaded.append(args) or load(*args))
    digests = {}
    for streams in (True, False):
        monkeypatch.setattr(tasks()["text-generation"], "STREAMS_WEIGHTS", streams)
        out = tmp_path / f"streams-{streams}" / "model.pte"
        argv = ["export", "--checkpoint", str(directory), "--quantize", scheme, "--dtype", "fp16", "--no-tokenizer"]
        assert main([*argv, "--out", str(out)]) == 0
        digests[streams] = hashlib.sha256(out.read_bytes()).hexdigest()
    assert len(loaded) == 1  # the command streamed once, then loaded the float model
    assert digests[True] == digests[False]


@pytest.mark.slow
def test_verify_of_a_checkpoint_over_the_machines_memory_runs_its_references_a_module_at_a_time(tmp_path, monkeypatch):
    """``export --quantize --verify`` where the fp32 weights are over half the machine's memory: the fp32 reference
    reads each weight while its module runs (``checkpoints.read_while_running``) and gives the whole fp32 model's tokens
    and logits exactly; the quantized eager model run with its weights compressed gives what it gives expanded once;
    the export streams, and the command's check passes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from coreai_partitioner import text_generation
    from coreai_partitioner.checkpoints import files as checkpoint_files_module
    from coreai_partitioner.checkpoints import is_streamed, read_while_running
    from coreai_partitioner.cli.main import main
    from coreai_partitioner.quantize import streamed
    from coreai_partitioner.text_generation import check

    directory = checkpoint(tmp_path / "llama", "llama")
    config = AutoConfig.from_pretrained(directory)
    shapes = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=8)
    whole = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    expected = check.reference(whole, shapes)
    model = streamed.load_streamed(AutoModelForCausalLM, directory, config, torch.float32)
    assert all(is_streamed(p) for p in model.parameters())  # every weight left in the checkpoint
    with read_while_running(model):
        got = check.reference(model, shapes)
    assert got.tokens == expected.tokens and torch.equal(got.logits, expected.logits)
    assert all(is_streamed(p) for p in model.parameters())  # each dropped once its module returned

    held: list = []
    text_generation.lower_decoder(whole, shapes, quantize="int4", quantized_reference=held)
    assert torch.equal(check.eager_logits(held[0], expected, shapes, expanded=False),
                       check.eager_logits(held[0], expected, shapes))

    loaded = []
    load = streamed.load_streamed
    monkeypatch.setattr(streamed, "load_streamed", lambda *args: loaded.append(args[4:]) or load(*args))
    monkeypatch.setattr(checkpoint_files_module, "memory_bytes", lambda: 1000)  # this checkpoint's fp32 weights do not fit
    out = tmp_path / "out" / "model.pte"
    argv = ["export", "--checkpoint", str(directory), "--quantize", "int4", "--no-tokenizer", "--verify", "--out", str(out)]
    assert main(argv) == 0 and out.is_file()
    assert loaded == [(), ("int4",)]  # the reference streams every weight, the export those int4 stores
