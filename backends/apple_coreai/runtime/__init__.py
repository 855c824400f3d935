"""The Core AI runtime on this machine, both halves in one folder.

ExecuTorch 1.5.1 ships no Core AI runtime, so the backend brings one:

* ``CoreAIHostBackend.cpp`` (with ``Manifest.h`` and ``coreai_host_abi.h``):
  the ExecuTorch backend, registered in the wheel's ``libexecutorch.so``.
  ``init`` parses and checks the delegate's manifest and gathers its asset,
  ``execute`` checks the inputs, runs the delegate and logs it to the
  method's event tracer (ETDump).
* :mod:`.host`: builds that library on first use and answers its callbacks,
  running each delegate on coreai-core (:mod:`.loaded_asset`).
* :mod:`.pte` reads what a ``.pte`` ships (methods, delegates, manifests,
  assets) and :mod:`.asset_ir` what an asset holds (graphs, composites).

The public entry points stay where users import them:
``coreai_partitioner.load_runtime_backend`` and ``coreai_partitioner.verify``.
"""
