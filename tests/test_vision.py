"""Vision-language models (``coreai_partitioner.image_text_to_text``): one ``.pte`` that ExecuTorch's ``MultimodalRunner`` runs.

Each family's tiny random model (2 tower layers, 2 decoder layers; the
decoder widened so its weights are most of the ``.pte``) gets a prompt from
its own Hugging Face processor with an image in the middle (``ab<image>cd``;
Idefics3's processor cuts the image into four tiles and a global view).
Exported once per module, the ``.pte`` runs in ExecuTorch's own
``MultimodalRunner`` (the Python binding of the 1.5.1 wheel, Core AI
delegates on the host backend) and its greedy tokens are HF ``generate``'s.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter

import numpy as np
import pytest
import torch

from requires import require  # noqa: E402

require("transformers", "hf")

from llm_helpers import assert_hf_greedy, ci_sample, perturb_channels  # noqa: E402

from coreai_partitioner import text_generation, save_pte, verify, image_text_to_text  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402
from coreai_partitioner.image_text_to_text import check, run  # noqa: E402

SHAPES = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=16)
#: The device form: text_decoder's S (and token_embedding's n) bounded-dynamic up to 16, within Gemma 3's window.
DEVICE = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=16, target="device")
FORMS = {"host": SHAPES, "device": DEVICE}
NEW_TOKENS = 8
#: Where each family's processor takes the image in the prompt.
PLACEHOLDER = {"gemma3": "<start_of_image>", "idefics3": "<image>", "llava": "<image>"}
#: What the asset invokes: the tower's layer_norm and (non-causal) SDPA, the decoder's composites, Gemma 3's
#: projector's norm and pool.
COMPOSITES = {
    # tower: 2 layers x 2 LayerNorms + the final one, 2 SDPA; projector: a (1 + w) RMSNorm, the pool;
    # decoder: 2 layers x (4 norms + q/k norms) + the final norm, 2 SDPA, RoPE on q and k
    "gemma3": {"layer_norm": 5, "rms_norm": 14, "scaled_dot_product_attention": 4, "rope": 4, "avg_pool_2d": 1},
    # tower: 2 layers, the final LayerNorm; decoder: Llama's
    "idefics3": {"layer_norm": 5, "rms_norm": 5, "scaled_dot_product_attention": 4, "rope": 4},
    # tower: CLIP's pre-LayerNorm and the first layer only (features from the penultimate); decoder: Llama's
    "llava": {"layer_norm": 3, "rms_norm": 5, "scaled_dot_product_attention": 3, "rope": 4},
}


def tiny_vlm(model_type: str, dtype: torch.dtype = torch.float32):
    """The family's tiny random model, the decoder 256 wide, eager attention, every parameter random."""
    import transformers

    config = image_text_to_text.tiny_config(model_type)
    config.get_text_config().hidden_size = 256
    config.get_text_config().intermediate_size = 512
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.empty_like(parameter).uniform_(-0.5, 0.5))
    return model.to(dtype)


def prompt(model_type: str, processor):
    """The processor's inputs for ``ab<image>cd`` and a random 48x80 image."""
    image = (np.random.default_rng(0).random((48, 80, 3)) * 255).astype("uint8")
    return processor(text=f"ab{PLACEHOLDER[model_type]}cd", images=image, return_tensors="pt")


class Exported:
    """A family's tiny model, its processor's prompt, and its ``.pte`` in one form with the tokenizer beside it."""

    def __init__(self, model_type: str, form: str, directory) -> None:
        self.model_type, self.form, self.shapes = model_type, form, FORMS[form]
        self.model = tiny_vlm(model_type)
        self.processor = image_text_to_text.family_of(self.model.config).tiny_processor(self.model.config)
        self.processed = prompt(model_type, self.processor)
        self.vlm = image_text_to_text.adapt(self.model, self.shapes)
        self.segments = run.runner_inputs(self.processed, self.vlm.image_token_id, self.vlm.image_tokens)
        self.path = save_pte(image_text_to_text.lower_vlm(self.model, self.shapes, vlm=self.vlm), directory / "model.pte")
        self.tokenizer = directory / "tokenizer.json"
        self.processor.tokenizer.backend_tokenizer.save(str(self.tokenizer))

    @property
    def weights(self) -> int:
        return sum(p.numel() * p.element_size() for p in {id(p): p for p in self.model.parameters()}.values())

    def runner_tokens(self) -> list[int]:
        """ExecuTorch's MultimodalRunner on the .pte, its greedy pieces as token ids."""
        vocab = self.processor.tokenizer.get_vocab()
        return [vocab[piece] for piece in run.generate(self.path, self.tokenizer, self.segments, NEW_TOKENS)]


_EXPORTS: dict[tuple[str, str], Exported] = {}


def _exported(model_type: str, form: str, tmp_path_factory) -> Exported:
    """Each family's .pte in each form, exported once for every test that reads it."""
    if (model_type, form) not in _EXPORTS:
        _EXPORTS[model_type, form] = Exported(model_type, form, tmp_path_factory.mktemp(f"{model_type}-{form}"))
    return _EXPORTS[model_type, form]


#: CI's sample: every family's device form (the device contract's test reads them all) and llava's host form.
EXPORTS_IN_CI = [*((m, "device") for m in sorted(PLACEHOLDER)), ("llava", "host")]


@pytest.fixture(scope="module", params=ci_sample([(m, f) for m in sorted(PLACEHOLDER) for f in FORMS], EXPORTS_IN_CI), ids="-".join)
def exported(request, tmp_path_factory):
    return _exported(*request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=sorted(PLACEHOLDER))
def device_exported(request, tmp_path_factory):
    return _exported(request.param, "device", tmp_path_factory)


# ---------------------------------------------------------------- eager, no export


@pytest.mark.parametrize("model_type", sorted(PLACEHOLDER))
def test_each_familys_methods_fed_segment_by_segment_are_hf_eager(model_type):
    model = tiny_vlm(model_type)
    processed = prompt(model_type, image_text_to_text.family_of(model.config).tiny_processor(model.config))
    vlm = image_text_to_text.adapt(model, SHAPES)
    reference = check.reference(model, processed, vlm.image_token_id, vlm.image_tokens)
    report = check.check(vlm, reference)
    assert report.ok, report
    features, logits = check.program_outputs(vlm, reference)
    for got, expected in zip(features, reference.features):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, reference.logits, rtol=1e-4, atol=1e-5)
    assert run.greedy(vlm, reference.segments, NEW_TOKENS, eos_ids=[2]) == reference.tokens


@pytest.mark.parametrize("part", ["tower", "decoder"])
def test_verify_fails_the_methods_against_a_twin_with_one_perturbed_weight(part):
    """A conversion that gets one weight wrong: the right methods judged against a twin whose last tower (or
    decoder) layer's MLP output projection has each channel scaled in [0, 2] must fail the check."""
    model = tiny_vlm("idefics3")
    processed = prompt("idefics3", image_text_to_text.family_of(model.config).tiny_processor(model.config))
    vlm = image_text_to_text.adapt(model, SHAPES)
    twin = tiny_vlm("idefics3")
    weight = {"tower": "vision_model.encoder.layers.1.mlp.fc2.weight", "decoder": "text_model.layers.1.mlp.down_proj.weight"}
    perturb_channels(twin.model.get_parameter(weight[part]))
    report = check.check(vlm, check.reference(twin, processed, vlm.image_token_id, vlm.image_tokens))
    assert not report.logits.ok and report.features.ok is (part == "decoder"), report


def test_gemma3_image_tokens_attend_each_other_both_ways_as_hf_token_type_ids_make_them():
    model = tiny_vlm("gemma3")
    processed = prompt("gemma3", image_text_to_text.family_of(model.config).tiny_processor(model.config))
    vlm = image_text_to_text.adapt(model, SHAPES)
    segments = run.runner_inputs(processed, vlm.image_token_id, vlm.image_tokens)
    methods = run.Methods.of(vlm)
    position = 0
    for segment in segments:
        logits, position = run.prefill(methods, segment, position)
    causal = {k: v for k, v in processed.items() if k != "token_type_ids"}
    with torch.no_grad():
        both_ways, one_way = model(**processed).logits[0, -1], model(**causal).logits[0, -1]
    assert float((both_ways - one_way).abs().max()) > 1e-3  # the image's own attention matters here
    torch.testing.assert_close(logits.reshape(-1), both_ways, rtol=1e-4, atol=1e-5)
    # The flag rides on the embeddings: ones after an image's, zeros after text's.
    image = methods.call("vision_encoder", segments[1].pixels.unsqueeze(0))
    text = methods.call("token_embedding", torch.tensor([segments[0].tokens]))
    assert image.shape[-1] == text.shape[-1] == model.config.get_text_config().hidden_size + 1
    assert bool((image[..., -1] == 1).all()) and bool((text[..., -1] == 0).all())


def test_idefics3_tiles_are_a_runner_image_input_each_with_the_processors_text_between():
    model = tiny_vlm("idefics3")
    processor = image_text_to_text.family_of(model.config).tiny_processor(model.config)
    processed = prompt("idefics3", processor)
    segments = run.runner_inputs(processed, model.config.image_token_id, image_text_to_text.family_of(model.config).image_tokens(model.config))
    texts = [processor.tokenizer.decode(list(s.tokens)) for s in segments if not s.is_image]
    assert [s.is_image for s in segments] == [False, True] * 5 + [False]  # 2x2 tiles, then the global view
    assert texts == [
        "ab<fake_token_around_image><row_1_col_1>", "<fake_token_around_image><row_1_col_2>",
        "\n<fake_token_around_image><row_2_col_1>", "<fake_token_around_image><row_2_col_2>",
        "\n\n<fake_token_around_image><global-img>", "<fake_token_around_image>cd",
    ]
    tiles = [s.pixels for s in segments if s.is_image]
    for tile, pixels in zip(tiles, processed["pixel_values"][0]):
        assert torch.equal(tile, pixels)


# ---------------------------------------------------------------- refused before any export work


def test_a_checkpoint_without_a_vision_config_is_refused_naming_the_text_path():
    with pytest.raises(image_text_to_text.UnsupportedVisionModel, match=r"llama: the checkpoint has no vision_config.*export it as text generation"):
        image_text_to_text.check_config(text_generation.tiny_config("llama"), SHAPES)


def test_a_vision_model_no_family_adapts_is_refused_naming_the_families():
    from transformers import PaliGemmaConfig

    with pytest.raises(image_text_to_text.UnsupportedVisionModel, match=r"model_type 'paligemma': .*families: gemma3, idefics3, llava, smolvlm"):
        image_text_to_text.check_config(PaliGemmaConfig(), SHAPES)


def test_an_image_of_more_tokens_than_one_decoder_call_takes_is_refused_with_the_bound_to_give():
    config = image_text_to_text.tiny_config("llava")  # 16 image tokens
    with pytest.raises(image_text_to_text.ImageTokensOverBound, match=r"llava: one image is 16 embeddings.*at most 8 a call; export with --prefill-chunk 16 or more"):
        image_text_to_text.check_config(config, text_generation.DecoderShapes(max_context_len=64, prefill_chunk=8))


def test_an_image_of_the_wrong_size_is_refused_naming_the_size_the_encoder_takes():
    with pytest.raises(image_text_to_text.UnsupportedImage, match=r"shape \(3, 48, 32\): the vision encoder was exported for \[3, 32, 32\].*resize it to 32x32"):
        run.check_image(torch.zeros(3, 48, 32), (32, 32))
    run.check_image(torch.zeros(1, 3, 32, 32), (32, 32))


def test_a_gemma3_image_longer_than_its_sliding_window_is_refused_in_the_device_form_naming_the_vlm_commands_flags(tmp_path):
    from coreai_partitioner.text_decoder.device import UnsupportedDevice

    config = image_text_to_text.tiny_config("gemma3")  # an image of 4 tokens
    config.get_text_config().sliding_window = 3
    import transformers

    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()
    with pytest.raises(UnsupportedDevice, match=r"one image is 4 embeddings.*smallest sliding window \(3\).*no --prefill-chunk fits both: export it in the host form \(--target host\)"):
        image_text_to_text.adapt(model, text_generation.DecoderShapes(max_context_len=64, prefill_chunk=4, target="device"))
    image_text_to_text.adapt(model, text_generation.DecoderShapes(max_context_len=64, prefill_chunk=4))  # the host form takes it
    # The command refuses it from the config, before loading any weights, for every --prefill-chunk.
    (tmp_path / "gemma3").mkdir()
    config.save_pretrained(tmp_path / "gemma3")
    for extra in ([], ["--prefill-chunk", "4"]):
        status, _, err = export_command("--checkpoint", str(tmp_path / "gemma3"), "--target", "device", *extra, "--out", str(tmp_path / "m.pte"))
        assert status == 1 and "no --prefill-chunk fits both: export it in the host form (--target host)" in err, err
    status, _, err = export_command("--config", "gemma3", "--target", "device", "--prefill-chunk", "17", "--out", str(tmp_path / "m.pte"))
    assert status == 1 and "--prefill-chunk 17: " in err and "give --prefill-chunk 4 to 16" in err, err
    assert not (tmp_path / "m.pte").exists()


# ---------------------------------------------------------------- the .pte


@pytest.mark.slow
def test_multimodal_runner_on_the_pte_generates_hf_generates_greedy_tokens(exported):
    assert_hf_greedy(exported.runner_tokens(), exported.model, exported.processed, NEW_TOKENS)


@pytest.mark.slow
def test_the_ptes_methods_are_the_runners_each_a_function_of_one_asset_storing_the_weights_once(exported):
    pte = read_pte(exported.path)
    assert set(image_text_to_text.METHODS) <= set(pte.methods)
    assert {"get_max_seq_len", "get_max_context_len", "use_kv_cache", "get_eos_ids"} <= set(pte.methods)
    delegates = pte.coreai_delegates()
    assert sorted(d.method for d in delegates) == sorted(image_text_to_text.METHODS)  # one delegate per method
    assert {d.manifest["function"] for d in delegates} == set(image_text_to_text.METHODS)
    assert len({d.manifest["hash"] for d in delegates}) == 1
    assert pte.size <= 1.05 * exported.weights, (pte.size, exported.weights)


@pytest.mark.slow
def test_the_device_pte_keeps_the_stock_runtimes_contract_read_off_the_pte(device_exported):
    """Every delegate: CoreAIBackend, inline, its own function of the one asset, upstream's manifest rules, no state,
    fp16/fp32 tensors in the default dim order, the sequence dimension bounded by the chunk and nothing else dynamic."""
    from device_contract import device_delegate_arguments

    exported = device_exported
    assert {d.method for d in read_pte(exported.path).delegates} == set(image_text_to_text.METHODS)
    chunk, width = DEVICE.prefill_chunk, exported.vlm.width
    bounded = {
        "vision_encoder": set(),
        "token_embedding": {(1, chunk), (1, chunk, width)},
        "text_decoder": {(1, chunk, width), (chunk,)},  # embeddings and positions in, the caches' new rows out
    }
    for method, arguments in device_delegate_arguments(exported.path, image_text_to_text.METHODS).items():
        dynamic = {a.sizes for a in arguments if a.dynamism == "DYNAMIC_BOUND"}
        assert bounded[method] <= dynamic and all(chunk in sizes for sizes in dynamic), (method, dynamic)
    metadata = {name: verify.run(exported.path, method=name)[0] for name in ("get_max_seq_len", "enable_dynamic_shape")}
    assert metadata == {"get_max_seq_len": chunk, "enable_dynamic_shape": True}


@pytest.mark.slow
def test_the_asset_invokes_the_towers_and_the_decoders_composites(exported):
    (delegate, *_) = read_pte(exported.path).coreai_delegates()
    with tempfile.TemporaryDirectory() as directory:
        summary = summarize_ir(asset_ir(delegate.asset_path(directory)))
    assert summary.composites() == Counter(COMPOSITES[exported.model_type])  # each function's, once
    attention = [g for g in summary.graphs if g.composite == "scaled_dot_product_attention"]
    tower = [g for g in attention if g.name.startswith("vision_encoder__")]
    assert tower and all("is_causal = false" in g.composite_attrs for g in tower)


# ---------------------------------------------------------------- the command


def export_command(*argv: str) -> tuple[int, str, str]:
    """``python -m coreai_partitioner export ARGV`` in this process: exit status, standard output, standard error."""
    import contextlib
    import io

    from coreai_partitioner.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(["export", *argv])
        except SystemExit as exited:
            status = exited.code
    return status, out.getvalue(), err.getvalue()


def test_the_command_refuses_bad_input_before_any_export_work_and_leaves_nothing(tmp_path):
    text_only = tmp_path / "text-only"
    text_generation.tiny_config("llama").save_pretrained(text_only)
    out = tmp_path / "out" / "model.pte"
    status, _, err = export_command("--task", "image-text-to-text", "--checkpoint", str(text_only), "--out", str(out))
    assert status == 1 and "llama: the checkpoint has no vision_config" in err and "export it as text generation" in err

    status, _, err = export_command("--config", "llava", "--max-seq-len", "8", "--out", str(out))
    assert status == 1 and "one image is 16 embeddings" in err and "--prefill-chunk 16 or more" in err

    torch.save(torch.zeros(3, 64, 64), tmp_path / "pixels.pt")
    status, _, err = export_command("--config", "llava", "--image", str(tmp_path / "pixels.pt"), "--verify", "--out", str(out))
    assert status == 1 and "shape (3, 64, 64): the vision encoder was exported for [3, 32, 32]" in err
    assert not out.parent.exists()


def test_the_command_routes_a_vision_checkpoint_to_the_vision_exporter_and_dry_runs_it(tmp_path):
    checkpoint = tmp_path / "gemma3"
    image_text_to_text.tiny_config("gemma3").save_pretrained(checkpoint)
    status, out, err = export_command("--checkpoint", str(checkpoint), "--no-tokenizer", "--dry-run", "--out", str(tmp_path / "m.pte"))
    assert status == 0, err
    assert "vision_encoder(pixels [1, 3, 32, 32]) -> [1, 4, D]" in out and "a gemma3_text decoder of 2 layer(s)" in out
    assert not (tmp_path / "m.pte").exists()


@pytest.mark.slow
def test_the_command_exports_the_device_form_in_fp16_quantized_verifies_it_and_writes_what_a_caller_needs_beside_it(tmp_path):
    out = tmp_path / "idefics3" / "model.pte"
    status, printed, err = export_command(
        "--config", "idefics3", "--target", "device", "--dtype", "fp16", "--quantize", "palettize4", "--verify",
        "--out", str(out),
    )
    assert status == 0, err[-3000:]
    assert "against the quantized eager model (fp16 + palettize4)" in printed and "the runtime's fp16 arithmetic" in printed
    assert "logits against the fp32 model (a report)" in printed and "3 Core AI delegate(s), 1 asset" in printed
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.pte", "preprocessor_config.json", "tokenizer.json"]
    preprocessor = json.loads((out.parent / "preprocessor_config.json").read_text())
    assert preprocessor["max_image_size"] == {"longest_edge": 32} and len(preprocessor["image_mean"]) == 3
    pte = read_pte(out)
    assert set(image_text_to_text.METHODS) <= set(pte.methods) and len({d.manifest["hash"] for d in pte.coreai_delegates()}) == 1
    assert {d.backend_id for d in pte.delegates} == {"CoreAIBackend"}


def test_a_scheme_applies_to_the_tower_where_its_shapes_fit_and_says_where_they_do_not():
    from coreai_partitioner.image_text_to_text.export import tower_kept_float

    vlm = image_text_to_text.adapt(tiny_vlm("llava"), SHAPES)
    table = "tower.embeddings.position_embedding"  # added whole to the patches, not looked up: float under every scheme
    with pytest.warns(UserWarning, match=r"llava: the int4 scheme cannot store 1 layer\(s\) of the vision tower and projector, kept float: tower.embeddings.conv"):
        assert tower_kept_float(vlm, "int4") == ["tower.embeddings.conv", table]  # a patch convolution over 3 channels
    assert tower_kept_float(vlm, "int8") == [table]


def test_the_vision_command_prints_its_help(capsys):
    from coreai_partitioner.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["export", "--task", "image-text-to-text", "--help"])
    assert exited.value.code == 0 and "MultimodalRunner" in capsys.readouterr().out


# ---------------------------------------------------------------- optimum-executorch


@pytest.mark.slow
def test_optimum_executorchs_multimodal_model_exports_with_the_coreai_recipe_and_generates_hf_greedy_tokens():
    """``ExecuTorchModelForMultiModalToText.from_pretrained(dir, recipe="coreai")`` on transformers 5.0.0rc1."""
    import subprocess
    import sys
    from pathlib import Path

    from test_transformers_rc1 import rc1_environment

    script = Path(__file__).parent / "rc1" / "optimum_vlm.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, env=rc1_environment())
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["transformers"] == "5.0.0rc1"
    assert {"vision_encoder", "token_embedding", "text_decoder", "modality", "vision_token_id", "get_eos_id"} <= set(result["methods"])
    assert result["optimum"] == result["hf"]
    # optimum prefills the whole prompt in one call, the image's rows written over its placeholders: the flag
    # channel comes with them, so the image attends itself both ways there too.
    assert result["prefill_error"] < 1e-5 < 1e-3 < result["causal_gap"]


def test_the_device_form_refuses_the_static_layout_and_a_call_longer_than_a_sliding_window(tmp_path):
    from coreai_partitioner.text_decoder.device import UnsupportedDevice

    static = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=16, target="device", device_shapes="static")
    with pytest.raises(text_generation.UnsupportedShapes, match="MultimodalRunner calls text_decoder with each segment's own length"):
        image_text_to_text.check_config(image_text_to_text.tiny_config("llava"), static)
    model = tiny_vlm("gemma3")  # sliding window 16, an image of 4 tokens
    with pytest.raises(UnsupportedDevice, match=r"--prefill-chunk 32 is longer than its smallest window \(16\); export with --prefill-chunk 16 or less"):
        image_text_to_text.lower_vlm(model, text_generation.DecoderShapes(max_context_len=64, prefill_chunk=32, target="device"))
    status, out, err = export_command("--config", "gemma3", "--target", "device", "--dry-run", "--out", str(tmp_path / "m.pte"))
    assert status == 0 and "S 1..16" in out, err  # the command bounds S by the window
