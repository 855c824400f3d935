"""Step 3, partition: which nodes a Core AI delegate takes.

- :mod:`.partitioner`: ``CoreAIPartitioner``, upstream's partitioner claiming externalized call sites too.
- :mod:`.op_support`: upstream's op rules, plus paired call sites.
- :mod:`.claims`: what the converter lowers per op and its arguments; a node it cannot lower right stays outside.
- :mod:`.boundaries`: where a model's own code puts a delegate's boundaries (ops kept outside, segments).
"""
