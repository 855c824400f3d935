"""ExecuTorch's own ``TextLLMRunner`` on a ``.pte``, its text as whole characters.

ExecuTorch 1.5.1's Python binding hands each generated piece to
``token_callback`` as ``str``; a byte-level BPE piece that is part of a
multi-byte character is not valid UTF-8 alone, and the conversion raises
``UnicodeDecodeError`` inside the runner.  Without a callback the runner
writes each piece's raw bytes to standard output (file descriptor 1)
itself.  :func:`generate` runs it so, reads those bytes from a pipe and
passes on complete characters only (:class:`~.generate.TextPieces`); the
runner's own log lines (file descriptor 2) are kept apart and shown only on
an error, or to a ``log`` callback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from coreai_partitioner.console import NativeStreams
from coreai_partitioner.text_generation.generate import Generation, TextPieces

#: The runner ends its output with this line of timings.
_STATS_LINE = b"PyTorchObserver "


class _Output:
    """The runner's raw standard output: its pieces, up to the timings line."""

    def __init__(self, pieces: TextPieces) -> None:
        self._pieces = pieces
        self._held = b""
        self._done = False

    def feed(self, data: bytes) -> None:
        if self._done:
            return
        data = self._held + data
        marker = b"\n" + _STATS_LINE
        cut = data.find(marker)
        if cut >= 0:
            self._pieces.feed(data[:cut])
            self._done = True
            return
        # The end of ``data`` may be the start of the timings line: hold it back until the next bytes tell.
        keep = next((k for k in range(min(len(marker) - 1, len(data)), 0, -1) if data.endswith(marker[:k])), 0)
        self._held = data[len(data) - keep :]
        self._pieces.feed(data[: len(data) - keep])

    def close(self) -> None:
        if not self._done:
            self._pieces.feed(self._held)
        self._pieces.close()


class Runner:
    """ExecuTorch's ``TextLLMRunner`` over one ``.pte`` and its tokenizer, loaded once (Core AI delegates on
    the host backend); each :meth:`generate` starts a new conversation from an empty cache.

    ``data_path`` is the program's data file (``.ptd``): by default the one of the ``.pte``'s name beside it,
    if any; an adapter's ``.pte`` runs with its base's (``PteWithData`` carries it).
    """

    def __init__(self, pte: str | os.PathLike, tokenizer: str | os.PathLike, data_path: str | os.PathLike | None = None) -> None:
        from coreai_partitioner.backends.apple_coreai.runtime.host import load_runtime_backend
        from coreai_partitioner.backends.apple_coreai.runtime.pte import data_file_of

        with NativeStreams():  # pytorch_tokenizers logs a line from C++ when it loads
            from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

        load_runtime_backend()
        self.pte = Path(pte)
        data_path = data_path if data_path is not None else data_file_of(pte)
        self._config = GenerationConfig
        streams = NativeStreams()
        try:
            with streams:
                if data_path is None:
                    self._runner = TextLLMRunner(str(self.pte), str(tokenizer))
                else:
                    self._runner = TextLLMRunner(str(self.pte), str(tokenizer), data_path=str(data_path))
        except RuntimeError as error:
            raise RuntimeError(f"TextLLMRunner cannot load {self.pte.name}: {error}\n{streams.tail()}") from error

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        temperature: float = 0.0,
        on_text: Callable[[str], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> Generation:
        """Generate from ``prompt``.

        ``on_text`` receives the text as it is generated, whole characters only;
        the result holds all of it and the runner's counts.  ``max_new_tokens``
        is the number of tokens generated (the runner's own count leaves out the
        first, which the prompt's call yields).  The runner's log lines go to
        ``log`` if given, and are part of the error if generation fails.
        """
        text: list[str] = []

        def emit(chunk: str) -> None:
            text.append(chunk)
            if on_text is not None:
                on_text(chunk)

        output = _Output(TextPieces(emit))
        stats = []
        config = self._config(max_new_tokens=max_new_tokens, temperature=temperature, echo=False)
        streams = NativeStreams(on_stdout=output.feed)
        try:
            with streams:
                self._runner.reset()
                self._runner.generate(prompt, config, stats_callback=stats.append)
        except RuntimeError as error:
            raise RuntimeError(f"TextLLMRunner failed on {self.pte.name}: {error}\n{streams.tail()}") from error
        output.close()
        if log is not None:
            for line in streams.lines:
                log(line)
        s = stats[-1]
        return Generation(
            text="".join(text),
            prompt_tokens=s.num_prompt_tokens,
            generated_tokens=s.num_generated_tokens + 1,
            prompt_seconds=(s.prompt_eval_end_ms - s.inference_start_ms) / 1000,
            decode_seconds=(s.inference_end_ms - s.prompt_eval_end_ms) / 1000,
        )


def generate(
    pte: str | os.PathLike,
    tokenizer: str | os.PathLike,
    prompt: str,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    on_text: Callable[[str], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> Generation:
    """Generate from ``prompt`` with ExecuTorch's ``TextLLMRunner`` (:class:`Runner`, loaded for this one prompt)."""
    return Runner(pte, tokenizer).generate(
        prompt, max_new_tokens=max_new_tokens, temperature=temperature, on_text=on_text, log=log
    )
