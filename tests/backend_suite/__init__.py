"""ExecuTorch's backend test suite (``executorch/backends/test/suite``) on Core AI flows of this package."""
