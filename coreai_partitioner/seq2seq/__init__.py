"""What an encoder-decoder ``.pte`` runs by, whatever its encoder reads: greedy decoding over ``encoder`` and ``text_decoder``.

Speech recognition (:mod:`coreai_partitioner.speech_recognition`) and text-to-text
generation (:mod:`coreai_partitioner.text2text`) lower their models to the
same two methods (the modules they are made of are
:mod:`coreai_partitioner.blocks.cross`'s); :mod:`.decode` is the loop an app
runs over them, with Hugging Face's greedy rules (:class:`DecodingRules`),
and :class:`Seq2SeqProgram` the ``.pte`` loaded in ExecuTorch's runtime.
"""

from coreai_partitioner.seq2seq.decode import GENERATION_FILE, Decoded, DecodingError, DecodingRules, TextDecoderCall, decode
from coreai_partitioner.seq2seq.program import Seq2SeqProgram

__all__ = ["GENERATION_FILE", "Decoded", "DecodingError", "DecodingRules", "Seq2SeqProgram", "TextDecoderCall", "decode"]
