"""Speculative decoding: the ``verify`` method of every text-generation ``.pte`` and the drafters over it.

Every drafter must give greedy decoding's tokens exactly (the verify rule keeps
only the target's own argmax), through ExecuTorch's runtime, in the host form
(the caches the delegate's state, shared by ``forward`` and ``verify`` in one
loaded program) and the device form (the caches ExecuTorch's buffers, shared by
the methods; here filled with NaN first, as memory never written may hold).
The families' rows generate past a sliding window's ring and through recurrent
state, so acceptance crosses both: a ring that lost a slot to a rejected draft,
or a recurrent state that kept a rejected draft, gives other tokens.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from requires import require  # noqa: E402

require("transformers", "hf")

from llm_helpers import ci_sample, tiny  # noqa: E402

from coreai_partitioner import save_pte, text_generation  # noqa: E402
from coreai_partitioner.blocks import Attention  # noqa: E402
from coreai_partitioner.text_decoder.verify import verifying  # noqa: E402
from coreai_partitioner.text_generation.speculative import (  # noqa: E402
    DraftModel,
    Lookahead,
    PromptLookup,
    SpeculationError,
    Target,
    check_sampling,
    speculative_decode,
)

SHAPES = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=8, verify_len=9)
PROMPT = [5, 6, 7, 8, 9, 10, 5, 6]  # repeats itself: prompt lookup finds drafts
NEW_TOKENS = 48  # past the tiny configs' windows of 8 (and their rings of 8 + 8), in a context of 64


# ------------------------------------------------------------------ fast: the drafters and the contract


def test_prompt_lookup_proposes_what_transformers_prompt_lookup_proposes():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(0)
    for _ in range(300):
        context = [rng.randrange(6) for _ in range(rng.randrange(2, 40))]
        k = rng.randrange(1, 9)
        theirs = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=2, max_length=10_000)
        ids = torch.tensor([context])
        candidates, _ = theirs.get_candidates(ids)
        assert PromptLookup(max_ngram=2).propose(context, len(context), k) == candidates[0, len(context) :].tolist()


def test_prompt_lookup_stops_its_drafts_before_an_eos_token():
    assert PromptLookup(eos_ids={3}).propose([1, 2, 4, 3, 9, 1, 2], 7, 8) == [4]


def test_lookahead_drafts_from_its_ngram_pool_then_from_the_last_calls_guesses():
    drafter = Lookahead(ngram=3)
    drafter.start([1, 2, 3, 1, 2, 4])
    assert drafter.propose([1, 2, 4, 1], 4, 4) == [2, 4]  # 1 -> (2, 4) is the newest n-gram after 1; none after 4
    assert drafter.propose([1, 2, 4, 5], 4, 4) == [1, 2, 4]  # nothing after 5: the prompt's last n tokens (the seed)
    drafter.observe([1, 2, 4, 1, 7], [9, 9, 8, 6, 5], accepted=1)  # the guesses past the kept draft and the bonus
    assert drafter.propose([1, 2, 4, 1, 7], 5, 3) == [8, 6]  # the guesses' n-gram 7 -> (8, 6)
    assert drafter.propose([1, 2, 4, 1, 9], 5, 3) == [8, 6, 5]  # nothing after 9: the guesses themselves


def test_sampling_with_a_drafter_is_refused_naming_the_fix():
    with pytest.raises(SpeculationError, match="--temperature 0"):
        check_sampling(0.7, "prompt-lookup")
    check_sampling(0.7, None)
    check_sampling(0.0, "lookahead")


def test_the_export_command_writes_a_verify_method_where_one_fits_unless_told_not_to(capsys):
    from coreai_partitioner.cli.main import main

    for flags, said in (([], "verify(tokens [1, 9]"), (["--target", "device"], "verify(tokens [1, 9]"),
                        (["--shapes", "enumerated"], None), (["--verify-len", "0"], None), (["--verify-len", "5"], "verify(tokens [1, 5]")):
        assert main(["export", "--config", "llama", "--dry-run", *flags]) == 0
        out = capsys.readouterr().out
        assert (said in out) if said else ("verify(" not in out), (flags, out)


def test_verify_len_is_checked_when_the_shapes_are_made():
    assert text_generation.DecoderShapes(verify_len=None).verify_tokens == 9  # what export asks for
    assert text_generation.DecoderShapes(max_context_len=4, prefill_chunk=2, verify_len=None).verify_tokens == 4
    assert text_generation.DecoderShapes(mode="enumerated", verify_len=None).verify_tokens == 0
    assert text_generation.DecoderShapes().methods() == {"forward": None}  # the Python API's default: none
    assert text_generation.DecoderShapes(target="device", device_shapes="static", verify_len=None).methods() == {
        "forward": 1, "prefill": 32, "verify": 9
    }
    with pytest.raises(ValueError, match="verify_len 1"):
        text_generation.DecoderShapes(verify_len=1)
    with pytest.raises(ValueError, match="enumerated shapes"):
        text_generation.DecoderShapes(mode="enumerated", verify_len=4)


def test_the_runner_metadata_names_the_verify_call():
    metadata = text_generation.runner_metadata(tiny("llama"), SHAPES)
    assert (metadata["get_verify_len"], metadata["get_max_draft_len"]) == (9, 8)
    assert "get_verify_len" not in text_generation.runner_metadata(tiny("llama"), text_generation.DecoderShapes())


def test_a_sliding_ring_keeps_a_verify_calls_drafts_beyond_its_window():
    decoder = text_generation.adapt(tiny("mistral"), SHAPES)
    rings = {(m.window, m.ring, m.key_cache.shape[2]) for m in decoder.modules() if isinstance(m, Attention)}
    assert rings == {(8, 16, 16)}
    assert decoder.window_positions(8).shape == (16,)


class EagerTarget(Target):
    """A :class:`Target` over the eager decoder: the same calls, run in PyTorch (the rollback logic, fast)."""

    def __init__(self, decoder, shapes):
        self.pte, self.data_path, self.shapes, self.decoder = "eager", None, shapes, decoder
        text_generation.reset_state(decoder)

    def run(self, method, *inputs):
        with torch.no_grad(), (verifying(self.decoder) if method == "verify" else torch.no_grad()):
            return self.decoder(*inputs)


EAGER_IN_CI = ("mistral", "gemma3_text", "gemma4_text", "gpt_oss", "qwen3_5_text", "lfm2")  # rings, shared KV, recurrence


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ci_sample(sorted(text_generation.supported()), EAGER_IN_CI))
def test_every_drafter_keeps_greedys_tokens_on_each_familys_eager_decoder(model_type):
    """Every family's rollback, eagerly: rings and recurrent stashes, rejected drafts crossing both."""
    torch.manual_seed(0)
    model = tiny(model_type)
    target = EagerTarget(text_generation.adapt(model, SHAPES), SHAPES)
    greedy = speculative_decode(target, PROMPT, NEW_TOKENS, None, eos_ids=())
    for drafter in (PromptLookup(), Lookahead(), EagerDraft(greedy.tokens)):
        speculated = speculative_decode(target, PROMPT, NEW_TOKENS, drafter, eos_ids=())
        assert speculated.tokens == greedy.tokens, type(drafter).__name__
        assert speculated.target_calls <= greedy.target_calls
    assert max(speculated.accepted) >= 1  # the drafts were verified, some kept and some not
    assert min(speculated.accepted) < 8


class EagerDraft(PromptLookup):
    """Drafts greedy's own tokens with every third one wrong: acceptance stops at a known place each call."""

    def __init__(self, greedy):
        super().__init__()
        self.greedy = greedy

    def propose(self, context, position, k):
        done = len(context) - len(PROMPT)
        drafts = list(self.greedy[done : done + k])
        return [t if (done + i) % 3 else (t + 1) % 256 for i, t in enumerate(drafts)]


# ------------------------------------------------------------------ slow: through ExecuTorch's runtime


def exported(model_type: str, target: str, tmp_path) -> str:
    from test_llm_device import nan_initial_caches

    torch.manual_seed(0)
    shapes = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=8, target=target, verify_len=9)
    lowered = text_generation.lower_decoder(tiny(model_type), shapes)
    if target == "device":
        assert nan_initial_caches(lowered) > 0
    return str(save_pte(lowered, tmp_path / f"{model_type}_{target}.pte"))


@pytest.fixture(scope="module")
def llama_draft(tmp_path_factory) -> str:
    """A draft model of the tiny configs' vocabulary: tiny Llama's host form."""
    return exported("llama", "host", tmp_path_factory.mktemp("draft"))


FAMILIES = [
    ("llama", "host"), ("llama", "device"),
    ("mistral", "host"), ("mistral", "device"),  # every layer slides
    ("gemma3_text", "host"), ("gemma3_text", "device"),  # sliding and full layers
    ("qwen3_5_text", "host"), ("qwen3_5_text", "device"),  # gated delta and a short convolution
    ("lfm2", "host"), ("lfm2", "device"),  # short convolutions
    ("qwen3_next", "host"), ("qwen3_next", "device"),
    ("gemma4_text", "host"), ("gemma4_text", "device"),  # shared-KV layers
    ("gpt_oss", "host"), ("gpt_oss", "device"),  # attention sinks, sliding layers
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type, target",
    ci_sample(FAMILIES, [("mistral", "device"), ("qwen3_5_text", "host")], several_names=True),
)
def test_every_drafter_gives_greedys_tokens_through_executorchs_runtime(model_type, target, tmp_path, llama_draft):
    pte = exported(model_type, target, tmp_path)
    runtime = Target(pte)
    greedy = speculative_decode(runtime, PROMPT, NEW_TOKENS, None, eos_ids=())
    assert greedy.target_calls == NEW_TOKENS
    for drafter in (PromptLookup(), Lookahead(), DraftModel(llama_draft), EagerDraft(greedy.tokens)):
        speculated = speculative_decode(runtime, PROMPT, NEW_TOKENS, drafter, eos_ids=())
        assert speculated.tokens == greedy.tokens, type(drafter).__name__
        assert speculated.target_calls <= NEW_TOKENS
    assert speculated.target_calls < NEW_TOKENS / 2  # two in three drafts kept: rejections every call


@pytest.mark.slow
def test_generate_text_speculates_to_greedys_tokens_in_fewer_calls_and_writes_its_stats(tmp_path, llama_draft):
    from coreai_partitioner.cli.main import main

    pte = llama_draft
    text_generation.byte_tokenizer(tiny("llama").config).save(str(tmp_path / "tokenizer.json"))
    common = [pte, "--tokenizer", str(tmp_path / "tokenizer.json"), "--prompt", "abcabcabcabc", "--max-new-tokens", "30"]
    assert main(["generate-text", *common, "--stats-json", str(tmp_path / "greedy.json")]) == 0
    assert main(["generate-text", *common, "--speculate", "prompt-lookup", "--stats-json", str(tmp_path / "spec.json")]) == 0
    greedy, spec = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("greedy", "spec"))
    assert spec["tokens"] == greedy["tokens"] and len(greedy["tokens"]) == 30
    assert greedy["target_calls"] == 30 and greedy["accepted"] == []
    assert spec["target_calls"] < 30 and sum(spec["accepted"]) > 0
    assert main(["generate-text", *common, "--speculate", "lookahead", "--draft-len", "99"]) == 2  # above get_max_draft_len


@pytest.mark.slow
def test_forward_and_verify_share_one_state_in_a_loaded_program_and_two_loads_do_not(llama_draft):
    from coreai_partitioner.backends.apple_coreai.runtime import host

    pte = llama_draft
    first, second = host.load_program(pte), host.load_program(pte)
    prompt = torch.tensor([PROMPT])
    for program in (first, second):
        (logits,) = program.load_method("forward").execute([prompt, torch.arange(8)])
    token = int(logits[0, -1].argmax())
    rows = first.load_method("verify").execute([torch.tensor([[token] * 9]), torch.arange(8, 17)])[0]
    # The first program's verify read the prompt its forward wrote; the second program's forward state is its own.
    following = second.load_method("forward").execute([torch.tensor([[token]]), torch.tensor([8])])[0]
    assert torch.allclose(rows[0, 0], following[0, -1], atol=1e-4)
    empty = host.load_program(pte).load_method("verify").execute([torch.tensor([[token] * 9]), torch.arange(8, 17)])[0]
    assert not torch.allclose(empty[0, 0], rows[0, 0], atol=1e-3)  # a third load's verify: no prompt in its cache
