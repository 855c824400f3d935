"""A text-to-speech ``.pte`` loaded for its loop, whichever family made it (``get_family``)."""

from __future__ import annotations

from coreai_partitioner.verify.program import LoadedProgram

#: The methods of every family's ``.pte``, in the order a run calls them.
METHODS = ("durations", "decoder")
#: What a program's ``get_family`` says (a VITS program exported before the constant existed has none: VITS).
FAMILIES = {1: "vits", 2: "kokoro"}


class SpeechProgram(LoadedProgram):
    """A text-to-speech ``.pte`` (methods ``durations`` and ``decoder``) loaded in ExecuTorch's runtime."""

    METHODS = METHODS
    EXPORT = "a text-to-speech checkpoint (python -m coreai_partitioner export --checkpoint DIR)"

    @property
    def family(self) -> str:
        """``"vits"`` or ``"kokoro"``: which loop runs it."""
        if "get_family" not in self.program.method_names:
            return "vits"
        value = self.constant("get_family")
        if value not in FAMILIES:
            raise ValueError(f"{self.path}: get_family is {value}, which this package's loop does not know; re-export it")
        return FAMILIES[value]
