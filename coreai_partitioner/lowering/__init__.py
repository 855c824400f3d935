"""Steps 1 to 4 in one call, and the tail every task's export ends with.

- :mod:`.lower`: the library's road for any model: export with composites, ``to_edge_transform_and_lower`` (``lower``,
  ``lower_exported``), write the ``.pte`` (``save_pte``).
- :mod:`.methods`: ``lower_methods``, the one tail every task of the ``export`` command ends with (text generation,
  vision-language, speech recognition, text-to-text, encoders, image classification; text-to-speech and text-to-image
  through ``lower_method_modules``): its methods, one shared asset, host or device form.
- :mod:`.repeated`: a model's run of alike layers traced once and repeated in the graph (``trace_repeated``), or
  traced whole where it cannot be, saying why.
- :mod:`.whole_program`: what ``lower_methods`` runs: programs one delegate takes whole, partitioned before edge
  conversion.
- :mod:`.precision`: export a model at another floating dtype, leaving the model as it was.
- :mod:`.passes`: ``get_default_passes``, the edge transform passes Core AI lowering needs.
- :mod:`.device`: the contract of upstream's on-device runtime, which every task's device form keeps.
- :mod:`.external_data`: the weights in a ``.ptd``.
"""
