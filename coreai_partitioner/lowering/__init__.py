"""Steps 1 to 4 in one call: ``lower``, ``lower_exported``, ``save_pte``, and the edge passes lowering runs.

- :mod:`.lower`: export with composites, ``to_edge_transform_and_lower``, write the ``.pte``.
- :mod:`.precision`: export a model at another floating dtype, leaving the model as it was.
- :mod:`.passes`: ``get_default_passes``, the edge transform passes Core AI lowering needs.
"""
