"""Steps 1 to 4 in one call: ``lower``, ``lower_exported``, ``save_pte``, and the edge passes lowering runs.

- :mod:`.lower`: export with composites, ``to_edge_transform_and_lower``, write the ``.pte``.
- :mod:`.precision`: export a model at another floating dtype, leaving the model as it was.
- :mod:`.passes`: ``get_default_passes``, the edge transform passes Core AI lowering needs.
- :mod:`.whole_program`: lower a program one delegate takes whole, partitioning before edge conversion.
- :mod:`.methods`: ``lower_methods``, the tail every task's export ends with: its methods, one shared asset.
- :mod:`.device`: the contract of upstream's on-device runtime, which every task's device form keeps.
"""
