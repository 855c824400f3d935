"""ExecuTorch backends of coreai-partitioner (installed as ``coreai_partitioner.backends``)."""
