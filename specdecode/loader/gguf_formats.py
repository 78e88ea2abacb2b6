"""Which runtime format a GGUF file's weights get: the decoder's (``auto_quant``: the format nearest the
file's own bits per weight) and the LM head's (``head_quant``)."""
from __future__ import annotations

from ..layers.quant import FORMATS, nearest_format
from .gguf_file import Source, open_gguf

# Bits per weight of the GGUF types, to pick the runtime format closest to the file's own.
_BITS = {"Q2_K": 2.6, "Q3_K": 3.4, "Q4_0": 4.5, "Q4_1": 5.0, "Q4_K": 4.5, "Q5_0": 5.5, "Q5_1": 6.0,
         "Q5_K": 5.5, "Q6_K": 6.6, "Q8_0": 8.5, "F16": 16, "BF16": 16, "F32": 32}


def auto_quant(source: Source) -> str:
    """The runtime format whose bits per weight are nearest the file's decoder average (layers/quant:
    int4 = 4.625 takes up to 6.3-bit files such as Q4_K_M, Q4_0/1, Q5_0/1, Q5_K; int8 up to 12; above
    that none, the float dtype)."""
    f = open_gguf(source)
    total = bits = 0
    for info in f.tensors.values():
        if info.name.startswith("blk.") and len(info.shape) == 2:
            n = info.shape[0] * info.shape[1]
            total += n
            bits += n * _BITS.get(info.qtype.name, 16)
    return nearest_format(bits / total if total else 16)


HEAD_INT8_BITS = 8.0  # a file storing its LM head with at least this many bits per weight keeps an int8 head


def head_quant(source: Source, quant: str) -> str:
    """The LM head's runtime format for a model whose decoder runs in ``quant`` (a format, not none):
    the decoder's own when the file stores its head (``output.weight``, or the tied
    ``token_embd.weight``) below 8 bits per weight, which a file quantized for size does (Q4_K_M:
    Q6_K), else int8. The head is 22 % of the 1.5B's bytes per token at int8; at int4 its top-1
    agreement with the file's float32 logits is unchanged (docs/benchmarks.md, round 12). A Q8_0 or
    float head was kept at 8 bits or more by the file's maker (the 0.5B's: an int4 head measurably
    lowered its acceptance as a draft), and a head never gets fewer bits than the decoder."""
    f = open_gguf(source)
    info = f.tensors.get("output.weight") or f.tensors["token_embd.weight"]
    if _BITS.get(info.qtype.name, 16) < HEAD_INT8_BITS:
        return quant
    return max(("int8", quant), key=lambda q: FORMATS[q].bits_per_weight)
