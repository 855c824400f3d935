"""A real trained model as a user meets it: exported by the package command, answering chat through TextLLMRunner.

The model is SmolLM2-135M-Instruct (the ``real_checkpoint`` fixture,
``tests/real_checkpoint.py``), exported by ``python -m coreai_partitioner
export-llm``: fp32 by a pip-installed checkout in a fresh venv outside it, in
the device form (``--target device``: what an iPhone runs, the prompt fed in
calls of the chunk) with ``--external-data`` and the two adapters trained on
made-up facts (the ``real_adapters`` fixture, ``tests/real_adapters.py``);
in the ``benchmark`` tier (``pytest -m benchmark``) int4 (blocks of 32) with
``--verify`` and fp16 with ``--verify`` (fp16 is software on this machine's
runtime, so CI keeps its fp16 tests tiny).  Each program's answer to a chat
message, in the checkpoint's chat template as ``--chat`` applies it and
through ExecuTorch's ``TextLLMRunner``, is Hugging Face ``generate``'s in the
same dtype (fp32, fp16), PEFT's own with that adapter active and unmerged, or
keeps the fact (int4).  ``text_generation.check`` passes the fp32 and fp16 ``.pte``
against the model at their dtype and fails them against its broken twins
(``llm_helpers.TWINS``, and two middle layers swapped at fp32); the
quantization schemes' twins are ``tests/test_real_quantized.py``'s and
``tests/test_quantized_schemes.py``'s.

Cost, in CPU seconds of one core: the installed command with its adapters
240 (export 160, three chats 10), training the adapters 40, the rest (the
checkpoint, PEFT's answers, the references, the checks) 80; in the benchmark
tier the int4 command 120 and the fp16 command about 300 (coreai-core
computes fp16 in software on Linux, a 576 x 1536 linear at 0.04 GFLOP/s,
about 3.5 s a token of this model: export 40, ``--verify`` 80, the 37-token
chat prompt and 8 answer tokens 180), started before the module's first test
to run beside the others.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from requires import require

require("transformers", "hf")

from llm_helpers import TWINS, broken_twin, ci_sample  # noqa: E402
from real_adapters import ADAPTERS, BASE_ANSWER, base_answer, peft_answer  # noqa: E402
from real_adapters import NEW_TOKENS as ADAPTER_NEW_TOKENS  # noqa: E402
from real_adapters import QUESTION as ADAPTER_QUESTION  # noqa: E402

from coreai_partitioner import text_generation, verify  # noqa: E402

pytestmark = pytest.mark.slow

CHECKOUT = Path(__file__).resolve().parents[1]

#: Hugging Face's greedy answer is "The capital of Japan is Tokyo." and the end of turn in fp32 and fp16 alike,
#: every step's top two logits at least 0.97 apart (test_the_question_has_no_near_tie_...), so fp16's rounding
#: cannot pick another token.  "What is the capital of France?" is a near-tie in fp32 itself (0.09 apart).
QUESTION = "What is the capital of Japan?"
ANSWER = "The capital of Japan is Tokyo."
FACT = "Tokyo"
NEW_TOKENS = 8  # the answer through its end-of-turn token
#: The chat prompt is 37 tokens: one call of the runner (dynamic shapes), the answer within the context.
SHAPE_FLAGS = ("--max-context-len", "64", "--prefill-chunk", "48")
SHAPES = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=48)
DEVICE_SHAPES = text_generation.DecoderShapes(max_context_len=64, prefill_chunk=48, target="device")


# ---------------------------------------------------------------- the package command


@dataclass
class Command:
    """``python -m coreai_partitioner export-llm ... --out DIR/model.pte`` running in the background, its
    output in ``DIR/stdout`` and ``DIR/stderr``."""

    process: subprocess.Popen
    directory: Path

    @classmethod
    def start(cls, directory: Path, *args: str, python: str | os.PathLike = sys.executable, env=None) -> Command:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "stdout", "wb") as out, open(directory / "stderr", "wb") as err:
            process = subprocess.Popen(
                [str(python), "-m", "coreai_partitioner", "export-llm", *args, "--out", str(directory / "model.pte")],
                stdout=out, stderr=err, cwd=directory, env=env,
            )
        return cls(process, directory)

    @property
    def pte(self) -> Path:
        """The command writes the .pte under another name and gives it this one once verified."""
        return self.directory / "model.pte"

    def wait(self, timeout: float = 1800) -> subprocess.CompletedProcess:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        read = lambda name: (self.directory / name).read_text(errors="replace")  # noqa: E731
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, read("stdout"), read("stderr"))

    def stop(self) -> None:
        """End the command if it still runs (a test failed before waiting for it)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def wait_for_pte(self, timeout: float = 1800) -> Path:
        """The .pte as soon as it has its name (the command may go on to ``--chat``)."""
        deadline = time.monotonic() + timeout
        while not self.pte.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                done = self.wait(0)
                pytest.fail(f"export-llm wrote no .pte (exit {done.returncode}):\n{done.stderr[-3000:]}")
            time.sleep(1)
        return self.pte


def chat_flags(checkpoint: Path, *flags: str, question: str = QUESTION, new_tokens: int = NEW_TOKENS) -> tuple[str, ...]:
    return ("--checkpoint", str(checkpoint), *SHAPE_FLAGS, "--chat", question, "--new-tokens", str(new_tokens), *flags)


def chat_answer(stdout: str) -> str:
    """The answer ``--chat`` printed (``chat: 'message' -> answer``)."""
    (answer,) = re.findall(r"^chat: .* -> (.*)$", stdout, flags=re.MULTILINE)
    return answer


@pytest.fixture(scope="module")
def fp16_command(real_checkpoint, tmp_path_factory):
    command = Command.start(
        tmp_path_factory.mktemp("fp16"), *chat_flags(real_checkpoint, "--dtype", "fp16", "--verify", "--external-data")
    )
    yield command
    command.stop()


@pytest.fixture(scope="module")
def int4_command(real_checkpoint, tmp_path_factory):
    command = Command.start(tmp_path_factory.mktemp("int4"), *chat_flags(real_checkpoint, "--quantize", "int4", "--verify"))
    yield command
    command.stop()


@pytest.fixture(scope="module", autouse=True)
def _commands_start_first(request) -> None:
    """The fp16 and int4 commands start before the module's first test, when a test here needs them, and run
    beside the others (fp16's alone takes about five minutes of one core)."""
    here = [item for item in request.session.items if item.module is request.module]
    for precision in ("fp16", "int4"):
        fixture = f"{precision}_command"
        if any(fixture in item.fixturenames or precision_of(item) == precision for item in here):
            request.getfixturevalue(fixture)


def precision_of(item) -> str | None:
    return item.callspec.params.get("precision") if hasattr(item, "callspec") else None


DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
#: CI's sample of the precisions text_generation.check judges here; fp16's row is the benchmark tier's.
IN_CI = ("fp32",)


@pytest.fixture(scope="module")
def hf_answers(real_checkpoint):
    """Per dtype, on first use, Hugging Face ``generate``'s greedy answer to QUESTION (up to the end of turn) and
    each step's gap between its top two logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    done: dict[str, tuple[str, list[float]]] = {}

    def answer(name: str) -> tuple[str, list[float]]:
        if name not in done:
            tokenizer = AutoTokenizer.from_pretrained(real_checkpoint)
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            model = AutoModelForCausalLM.from_pretrained(real_checkpoint, dtype=DTYPES[name]).eval()
            with torch.no_grad():
                out = model.generate(
                    ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, ids.shape[1] :].tolist()
            eos = model.generation_config.eos_token_id
            text = tokenizer.decode(new[: new.index(eos)] if eos in new else new).strip()
            done[name] = (text, [float(v[0] - v[1]) for v in (s[0].float().topk(2).values for s in out.scores)])
        return done[name]

    return answer


@pytest.mark.benchmark  # what the fp16 and int4 commands' answers rest on
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_question_has_no_near_tie_in_hf_greedy_answers(dtype, hf_answers):
    answer, gaps = hf_answers(dtype)
    assert answer == ANSWER, dtype
    assert min(gaps) > 0.5, (dtype, gaps)


# ---------------------------------------------------------------- fp32 with two adapters, by a pip-installed checkout outside it


@dataclass
class Installed:
    """A venv outside the checkout with the checkout pip-installed into it (not editable), and its export-llm run:
    the device form with ``--external-data`` and the two trained adapters, each program asked ADAPTER_QUESTION."""

    python: Path
    site_packages: Path
    cache: Path
    command: Command
    done: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def installed(real_checkpoint, real_adapters, tmp_path_factory) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    source = root / "checkout"  # pip builds in the source tree (build/, *.egg-info): a copy keeps the checkout clean
    shutil.copytree(CHECKOUT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pte", ".pytest_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    site_packages = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    # Its dependencies (torch, executorch, coreai-torch, transformers; pip and setuptools to install with) are this
    # venv's, on its path after its own site-packages: nothing is downloaded.
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site_packages / "dependencies-of-the-test-venv.pth").write_text("\n".join(ours) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(source)],
        cwd=root, env=env, capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-3000:]
    shutil.rmtree(source)  # nothing can be imported from the copy either
    env["COREAI_PARTITIONER_CACHE"] = str(root / "cache")  # empty: the host backend is compiled from what shipped
    flags = chat_flags(  # no verify method: three programs lowered, not six (the real model's verify: test_speculative_real)
        real_checkpoint, "--target", "device", "--external-data", "--verify-len", "0",
        *(f"--adapter={name}={path}" for name, path in real_adapters.items()),
        question=ADAPTER_QUESTION, new_tokens=ADAPTER_NEW_TOKENS,
    )
    command = Command.start(root / "run", *flags, python=python, env=env)
    return Installed(python, site_packages, root / "cache", command, command.wait())


def test_a_pip_installed_checkout_runs_from_its_site_packages_and_ships_the_host_backends_sources(installed):
    where = subprocess.run(  # from where the command ran, outside the checkout
        [str(installed.python), "-c", "import coreai_partitioner; print(coreai_partitioner.__file__)"],
        capture_output=True, text=True, cwd=installed.command.directory)
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip()).is_relative_to(installed.site_packages), where.stdout
    package = installed.site_packages / "coreai_partitioner"
    assert {p.name for p in package.rglob("*.cpp")} == {"CoreAIHostBackend.cpp"}
    assert {"Manifest.h", "coreai_host_abi.h"} <= {p.name for p in package.rglob("*.h")}
    assert (installed.python.parent / "coreai-export-llm").is_file()  # the console script
    assert len(list(installed.cache.glob("libcoreai_host_*.so"))) == 1  # built on first use, from those sources


def test_a_pip_installed_checkout_exports_the_real_model_in_the_device_form_and_each_adapter_answers_as_peft_does(
    installed, real_checkpoint, real_adapters
):
    from coreai_partitioner.adapters.config import read_adapter
    from test_llm_device import assert_device_contract
    from transformers import AutoConfig

    done = installed.done
    assert done.returncode == 0, done.stderr[-3000:]
    # The programs and the one data file; beside them the checkpoint's tokenizer files, copied as they are.
    written = {p.name for p in installed.command.directory.iterdir()}
    programs = {"model", *real_adapters}
    assert {name for name in written if name.endswith((".pte", ".ptd"))} == {
        "model.ptd", *(f"{name}.pte" for name in programs)
    }, done.stdout
    assert "tokenizer.json" in written, done.stdout
    data = installed.command.directory / "model.ptd"
    for name in programs:  # what upstream's on-device runtime takes, each .pte with the one data file
        program = verify.PteWithData(installed.command.directory / f"{name}.pte", data)
        assert_device_contract(program, chunk=DEVICE_SHAPES.prefill_chunk)

    # Through TextLLMRunner with model.ptd as its data_path: the base gives Hugging Face's answer, each adapter
    # PEFT's with it active and unmerged, each its own made-up fact; so each program runs its own pairs.
    answers = dict(re.findall(r"^chat\[(\w+)\]: .* -> (.*)$", done.stdout, flags=re.MULTILINE))
    expected = {"model": base_answer(real_checkpoint).text}
    expected.update({name: peft_answer(real_checkpoint, path).text for name, path in real_adapters.items()})
    assert answers == expected, done.stdout
    assert expected == {"model": BASE_ANSWER, **{name: adapter.answer for name, adapter in ADAPTERS.items()}}

    # Disk: the .ptd at most 1.02x the base weights, the base .pte (graph, metadata, rank-1 zero pairs) at most 2% of
    # them, each adapter's .pte at most 1.1x its pairs plus 64 kB.
    weights = int(re.search(r"weights ([\d,]+) bytes", done.stdout).group(1).replace(",", ""))
    assert data.stat().st_size <= 1.02 * weights
    assert installed.command.pte.stat().st_size <= 0.02 * weights, done.stdout
    config = AutoConfig.from_pretrained(real_checkpoint)
    for name, path in real_adapters.items():
        adapter = read_adapter(name, path, config)
        assert (installed.command.directory / f"{name}.pte").stat().st_size <= 1.1 * adapter.nbytes + 64_000


# ---------------------------------------------------------------- int4


@pytest.mark.benchmark
def test_the_int4_export_passes_verify_against_its_quantized_eager_model_and_answers_the_chat_with_the_fact(int4_command):
    done = int4_command.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "against the quantized eager model (fp32 + int4) (the check)" in done.stdout and "\nok\n" in done.stdout, done.stdout
    assert re.search(rf"\b{FACT}\b", chat_answer(done.stdout)), done.stdout


# ---------------------------------------------------------------- text_generation.check tells the model from its broken twins


#: precision -> (dtype of its .pte, the broken twins text_generation.check must tell from the model there).  Two middle layers
#: swapped are caught at fp32; at fp16 the least SNR the runtime's rounding allows 30 layers at width 1536 (9.4 dB)
#: lets them pass (docs/verify-and-runtime.md).
PRECISIONS = {
    "fp32": (torch.float32, (*TWINS, "layers 14 and 15 swapped")),
    "fp16": (torch.float16, TWINS),
}


def load(checkpoint: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation="eager").eval()


def twin_of(model: torch.nn.Module, twin: str) -> torch.nn.Module:
    return broken_twin(model, "layers swapped", swap=(14, 15)) if twin == "layers 14 and 15 swapped" else broken_twin(model, twin)


@pytest.fixture(scope="module")
def references(real_checkpoint):
    """Per precision, on first use, the fp32 model's reference and the eager logits over its tokens of the model
    at that precision (``"model"``) and of each broken twin of it.

    The tokens are export-llm --verify's: a random 8-token prompt and the model's 8 greedy tokens.  fp16 takes
    the prompt's call alone (software fp16: 3.5 s of one core a token).
    """
    found: dict[str, tuple[text_generation.Reference, dict[str, torch.Tensor]]] = {}

    def of(precision: str) -> tuple[text_generation.Reference, dict[str, torch.Tensor]]:
        if precision not in found:
            dtype, twins = PRECISIONS[precision]
            fp32 = load(real_checkpoint, torch.float32)
            reference = text_generation.check.reference(fp32, SHAPES, new_tokens=8 if precision == "fp32" else 1)
            model = fp32 if dtype == torch.float32 else load(real_checkpoint, dtype)
            eager = {"model": text_generation.check.eager_logits(model, reference, SHAPES)}
            for twin in twins:
                eager[twin] = text_generation.check.eager_logits(twin_of(model, twin), reference, SHAPES)
            found[precision] = (reference, eager)
        return found[precision]

    return of


@pytest.fixture(scope="module")
def program_logits(request, references):
    """Per precision, its .pte's logits over the reference's tokens, run once: fp32's .pte is the installed
    command's (the device form), fp16's the fp16 command's (as soon as verified, while it goes on to the chat)."""
    done: dict[str, torch.Tensor] = {}

    def logits(precision: str) -> torch.Tensor:
        if precision not in done:
            if precision == "fp32":
                pte, shapes = request.getfixturevalue("installed").command.pte, DEVICE_SHAPES
            else:
                pte, shapes = request.getfixturevalue(f"{precision}_command").wait_for_pte(), SHAPES
            done[precision] = text_generation.check.program_logits(pte, references(precision)[0], shapes)
            verify.reset_state(pte)  # the loaded program goes with its state
        return done[precision]

    return logits


@pytest.mark.parametrize("precision", ci_sample(list(PRECISIONS), IN_CI))
def test_llm_check_passes_the_real_models_pte_and_fails_it_against_its_broken_twins(precision, program_logits, references):
    dtype, twins = PRECISIONS[precision]
    reference, eager = references(precision)
    logits = program_logits(precision)
    report = text_generation.check.judge(logits, reference, eager=eager["model"], dtype=dtype)
    assert report.ok, report
    for twin in twins:
        report = text_generation.check.judge(logits, reference, eager=eager[twin], dtype=dtype)
        row = report.signal.outputs[0]
        assert not report.ok and row.snr < row.threshold.snr, (twin, str(report))


# ---------------------------------------------------------------- fp16, what a device ships (the benchmark tier)


@pytest.mark.benchmark
def test_a_real_fp16_export_with_verify_and_external_data_passes_and_answers_as_hf_fp16_does(fp16_command, hf_answers):
    done = fp16_command.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tolerance of the runtime's fp16 arithmetic" in done.stdout and "\nok\n" in done.stdout, done.stdout
    assert f"wrote {fp16_command.pte} and model.ptd, tokenizer.json" in done.stdout and fp16_command.pte.is_file()
    assert chat_answer(done.stdout) == hf_answers("fp16")[0] == ANSWER, done.stdout
    # --external-data: the weights are in model.ptd; the .pte keeps the graph, at most 2% of the weights' bytes.
    weights = int(re.search(r"weights ([\d,]+) bytes", done.stdout).group(1).replace(",", ""))
    assert fp16_command.pte.stat().st_size <= 0.02 * weights, done.stdout
