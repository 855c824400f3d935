"""Steps 1 to 4 in one call, and the tail every task's export ends with.

- :mod:`.lower`: the library's road for any model: export with composites, ``to_edge_transform_and_lower`` (``lower``,
  ``lower_exported``), write the ``.pte`` (``save_pte``).
- :mod:`.methods`: ``lower_methods``, the one tail every task of the ``export`` command ends with (text generation,
  vision-language, speech recognition, text-to-text, encoders, image classification): its methods, one shared asset,
  host or device form.
- :mod:`.whole_program`: what ``lower_methods`` runs: programs one delegate takes whole, partitioned before edge
  conversion.
- :mod:`.precision`: export a model at another floating dtype, leaving the model as it was.
- :mod:`.passes`: ``get_default_passes``, the edge transform passes Core AI lowering needs.
- :mod:`.device`: the contract of upstream's on-device runtime, which every task's device form keeps.
- :mod:`.external_data`, :mod:`.bind`: the weights in a ``.ptd``; inputs bound as constants (an adapter's pairs).
"""
