"""Quantized storage formats (pure torch, exact round trips)."""

from .int4 import (
    PACK_BLOCK,
    act_shift_vector,
    dequantize_int4,
    pack_int4,
    quantize_act_int4,
    quantize_act_uint4,
    quantize_weight_int4,
    unpack_int4,
)
from .fp8 import dequantize_act_e4m3, quantize_act_e4m3
from .int8 import dequantize_rows_int8, quantize_rows_int8

__all__ = [
    "PACK_BLOCK",
    "pack_int4",
    "unpack_int4",
    "quantize_weight_int4",
    "quantize_act_int4",
    "quantize_act_uint4",
    "act_shift_vector",
    "dequantize_int4",
    "quantize_rows_int8",
    "dequantize_rows_int8",
    "quantize_act_e4m3",
    "dequantize_act_e4m3",
]
