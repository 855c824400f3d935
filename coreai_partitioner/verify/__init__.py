"""Step 5, run and verify what ships: a lowered program or a ``.pte`` against eager PyTorch.

    from coreai_partitioner import verify
    outputs = verify.run(lowered, tokens)               # Core AI + PyTorch
    report = verify.check(lowered, model, tokens)       # against eager
    report.raise_for_mismatch()

- :mod:`.execution`: run a program, its delegates from the asset that ships.
- :mod:`.report`: compare outputs element by element (:func:`check`, :func:`compare`).
- :mod:`.fidelity`: judge a program by SNR and top-1 within the runtime's rounding; its cost against fp32, reported.
- :mod:`.quantized`: a quantized program against its quantized eager model, the float error reported.
- :mod:`.forward`: one call of a ``.pte``'s method (an encoder's) against the eager model it was lowered from.
- :mod:`.describe`: what a ``.pte`` ships (``python -m coreai_partitioner inspect``).
- :mod:`.testing`: one-call checks for CI jobs.
- :mod:`.table`: the project's plain-text table, and the reports' common base.
"""

from coreai_partitioner.verify.report import OutputComparison, Report, check, compare, default_tolerances
from coreai_partitioner.verify.execution import PteWithData, UnsupportedProgram, clear_cache, compiled_assets, method_names, reset_state, run
from coreai_partitioner.verify.quantized import QuantizedReport, check_quantized

__all__ = [
    "PteWithData",
    "OutputComparison",
    "QuantizedReport",
    "Report",
    "UnsupportedProgram",
    "check",
    "check_quantized",
    "clear_cache",
    "compare",
    "compiled_assets",
    "default_tolerances",
    "reset_state",
    "method_names",
    "run",
]
