"""Per-phase time and peak RSS of the LLM export (text_generation.lower_decoder), or of coreai-torch's one-shot conversion.

    python benchmarks/memory_profile.py --layers 4                  # Qwen3-0.6B width, 4 layers, fp16
    python benchmarks/memory_profile.py --layers 28 --oneshot       # coreai-torch one shot, same model
    python benchmarks/memory_profile.py --checkpoint DIR --summary  # a local checkpoint; also time a .pte summary

The model is the Qwen3-0.6B shape (vocab 151,936, d 1024, 16 heads, 8 KV
heads, head_dim 128, intermediate 3072, tied embeddings) with random weights,
saved once under ``--cache-dir`` and loaded back with ``from_pretrained`` as a
user would (nothing is downloaded).  Peak RSS per phase is exact: it comes
from the kernel's high-water mark (``VmHWM``), reset at every phase boundary
through ``/proc/self/clear_refs``, not from sampling, so peaks inside C++ code
are seen.  Phases nest: functions inside torch.export, ExecuTorch, this plugin
and coreai-torch are wrapped, and repeated calls are merged (``xN``).
"extra/w" is peak RSS above the loaded model (weights paged in) from the export on, over the
weights.  Run one size per process; the machine is shared.
:func:`measure_export` is the measurement; ``benchmarks/llm.py`` runs it for
every row of its table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore")
GB = 1 << 30

QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
)
#: Qwen3-30B-A3B's layer shape (Qwen3-Coder-30B-A3B too): 128 experts of width 768, 8 active per token.
QWEN3_30B_A3B = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
    num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
    tie_word_embeddings=False, max_position_embeddings=40960,
)
#: Qwen3-14B's shape: 40 layers, d 5120, MLP 17408, 40 heads, 8 KV heads, vocab 151,936 untied (28 GB in bf16).
QWEN3_14B = dict(
    vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
    num_key_value_heads=8, head_dim=128, tie_word_embeddings=False, max_position_embeddings=40960,
    rope_theta=1000000.0, rms_norm_eps=1e-6,
)

#: (module, attribute, label): functions timed as nested phases when they exist.
PHASES = (
    ("coreai_partitioner.text_decoder.recompose", "adapt", "adapt the family"),
    ("coreai_partitioner.text_generation.export", "export_decoder", "export + externalize"),
    ("coreai_partitioner.quantize", "quantize", "quantize"),
    ("coreai_partitioner.quantize", "check_model", "check shapes"),
    ("coreai_partitioner.quantize", "store_weights", "store weights"),
    ("coreai_partitioner.quantize.store", "compress", "compress (k-means or integers)"),  # the name store calls
    ("coreai_partitioner.quantize.program_weights", "replace_weights", "replace weights"),
    ("coreai_partitioner.quantize", "_decomposed", "decompose"),
    ("coreai_partitioner.quantize", "quantize_with_coreai_opt", "coreai-opt"),
    ("coreai_opt.quantization:Quantizer", "prepare", "coreai-opt prepare"),
    ("coreai_opt.quantization:Quantizer", "finalize", "coreai-opt finalize"),
    ("executorch.exir", "to_edge_transform_and_lower", "to_edge_transform_and_lower"),
    ("coreai_partitioner.lowering.methods", "lower_methods", "lower_methods"),
    ("torch.export", "export", "torch.export"),
    ("coreai_partitioner._compat", "export_decomposed", "torch.export to decomposed ATen"),
    ("coreai_partitioner.lowering.passes:NarrowToCoreAIDtypes", "__call__", "narrow dtypes"),
    ("coreai_partitioner.lowering.whole_program", "to_backend", "to_backend"),
    ("torch.export.exported_program:ExportedProgram", "run_decompositions", "run_decompositions"),
    ("coreai_partitioner.records.subexport:SharedExports", "__call__", "sub-exports"),
    ("coreai_partitioner.records.subexport", "rebind", "rebind a shared export"),
    ("torch._export.verifier:Verifier", "check", "verifier"),
    ("executorch.exir.program._program", "_gen_edge_manager_for_partitioners", "to_edge"),
    ("executorch.exir.program._program:EdgeProgramManager", "transform", "transform passes"),
    ("executorch.exir.program._program:EdgeProgramManager", "to_backend", "to_backend"),
    ("executorch.exir.backend.backend_api", "get_fake_program", "fake program"),
    ("coreai_partitioner:CoreAIPartitioner", "partition", "partition"),
    ("executorch.exir.backend.backend_api", "_create_partitions", "create partitions"),
    ("executorch.exir.backend.backend_api", "lower_all_submodules_to_backend", "lower delegates"),
    ("coreai_partitioner.backends.apple_coreai.preprocess:CoreAICompositeBackend", "preprocess", "preprocess"),
    ("coreai_partitioner.backends.apple_coreai.preprocess", "convert", "convert (coreai-torch)"),
    ("coreai_torch.converter:TorchConverter", "_perform_externalization", "composite graphs"),
    ("coreai_torch.converter:TorchConverter", "_get_graph_op", "main graph"),
    ("coreai_partitioner.backends.apple_coreai.asset", "write_program", "serialize IR (coreai-core)"),
    ("coreai_partitioner.backends.apple_coreai.asset", "finish_asset", "hash asset"),
    ("coreai_partitioner.backends.apple_coreai.deliver", "deliver_inline", "deliver into named data"),
    ("coreai_partitioner._compat", "deliver", "deliver into named data"),
    ("executorch.exir.program._program", "emit_program", "emit"),
    ("executorch.exir.program._program", "serialize_for_executorch", "serialize"),
)


def _status() -> tuple[int, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


@dataclass
class Span:
    label: str
    depth: int
    start: float
    rss_before: int
    end: float = 0.0
    cpu: float = 0.0  # user + system seconds of every thread: what a busy shared machine does not inflate
    rss_after: int = 0
    peak: int = 0
    calls: int = 1
    children: dict = field(default_factory=dict)


class Profile:
    """Nested phases with time, RSS before/after and exact peak RSS."""

    def __init__(self) -> None:
        self.root = Span("", -1, 0.0, 0)
        self._stack = [self.root]
        self.peak = 0

    def _fold(self) -> int:
        rss, hwm = _status()
        for span in self._stack:
            span.peak = max(span.peak, hwm)
        self.peak = max(self.peak, hwm)
        Path("/proc/self/clear_refs").write_text("5")
        return rss

    def restart_peak(self) -> int:
        """Start :attr:`peak` again from the current RSS (returned): what came before is not counted."""
        self.peak = self._fold()
        return self.peak

    @contextlib.contextmanager
    def phase(self, label: str):
        rss = self._fold()
        parent = self._stack[-1]
        span = parent.children.get(label)
        if span is None:
            span = parent.children[label] = Span(label, parent.depth + 1, 0.0, rss, peak=rss, calls=0)
        span.calls += 1
        start, cpu = time.perf_counter(), time.process_time()
        self._stack.append(span)
        try:
            yield span
        finally:
            span.rss_after = self._fold()
            span.end += time.perf_counter() - start
            span.cpu += time.process_time() - cpu
            self._stack.pop()

    def wrap(self, where: str, attr: str, label: str) -> None:
        module_name, _, class_name = where.partition(":")
        try:
            owner = importlib.import_module(module_name)
            owner = getattr(owner, class_name) if class_name else owner
            raw = owner.__dict__[attr] if class_name else getattr(owner, attr)
        except (ImportError, AttributeError, KeyError):
            return  # not in this version
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        func = raw.__func__ if kind else raw

        @functools.wraps(func)
        def timed(*args, **kwargs):
            with self.phase(label):
                return func(*args, **kwargs)

        setattr(owner, attr, kind(timed) if kind else timed)

    def spans(self) -> list[Span]:
        """Every phase, depth first, in the order they first ran."""
        found: list[Span] = []

        def walk(span: Span) -> None:
            for child in span.children.values():
                found.append(child)
                walk(child)

        walk(self.root)
        return found

    def seconds(self, label: str) -> float:
        """Total seconds of every phase named ``label``, at any depth, not counting nested repeats twice."""
        total = 0.0

        def walk(span: Span) -> None:
            nonlocal total
            for child in span.children.values():
                if child.label == label:
                    total += child.end
                else:
                    walk(child)

        walk(self.root)
        return total

    def table(self, weights: int, baseline: int) -> str:
        rows = [("phase", "s", "cpu s", "RSS before GB", "RSS after GB", "peak GB", "extra/w")]
        for span in self.spans():
            label = "  " * span.depth + span.label + (f" x{span.calls}" if span.calls > 1 else "")
            rows.append((label, f"{span.end:.1f}", f"{span.cpu:.1f}", f"{span.rss_before / GB:.2f}", f"{span.rss_after / GB:.2f}",
                         f"{span.peak / GB:.2f}", f"{max(0, span.peak - baseline) / weights:.2f}x"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                 for row in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def make_checkpoint(layers: int, cache_dir: Path) -> Path:
    """The Qwen3-0.6B shape with ``layers`` layers, random fp16 weights, saved once."""
    import transformers

    return save_checkpoint(transformers.Qwen3Config(num_hidden_layers=layers, **QWEN3_06B),
                           cache_dir / f"qwen3-0.6b-shape-{layers}l-fp16")


def save_checkpoint(config: Any, path: Path) -> Path:
    """A checkpoint of ``config`` with random fp16 weights (seed 0) at ``path``, made once."""
    if (path / "config.json").exists():
        return path
    import torch
    import transformers

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float16).save_pretrained(path)
    return path


#: Shards of the checkpoints :func:`write_checkpoint` writes (Qwen3-14B's own are 8 of at most 4 GB): a file larger
#: than this machine's memory cannot be mapped whole (the kernel refuses the mapping), and safetensors maps it whole.
SHARD_BYTES = 4 * 1000**3


def write_checkpoint(config: Any, path: Path, dtype: Any, shard_bytes: int = SHARD_BYTES) -> Path:
    """A checkpoint of ``config`` with random ``dtype`` weights (seed 0) at ``path``, made once and a tensor at a time:
    a model larger than this machine's memory.  The files are ``save_pretrained(max_shard_size=shard_bytes)``'s:
    ``config.json``, ``generation_config.json``, safetensors shards ``model-0000k-of-0000n.safetensors`` and their
    ``model.safetensors.index.json`` (each shard written by :func:`write_safetensors`).  The values are the model's
    initialization (a Linear's or embedding's weight drawn from N(0, ``initializer_range``), a norm's ones, a bias
    zeros), not the very numbers ``from_config`` would draw.  Written into a sibling directory and renamed, so a
    stopped run leaves no checkpoint behind."""
    if (path / "config.json").exists():
        return path
    import json

    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    kinds = {f"{name}.{p}" if name else p: type(module) for name, module in model.named_modules()
             for p, _ in module.named_parameters(recurse=False)}
    generator = torch.Generator().manual_seed(0)

    def value(name: str, shape: torch.Size) -> torch.Tensor:
        if issubclass(kinds[name], (torch.nn.Linear, torch.nn.Embedding)) and name.endswith(".weight"):
            return torch.empty(shape).normal_(0, config.initializer_range, generator=generator).to(dtype)
        return (torch.ones if name.endswith(".weight") else torch.zeros)(shape, dtype=dtype)

    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}  # a tied weight under its first name
    shards: list[dict[str, torch.Size]] = [{}]
    for name, shape in shapes.items():  # save_pretrained's rule: a tensor starts a new shard when it would overflow
        if shards[-1] and sum(s.numel() for s in shards[-1].values()) * dtype.itemsize + shape.numel() * dtype.itemsize > shard_bytes:
            shards.append({})
        shards[-1][name] = shape
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    weight_map = {}
    for index, shard in enumerate(shards, 1):
        file = "model.safetensors" if len(shards) == 1 else f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(partial / file, shard, dtype, value)
        weight_map.update(dict.fromkeys(shard, file))
    if len(shards) > 1:
        count = sum(shape.numel() for shape in shapes.values())
        metadata = {"total_parameters": count, "total_size": count * dtype.itemsize}
        (partial / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
    model.config.architectures = [type(model).__name__]  # as save_pretrained records it
    model.config.save_pretrained(partial)
    model.generation_config.save_pretrained(partial)
    partial.rename(path)
    return path


def write_safetensors(file: Path, shapes: dict[str, Any], dtype: Any, value: Callable[[str, Any], Any]) -> None:
    """A safetensors file of one ``dtype``, each tensor ``value(name, shape)`` made and written in turn (the format:
    the header's length in 8 little-endian bytes, the JSON header padded with spaces to 8 bytes, then the data)."""
    import json
    import struct

    import torch

    code = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32"}[str(dtype)]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        size = shape.numel() * dtype.itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(file, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for name, shape in shapes.items():
            tensor = value(name, shape).contiguous()
            assert tensor.shape == shape and tensor.dtype == dtype, (name, tensor.shape, tensor.dtype)
            out.write(memoryview(tensor.view(-1).view(torch.uint8).numpy()))


def weight_bytes(model: Any) -> int:
    """Bytes of the model's parameters and buffers, a tied tensor counted once (a weight left in the checkpoint,
    ``checkpoints/lazy.py``'s, by its object: it has no data)."""
    from coreai_partitioner.checkpoints import is_streamed

    tensors = {id(t) if is_streamed(t) else t.data_ptr(): t for t in model.state_dict(keep_vars=True).values()}
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass
class Measurement:
    """What :func:`measure_export` saw: weights, RSS baseline and peak, output size, phases."""

    profile: Profile
    weights: int
    baseline: int
    output: Path
    size: int
    seconds: float  # model loaded -> file written
    cpu: float

    @property
    def extra_over_weights(self) -> float:
        return max(0, self.profile.peak - self.baseline) / self.weights

    def report(self, name: str, oneshot: bool) -> str:
        return (f"{name}: {self.weights / GB:.3f} GB of weights, {'coreai-torch one shot' if oneshot else 'plugin'}\n"
                f"RSS with the model loaded {self.baseline / GB:.2f} GB; peak {self.profile.peak / GB:.2f} GB; "
                f"extra peak {self.extra_over_weights:.2f}x the weights; output {self.size / GB:.3f} GB; "
                f"export {self.seconds:.1f} s ({self.cpu:.1f} s of CPU)\n\n{self.profile.table(self.weights, self.baseline)}")


def measure_export(
    load: Callable[[], Any],
    out: Path,
    *,
    max_context_len: int,
    prefill_chunk: int,
    oneshot: bool = False,
    full_logits: bool = False,
    target: str = "host",
    quantize: str | None = None,
    quantized_reference: list | None = None,
    profile: Profile | None = None,
) -> tuple[Any, Measurement]:
    """Load a model with ``load()`` and export it, each phase timed; returns ``(model, measurement)``.

    The plugin path is :func:`coreai_partitioner.text_generation.lower_decoder`, ``to_executorch``
    and ``write_to_file`` (what ``examples/export_llm.py`` does), dynamic ``T``
    up to ``prefill_chunk`` over a cache of ``max_context_len``; ``oneshot``
    is coreai-torch's ``TorchConverter`` with the same composites, ``to_coreai``
    and ``save_asset`` (``out`` with the ``.aimodel`` suffix).  ``full_logits``
    exports every position's logits instead of the last one's; ``target``
    ``"device"`` exports the device form (``prefill`` of ``prefill_chunk``
    tokens and ``forward`` of one, caches owned by ExecuTorch).  A list passed as ``quantized_reference`` receives
    the quantized program's eager module (``lower_decoder``'s).
    """
    profile = profile or Profile()
    with profile.phase("import"):
        import torch

        from coreai_partitioner import text_generation

        for where, attr, label in PHASES:
            profile.wrap(where, attr, label)
    shapes = text_generation.DecoderShapes(max_context_len=max_context_len, prefill_chunk=prefill_chunk, target=target)
    with profile.phase("load"):
        model = load()
    weights = weight_bytes(model)
    with profile.phase("page in weights"):  # safetensors are mmap'd: count them in the baseline
        from coreai_partitioner.checkpoints import is_streamed

        held = [t for t in model.state_dict(keep_vars=True).values() if not is_streamed(t)]  # a streamed weight is read at export
        for tensor in {t.data_ptr(): t for t in held}.values():
            float(tensor.reshape(-1).view(torch.uint8)[::4096].sum())
    baseline = profile.restart_peak()  # loading an fp16 checkpoint as fp32 peaks above it: not the export's
    out.parent.mkdir(parents=True, exist_ok=True)
    started, cpu = time.perf_counter(), time.process_time()
    if oneshot:
        out = _oneshot(model, shapes, out.with_suffix(".aimodel"), profile)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    else:
        lowered = text_generation.lower_decoder(model, shapes, full_logits=full_logits, quantize=quantize,
                                                quantized_reference=quantized_reference)
        with profile.phase("to_executorch"):
            executorch_program = lowered.to_executorch()
        with profile.phase("write_to_file"):
            with open(out, "wb") as file:
                executorch_program.write_to_file(file)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        with profile.phase("release"):
            del executorch_program, lowered
        size = out.stat().st_size
        return model, Measurement(profile, weights, baseline, out, size, seconds, cpu)
    return model, Measurement(profile, weights, baseline, out, size, time.perf_counter() - started,
                              time.process_time() - cpu)


def _oneshot(model: Any, shapes: Any, out: Path, profile: Profile) -> Path:
    import torch
    from coreai_torch import TorchConverter, get_decomp_table

    from coreai_partitioner import default_specs, text_generation

    # The same forward as the plugin's: T symbolic from 1 to the prefill chunk.
    tokens_dim = torch.export.Dim("T", min=1, max=shapes.prefill_chunk)
    sample = (torch.zeros(1, 2, dtype=torch.long), torch.arange(2))

    def export_fn(module):
        with torch.no_grad():
            program = torch.export.export(module, sample, dynamic_shapes=({1: tokens_dim}, {0: tokens_dim}))
            return program.run_decompositions(get_decomp_table())

    decoder = text_generation.adapt(model, shapes)
    with profile.phase("oneshot: export + externalize"):
        converter = TorchConverter().add_pytorch_module(decoder, export_fn=export_fn, externalize_modules=default_specs())
    with profile.phase("oneshot: to_coreai"):
        program = converter.to_coreai()
    with profile.phase("oneshot: save_asset"):
        shutil.rmtree(out, ignore_errors=True)
        program.save_asset(out)
    return out


def summarize(out: Path, profile: Profile) -> None:
    """Read the .pte back and summarize its assets' IR, as ``python -m coreai_partitioner inspect`` does."""
    from coreai_partitioner.backends.apple_coreai.runtime.asset_ir import asset_ir, summarize_ir
    from coreai_partitioner.backends.apple_coreai.runtime.pte import read_pte

    with profile.phase("summary"):
        with profile.phase("read_pte"):
            pte = read_pte(out)
        with tempfile.TemporaryDirectory() as directory:
            for delegate in pte.coreai_delegates():
                with profile.phase("write asset"):
                    path = delegate.asset_path(directory)
                with profile.phase("load + print IR (coreai-core)"):
                    ir = asset_ir(path)
                with profile.phase("summarize IR"):
                    summarize_ir(ir)
                del ir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--checkpoint", type=Path, help="a local HF checkpoint instead of the Qwen3-0.6B shape")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "coreai_memory_profile")
    parser.add_argument("--max-context-len", type=int, default=64)
    parser.add_argument("--prefill-chunk", type=int, default=32, help="most tokens per forward call (T)")
    parser.add_argument("--oneshot", action="store_true", help="coreai-torch's one-shot conversion instead")
    parser.add_argument("--quantize", help="a quantize= scheme of lower_decoder (coreai_partitioner.quantize.schemes.SCHEMES)")
    parser.add_argument("--summary", action="store_true", help="also read the .pte back and summarize its assets")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    started = time.perf_counter()
    checkpoint = args.checkpoint or make_checkpoint(args.layers, args.cache_dir)
    profile = Profile()

    def load():
        import torch
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float16, local_files_only=True).eval()

    out = args.out or Path(tempfile.gettempdir()) / f"memory_profile_{os.getpid()}.pte"
    _, measurement = measure_export(load, out, max_context_len=args.max_context_len,
                                    prefill_chunk=args.prefill_chunk, oneshot=args.oneshot, quantize=args.quantize,
                                    profile=profile)
    if args.summary and not args.oneshot:
        summarize(measurement.output, profile)
    print()
    print(measurement.report(checkpoint.name, args.oneshot))
    print(f"\nprocess {time.perf_counter() - started:.1f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
