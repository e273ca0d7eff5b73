"""Triton kernels, one family per file, plus the pieces they share.

- ``schedule``: the grouped (L2-friendly) tile order and the persistent-grid helpers.
- ``epilogue``: the low-rank up-projection and affine epilogue on the fp32 accumulator.
- ``aot``: ahead-of-time sm_90 compiles on CPU (PTX checks, compiled shared-memory size).
"""
