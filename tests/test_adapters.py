"""LoRA adapters over one base: refused by field before any work, lowered once, a .pte per adapter over one .ptd.

Each program runs in ExecuTorch's runtime with the base's data file and
gives PEFT's own logits, its adapter active and unmerged; the base gives the
base model's.  Files are held to the issue's sizes: the ``.ptd`` at most
1.02x the base weights, an adapter's ``.pte`` at most 1.1x its pairs plus 64 kB.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from requires import require

require("transformers", "hf")
require("peft", "test")

from llm_helpers import tiny  # noqa: E402

from coreai_partitioner import text_generation, verify  # noqa: E402
from coreai_partitioner.adapters.config import AdapterError, check_adapter_config, parse_adapter_argument, read_adapter  # noqa: E402
from coreai_partitioner.text_generation import check  # noqa: E402
from coreai_partitioner.text_generation.adapters import WithPairs  # noqa: E402
from coreai_partitioner.text_generation.export import lower_with_adapters  # noqa: E402

SHAPES = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(base: torch.nn.Module, seed: int, **config):
    """``base`` with a random LoRA adapter whose B is not zero (PEFT initializes B to zeros)."""
    from peft import LoraConfig, get_peft_model

    options = {"r": 4, "lora_alpha": 8, "target_modules": PROJECTIONS, "lora_dropout": 0.0, **config}
    model = get_peft_model(base, LoraConfig(**options))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model.eval()


def saved_adapter(directory: Path, base: torch.nn.Module, seed: int, **config) -> Path:
    """A random adapter over ``base`` saved as PEFT saves one; ``base`` is left as it was."""
    model = peft_model(base, seed, **config)
    model.save_pretrained(directory)
    model.unload()  # the base's own layers back, unmerged
    return directory


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory):
    base = tiny("llama")
    root = tmp_path_factory.mktemp("adapters")
    first = saved_adapter(root / "tone", base, 1)
    second = saved_adapter(
        root / "facts", base, 2, r=2, use_rslora=True, rank_pattern={"down_proj": 3}, alpha_pattern={"q_proj": 5},
        target_modules=["q_proj", "v_proj", "down_proj"],
    )
    return base, first, second


# ---------------------------------------------------------------- fast: refusals, before any work


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("use_dora", True, "DoRA"),
        ("modules_to_save", ["lm_head"], "modules_to_save"),
        ("bias", "all", "bias"),
        ("lora_bias", True, "lora_bias"),
        ("target_parameters", ["mlp.experts.gate_up_proj"], "target_parameters"),
        ("peft_type", "IA3", "only LoRA"),
    ],
)
def test_an_adapter_config_field_plain_lora_lacks_is_refused_by_name(field, value, says, tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, field: value}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(AdapterError) as error:
        check_adapter_config(tmp_path)
    message = str(error.value)
    assert says in message and str(tmp_path) in message


def test_a_whole_model_directory_passed_as_an_adapter_says_what_it_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(AdapterError, match=r"not a PEFT adapter directory: it has config.json \(a whole model\)"):
        check_adapter_config(tmp_path)


def test_an_adapter_argument_takes_a_name_or_the_directorys():
    assert parse_adapter_argument("tone=/a/b") == ("tone", Path("/a/b"))
    assert parse_adapter_argument("/x/my-adapter") == ("my-adapter", Path("/x/my-adapter"))
    with pytest.raises(AdapterError, match="NAME=DIR"):
        parse_adapter_argument("a b=/x")


def test_an_adapter_of_another_base_is_refused_by_name_and_by_shape(adapter_dirs, tmp_path):
    import shutil

    from transformers import AutoConfig

    base, first, _ = adapter_dirs
    named = shutil.copytree(first, tmp_path / "named")
    config = json.loads((named / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (named / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="trained on 'HuggingFaceTB/SmolLM2-135M-Instruct'.* not on '/models/another-model'"):
        read_adapter("tone", named, base.config, base_name="/models/another-model")
    read_adapter("tone", named, base.config, base_name="/models/SmolLM2-135M-Instruct")  # the same name, elsewhere
    wider = AutoConfig.for_model(**{**base.config.to_dict(), "intermediate_size": base.config.intermediate_size * 2})
    with pytest.raises(AdapterError, match=r"mlp.gate_proj.lora_B.weight is \[.*needs \[.*another base model"):
        read_adapter("tone", first, wider)


def test_a_target_that_is_not_linear_is_refused_naming_it(adapter_dirs, tmp_path):
    import shutil

    base, first, _ = adapter_dirs
    shutil.copytree(first, tmp_path / "embedding")
    config_path = tmp_path / "embedding" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["target_modules"] = ["embed_tokens"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(AdapterError, match=r"embed_tokens is Embedding, not nn.Linear"):
        read_adapter("embedding", tmp_path / "embedding", base.config)


def test_an_adapter_on_moe_experts_is_refused_naming_target_parameters():
    from coreai_partitioner.adapters.config import adapter_of_peft_model

    model = peft_model(tiny("qwen3_moe"), 5)  # PEFT targets the experts' gate_up_proj and down_proj as parameters
    with pytest.raises(AdapterError, match=r"target_parameters=.*down_proj.*not a linear layer"):
        adapter_of_peft_model(model)


def test_a_slot_whose_layer_the_model_never_calls_is_refused_naming_it():
    """A model that reads a targeted layer's weight instead of calling the layer would drop its adapter: the call
    that leaves the slot unread is refused, naming the layer."""
    from coreai_partitioner.adapters.config import Adapter, LowRank
    from coreai_partitioner.lowering.lower import export_with_composites
    from coreai_partitioner.text_decoder.slots import AdapterInputs, adapter_slots

    class Model(torch.nn.Module):
        def __init__(self, reads_weight: bool) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)
            self.reads_weight = reads_weight

        def forward(self, x):
            h = self.up(x)
            return torch.nn.functional.linear(h, self.down.weight) if self.reads_weight else self.down(h)

    pair = {"up": LowRank(2, 1.0, torch.ones(2, 4), torch.ones(8, 2)), "down": LowRank(2, 1.0, torch.ones(2, 8), torch.ones(4, 2))}
    adapter = Adapter("a", pair, "test")
    for reads_weight in (False, True):
        model = Model(reads_weight)
        with adapter_slots(model, [adapter], 2) as slots:
            step = AdapterInputs(model, slots, ("x",))
            inputs = slots.inputs(slots.pairs_of(adapter, torch.float32))
            x = torch.ones(1, 4)
            if not reads_weight:  # both slots read: W x + (x Aᵀ) Bᵀ at each, A and B all ones
                hidden = model.up(x) + 8
                torch.testing.assert_close(step(x, *inputs), model.down(hidden) + 2 * hidden.sum())
                continue
            with pytest.raises(AdapterError, match=r"never calls down as a layer .*\(2 input\(s\) unread\)"):
                step(x, *inputs)
            with pytest.raises(AdapterError, match=r"never calls down as a layer"):  # the export's trace, as it is
                export_with_composites(step, (x, *inputs))
        assert type(model.down) is torch.nn.Linear  # given back as it was


def test_read_adapter_takes_peft_s_ranks_and_scales(adapter_dirs):
    base, _, second = adapter_dirs
    adapter = read_adapter("facts", second, base.config)
    q = adapter.layers["model.layers.0.self_attn.q_proj"]
    down = adapter.layers["model.layers.0.mlp.down_proj"]
    assert (q.rank, q.scale) == (2, pytest.approx(5 / 2**0.5))  # alpha_pattern, rsLoRA: alpha / sqrt(r)
    assert (down.rank, down.scale) == (3, pytest.approx(8 / 3**0.5))  # rank_pattern
    assert "model.layers.0.self_attn.k_proj" not in adapter.layers


# ---------------------------------------------------------------- slow: lowered once, run per adapter


def assert_runs_as(program, reference, dtype=torch.float32):
    verify.reset_state()
    report = check.check(program, reference, SHAPES if dtype == torch.float32 else SHAPES, dtype=dtype)
    assert report.ok, str(report)
    assert report.picked == report.eager_picked


@pytest.mark.slow
def test_two_adapters_and_the_base_share_one_ptd_and_each_gives_peft_s_logits(adapter_dirs, tmp_path):
    from peft import PeftModel

    base, first, second = adapter_dirs
    adapters = [read_adapter("tone", first, base.config), read_adapter("facts", second, base.config)]
    programs = lower_with_adapters(base, SHAPES, adapters)
    files = programs.save(tmp_path / "model.pte")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["facts.pte", "model.ptd", "model.pte", "tone.pte"]

    assert_runs_as(files["model"], check.reference(base, SHAPES))
    for adapter, directory in zip(adapters, (first, second)):
        peft = PeftModel.from_pretrained(base, directory).eval()
        reference = check.reference(peft, SHAPES)
        peft.unload()
        assert_runs_as(verify.PteWithData(files[adapter.name], files["data"]), reference)
        # An adapter costs its own bytes: at most 1.1x its pairs plus 64 kB.
        assert files[adapter.name].stat().st_size <= 1.1 * adapter.nbytes + 64_000
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in base.parameters()}.values())
    # The asset's program and RoPE tables are a few kB over the weights: 1.02x holds from the real model on
    # (test_real_model's installed command); a tiny model gets 32 kB of room.
    assert files["data"].stat().st_size <= 1.02 * weights + 32_000
    assert files["model"].stat().st_size <= 64_000


@pytest.mark.slow
def test_lower_decoder_takes_a_peft_model_keeping_its_adapter_low_rank(adapter_dirs, tmp_path):
    from coreai_partitioner import save_pte

    base, first, _ = adapter_dirs
    model = peft_model(tiny("llama"), 7)
    reference = check.reference(model, SHAPES)
    lowered = text_generation.lower_decoder(model, SHAPES)
    save_pte(lowered, tmp_path / "peft.pte")
    assert (tmp_path / "peft.ptd").is_file()
    assert_runs_as(tmp_path / "peft.pte", reference)
    # PEFT's own layers are back in place, its adapter active.
    assert type(model.get_base_model().model.layers[0].self_attn.q_proj).__module__.startswith("peft.")


#: Transformers 5 holds an MoE's experts as 3-d parameters, which PEFT targets as target_parameters (refused).
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def lowered_with_random_adapter(model_type: str, tmp_path: Path, dtype=torch.float32, **options):
    """A tiny ``model_type`` with a random adapter on its attention and MLP projections, lowered with it; the PEFT
    model, the adapter, the saved files and the programs."""
    from coreai_partitioner.adapters.config import adapter_of_peft_model

    model = peft_model(tiny(model_type, dtype), 11, target_modules=ATTENTION if "moe" in model_type else PROJECTIONS)
    adapter = adapter_of_peft_model(model)
    programs = lower_with_adapters(model.get_base_model(), options.pop("shapes", SHAPES), [adapter], **options)
    return model, adapter, programs.save(tmp_path / "model.pte"), programs


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen3_5_text"], ids=["moe", "hybrid"])
def test_every_family_kind_takes_an_adapter_on_its_linear_layers_and_gives_peft_s_logits(model_type, tmp_path):
    model, adapter, files, _ = lowered_with_random_adapter(model_type, tmp_path)
    assert len(adapter.layers) >= 6  # attention (and MLP) projections
    assert_runs_as(verify.PteWithData(files["default"], files["data"]), check.reference(model, SHAPES))


@pytest.mark.slow
def test_the_device_form_in_fp16_takes_adapters_within_the_device_runtime_s_contract(tmp_path):
    from device_contract import device_delegate_arguments

    shapes = text_generation.DecoderShapes(max_context_len=32, prefill_chunk=8, target="device")
    model, adapter, files, programs = lowered_with_random_adapter("qwen3", tmp_path, torch.float16, shapes=shapes)
    assert programs.slots.dtype == torch.float16
    program = verify.PteWithData(files["default"], files["data"])
    (arguments,) = device_delegate_arguments(program, ["forward"]).values()
    # Each slot's pair crosses the delegate as fp16 (the contract: fp16/fp32 tensors only, checked above).
    assert sum(argument.dtype == "HALF" for argument in arguments) >= 2 * len(adapter.layers)
    fp32 = peft_model(tiny("qwen3"), 11)
    reference = check.reference(fp32, shapes)
    eager = check.eager_logits(model, reference, shapes)
    verify.reset_state()
    report = check.check(program, reference, shapes, eager=eager, dtype=torch.float16)
    assert report.ok, str(report)


@pytest.mark.slow
def test_an_int4_base_keeps_its_adapter_in_fp16_and_gives_the_quantized_model_with_that_adapter(tmp_path):
    require("coreai_opt", "quantize")
    quantized: list = []
    model, adapter, files, programs = lowered_with_random_adapter(
        "llama", tmp_path, torch.float16, quantize="int4", quantized_reference=quantized
    )
    pairs = programs.pairs("default")
    assert all(pair.dtype == torch.float16 for pair in pairs)
    assert files["default"].stat().st_size <= 1.1 * sum(p.nbytes for p in pairs) + 64_000
    fp32 = peft_model(tiny("llama"), 11)
    reference = check.reference(fp32, SHAPES)
    eager = check.eager_logits(WithPairs(quantized[0], pairs), reference, SHAPES)  # the quantized model, this adapter
    verify.reset_state()
    report = check.check(
        verify.PteWithData(files["default"], files["data"]), reference, SHAPES, eager=eager, dtype=torch.float16, quantize="int4"
    )
    assert report.ok, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("precision", [("--dtype", "fp16"), ("--quantize", "int8")], ids=["fp16", "int8"])
def test_the_export_command_verifies_the_base_and_each_adapter_against_its_eager_model(precision, tmp_path):
    """``export --adapter --verify``: the base's and the adapter's ``.pte`` over the one ``.ptd``, each judged against
    the eager model it was lowered from (PEFT's at fp16; the quantized eager model with its pairs under int8)."""
    import subprocess
    import sys

    import tokenizer_files
    import transformers

    checkpoint, _ = tokenizer_files.checkpoint(tmp_path / "checkpoint", None)
    saved_adapter(tmp_path / "tone", transformers.AutoModelForCausalLM.from_pretrained(checkpoint), 1)
    command = [
        sys.executable, "-m", "coreai_partitioner", "export", "--checkpoint", str(checkpoint), "--no-tokenizer",
        "--adapter", f"tone={tmp_path / 'tone'}", *precision, "--verify", "--verify-len", "0", "--out", str(tmp_path / "out" / "model.pte"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = done.stdout.split("\n[")[1:]
    assert [report.split("]", 1)[0] for report in reports] == ["model", "tone"]
    assert all("the .pte's are the eager model's" in report for report in reports), done.stdout[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.ptd", "model.pte", "tone.pte"]


@pytest.mark.slow
def test_a_decoder_with_adapter_slots_is_traced_whole_so_every_slot_is_read(caplog):
    """Layers alike are traced once and repeated (lowering/repeated.py), but a slot is checked read during the trace:
    a decoder with slots traces every layer, and its slot on a layer past the traced four is read."""
    import logging

    import transformers

    from coreai_partitioner.adapters.config import Adapter, LowRank
    from coreai_partitioner.lowering import repeated
    from coreai_partitioner.lowering.whole_program import decomposition_table
    from coreai_partitioner.text_decoder.export import export_decoder
    from coreai_partitioner.text_decoder.slots import adapter_slots

    config = text_generation.tiny_config("qwen3")
    config.num_hidden_layers, config.layer_types = 6, ["full_attention"] * 6
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    q = model.model.layers[5].self_attn.q_proj
    pair = LowRank(2, 1.0, torch.ones(2, q.in_features), torch.ones(q.out_features, 2))
    adapter = Adapter("a", {"model.layers.5.self_attn.q_proj": pair}, "test")
    with adapter_slots(model, [adapter], 2) as slots, caplog.at_level(logging.INFO, logger=repeated.__name__):
        program, _ = export_decoder(model, SHAPES, decompositions=decomposition_table(), slots=slots)
    assert not [record for record in caplog.records if record.name == repeated.__name__]
    inputs = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind.name == "USER_INPUT"]
    assert inputs == ["tokens", "input_pos", "model_layers_5_self_attn_q_proj_lora_a", "model_layers_5_self_attn_q_proj_lora_b"]
