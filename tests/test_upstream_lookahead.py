"""ExecuTorch's own lookahead decoder drives our ``.pte``: ``StaticAttentionIOManager.lookahead_decode`` (the
executorch wheel's ``examples/models/llama/static_attention.py``) over our ``verify`` method gives greedy's tokens.

``lookahead_decode`` calls ``model(tokens [1, input_len], options)`` once a
step: the current token, a lookahead window of ``window_size`` (W) columns
and ``n_verifications`` (G) n-gram branches, told apart by a tree mask and
per-row RoPE positions in ``options``; the model hands back new keys and
values and the manager commits the rows it accepts.  Our ``verify`` takes
tokens at consecutive positions, attends causally by position and commits
every row into the program's own caches (rollback by position).  The two
meet where the tree is one chain, W = 0 and G = 1: row 0 is the current
token at the manager's position, rows 1..N-1 one cached n-gram after it.
Then one ``verify`` call at ``manager.pos`` answers a step, and the manager
needs no keys or values back (empty updates: it advances ``pos`` only).  Any
other tree is refused by that adapter, naming what a causal layout cannot
serve (docs/speculative.md, "ExecuTorch's lookahead decoder").

A wider tree (W > 0, G > 1) is served by a harness, not a way to run it: one
``verify`` call per branch of the tree (:class:`BranchVerify`), the same
greedy tokens at W + G calls a step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import pytest
import torch
from llm_helpers import prompt_tokens, tiny

from coreai_partitioner import save_pte, text_generation
from coreai_partitioner.text_generation.speculative import Target, speculative_decode

NGRAM = 5  # the current token and 4 drafts a step, within verify's 9 rows
NEW_TOKENS = 24
SHAPES = dict(max_context_len=64, prefill_chunk=8, verify_len=9)


def manager_for(config, input_len: int, max_context_len: int):
    """ExecuTorch's ``StaticAttentionIOManager`` for a transformers llama ``config``'s shapes, as its own
    ``test_lookahead_decode`` builds one from a ``ModelArgs``: full logits, a cache of the context less one input."""
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.examples.models.llama.static_attention import StaticAttentionIOManager

    args = ModelArgs(
        dim=config.hidden_size,
        hidden_dim=config.intermediate_size,
        n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        n_layers=config.num_hidden_layers,
        vocab_size=config.vocab_size,
        norm_eps=config.rms_norm_eps,
        rope_theta=config.rope_parameters["rope_theta"],
        use_hf_rope=True,
        max_seq_len=max_context_len,
        max_context_len=max_context_len,
        generate_full_logits=True,
    )
    return StaticAttentionIOManager(args, input_len, max_context_len - input_len)


def seeded_ngram_caches(tokens: Sequence[int], ngram: int, size: int):
    """``lookahead_decode``'s n-gram caches holding every ``ngram`` of ``tokens``, as ``run_lookahead.py
    --ngrams_seed`` fills them."""
    from executorch.examples.models.llama.static_attention import StaticAttentionIOManager

    caches = defaultdict(lambda: StaticAttentionIOManager.NGramCache(size))
    for i in range(len(tokens) - ngram + 1):
        caches[tokens[i]].add(list(tokens[i + 1 : i + ngram]))
    return caches


def branches(manager, options: dict) -> list[list[int]]:
    """Each input row's chain (the rows it attends, itself last, in position order) where the mask lets the row see
    itself, ``[]`` for padding; raises where a chain is not one row a position from ``manager.pos`` (RoPE rows) or
    not a tree's (a row's chain ends in its parent's)."""
    ((cache_len, mask),) = options["masks"].items()  # one cache length: every layer global
    sees = mask[0, :, cache_len:] == 0
    position = manager.pos
    chains = [sees[row].nonzero().flatten().tolist() if sees[row, row] else [] for row in range(len(sees))]
    for chain in chains:
        if chain and not torch.equal(
            options["freqs_cos_override"][chain], manager.freqs_cos[position : position + len(chain)]
        ):
            raise ValueError(f"rows {chain} of lookahead_decode's call are not at positions {position} on")
        if any(chains[row] != chain[: depth + 1] for depth, row in enumerate(chain)):
            raise ValueError(f"rows {chain} of lookahead_decode's call are not a branch of one tree")
    return chains


class ChainVerify:
    """``lookahead_decode``'s ``model`` answered by one ``verify(tokens, input_pos)`` call a step at the manager's
    position.

    ``verify`` is ``(tokens [1, V], input_pos [V]) -> logits [1, V, vocab]``
    with ``V`` the manager's ``input_len``.  The call must be one chain: the
    rows the mask lets see themselves are ``0..L-1``, each seeing every row
    before it and no other (W = 0, G = 1); its RoPE rows are the manager's
    positions ``pos..pos+L-1``.  Rows past the chain are padding the manager
    never reads: their logits are NaN, not the causal rows ``verify`` computed
    there.  The caches are the program's, written at every row and rolled
    back by position, so the manager is handed no keys or values: empty
    updates, which advance its ``pos`` by the rows it accepts.
    """

    def __init__(self, manager, verify: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.manager = manager
        self.verify = verify
        self.positions: list[int] = []  # the manager's position at each call

    def chain_length(self, options: dict) -> int:
        """The rows of the call's one chain; raises where the mask is a tree a causal-by-position call cannot serve."""
        chains = [chain for chain in branches(self.manager, options) if chain]
        if chains != [list(range(row + 1)) for row in range(len(chains))]:
            raise ValueError(
                "lookahead_decode asked for a tree, not one chain (window_size > 0 or n_verifications > 1): its "
                "tokens share positions across branches and hide lower positions from higher ones, which a "
                "verify call attending causally by position cannot serve; use window_size=0, n_verifications=1"
            )
        return len(chains)

    def __call__(self, tokens: torch.Tensor, options: dict) -> tuple[torch.Tensor, dict]:
        length = self.chain_length(options)
        position = self.manager.pos
        logits = self.verify(tokens.long(), torch.arange(position, position + tokens.shape[1])).clone()
        logits[:, length:] = torch.nan
        self.positions.append(position)
        return logits, {"out_cache_state": ({}, {})}


class BranchVerify:
    """``lookahead_decode``'s ``model`` for any window and branches (W > 0, G > 1): one ``verify`` call for each
    branch of its tree, a test harness, not a way to run it (W + G calls a step, where the tree wants one).

    A branch (a row no other row descends from) is one token a position,
    which a causal ``verify`` serves: its rows' logits are the tree's.  Every
    call writes its rows into the program's caches, so after a step the rows
    past the manager's first position hold whichever branch ran last; the
    next step's calls put the accepted tokens the caches do not hold in front
    (``held``: what each position was last written with).  The accepted
    tokens are read off the last call's rows: greedy's, branch by branch.
    Branches whose tokens one already run begins with share its call.
    """

    def __init__(
        self, manager, verify: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], length: int, context: Sequence[int]
    ) -> None:
        self.manager = manager
        self.verify = verify
        self.length = length  # verify's V
        self.context = list(context)  # the tokens at every position before the manager's
        self.held = list(context)  # the token each position of the program's caches was last written with
        self.positions: list[int] = []  # the manager's position at each step
        self.calls = 0
        self.guesses: dict[tuple[int, ...], int] = {}  # the last step's argmax, by its rows' chains of tokens

    def __call__(self, tokens: torch.Tensor, options: dict) -> tuple[torch.Tensor, dict]:
        position = self.manager.pos
        if self.positions:
            start = self.positions[-1]
            while len(self.context) < position:  # the accepted tokens: the last step's first, then greedy's
                chain = tuple(self.context[start:])
                self.context.append(self.guesses[chain] if chain else self.first)
        assert len(self.context) == position
        x = tokens[0].tolist()
        chains = branches(self.manager, options)
        leaves = [chain for chain in chains if chain and not any(chain[-1] in other[:-1] for other in chains)]
        runs: dict[tuple[int, ...], torch.Tensor] = {}
        for leaf in sorted(leaves, key=len, reverse=True):
            branch = tuple(x[row] for row in leaf)
            if not any(run[: len(branch)] == branch for run in runs):
                runs[branch] = self.run(branch)
        logits = torch.full((1, len(x), runs[next(iter(runs))].shape[-1]), torch.nan)
        self.guesses = {}
        for row, chain in enumerate(chains):
            if chain:
                branch = tuple(x[r] for r in chain)
                run = next(run for run in runs if run[: len(branch)] == branch)
                logits[0, row] = runs[run][len(branch) - 1]
                self.guesses[branch] = int(logits[0, row].argmax())
        self.positions.append(position)
        self.first = x[0]
        return logits, {"out_cache_state": ({}, {})}

    def run(self, branch: tuple[int, ...]) -> torch.Tensor:
        """``branch``'s rows of logits, from one ``verify`` call at the first position the caches do not hold right."""
        valid = 0
        while valid < len(self.context) and valid < len(self.held) and self.held[valid] == self.context[valid]:
            valid += 1
        tokens = self.context[valid:] + list(branch)
        if len(tokens) > self.length:
            raise ValueError(f"{len(tokens)} tokens for a verify call of {self.length}: a smaller window or n-gram")
        padded = tokens + [tokens[-1]] * (self.length - len(tokens))
        logits = self.verify(torch.tensor([padded]), torch.arange(valid, valid + self.length))
        self.calls += 1
        self.held = self.context[:valid] + padded
        return logits[0, len(tokens) - len(branch) : len(tokens)]


@pytest.fixture(scope="module", params=["host", "device"])
def lowered_llama(request, tmp_path_factory):
    """A tiny 2-layer llama lowered in the ``request.param`` form with its ``verify`` method, and the model."""
    model = tiny("llama")
    shapes = text_generation.DecoderShapes(**SHAPES, target=request.param)
    path = tmp_path_factory.mktemp(request.param) / "model.pte"
    save_pte(text_generation.lower_decoder(model, shapes), path)
    return path, model


@pytest.mark.slow
def test_executorchs_lookahead_decode_over_our_verify_gives_greedy_tokens_in_fewer_calls(lowered_llama):
    path, model = lowered_llama
    target = Target(path)
    prompt = prompt_tokens(8).tolist()[0]
    greedy = speculative_decode(target, prompt, NEW_TOKENS + NGRAM, None).tokens

    manager = manager_for(model.config, target.verify_len, target.shapes.max_context_len)
    adapter = ChainVerify(manager, lambda tokens, positions: target.run("verify", tokens, positions))
    # The prompt's and greedy's own n-grams, so that the branch matches where greedy's continuation is the cached one.
    caches = seeded_ngram_caches(prompt + greedy, NGRAM, 1)
    logits, _ = target.prefill(prompt)  # through forward; the manager only counts the positions
    manager.pos = len(prompt)
    tokens = manager.lookahead_decode(
        adapter, int(logits.argmax()), NEW_TOKENS, ngram_size=NGRAM, window_size=0, n_verifications=1,
        ngram_caches=caches,
    )

    assert len(tokens) > NEW_TOKENS
    assert tokens == greedy[: len(tokens)]
    assert manager.pos == len(prompt) + len(tokens) - 1  # every token but the last committed, one row each
    accepted = [after - before - 1 for before, after in zip(adapter.positions, adapter.positions[1:] + [manager.pos])]
    assert len(adapter.positions) < len(tokens) - 1, accepted  # fewer verify calls than tokens after the first
    assert max(accepted) == NGRAM - 1  # a whole cached n-gram accepted in one call


@pytest.mark.slow
def test_executorchs_lookahead_tree_over_one_verify_call_per_branch_gives_greedy_tokens(lowered_llama):
    path, model = lowered_llama
    target = Target(path)
    prompt = prompt_tokens(8).tolist()[0]
    ngram, window, verifications = 3, 2, 2
    greedy = speculative_decode(target, prompt, NEW_TOKENS + ngram, None).tokens

    manager = manager_for(model.config, (ngram - 1) * (window + verifications), target.shapes.max_context_len)
    verify = lambda tokens, positions: target.run("verify", tokens, positions)  # noqa: E731
    adapter = BranchVerify(manager, verify, target.verify_len, prompt)
    logits, _ = target.prefill(prompt)
    manager.pos = len(prompt)
    tokens = manager.lookahead_decode(
        adapter, int(logits.argmax()), NEW_TOKENS, ngram_size=ngram, window_size=window, n_verifications=verifications
    )

    assert len(tokens) > NEW_TOKENS
    assert tokens == greedy[: len(tokens)]
    steps = len(adapter.positions)
    assert manager.pos == len(prompt) + len(tokens) - 1
    assert steps < len(tokens) - 1  # the window's n-grams were accepted: fewer steps than tokens
    assert steps < adapter.calls <= steps * (window + verifications)  # but a call per branch, not one a step


def test_a_lookahead_tree_is_refused_before_any_verify_call():
    manager = manager_for(text_generation.tiny_config("llama"), input_len=9, max_context_len=64)

    def verify(tokens, positions):
        raise AssertionError("verify must not be called for a tree")

    with pytest.raises(ValueError, match="not one chain .* window_size=0, n_verifications=1"):
        manager.lookahead_decode(ChainVerify(manager, verify), 5, 4, ngram_size=3, window_size=2, n_verifications=2)
    manager.reset()
    with pytest.raises(ValueError, match="not one chain"):
        manager.lookahead_decode(ChainVerify(manager, verify), 5, 4, ngram_size=3, window_size=0, n_verifications=2)
