"""Step 1, records: externalizing composites, and finding their call sites again after ``to_edge``.

- :mod:`.specs`: which submodules become composites (``default_specs``, ``spec_for``).
- :mod:`.checks`: what makes a submodule externalizable, checked before anything is patched.
- :mod:`.externalize`: ``externalize_modules``, one record per call site.
- :mod:`.subexport` and :mod:`.fake`: identical call sites exported once, fake impls memoized.
- :mod:`.call_sites`: re-resolution by op target, pure functions over FX graphs.
- :mod:`.carried`: a record on its call site's ``node.meta``, from the partitioner to the backend.
- :mod:`.programs`: copies of exported programs that own their graph and share their tensors.
"""
