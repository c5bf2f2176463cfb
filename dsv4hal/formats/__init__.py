"""Byte formats: the one model of DSV4's quantized data that every kernel reads and writes.

Submodules: `fp8` (FP8 flavours, UE8M0 scales), `v4_cache` (the 584-byte paged KV record),
`indexer_cache` (the 132-byte indexer row), `mxfp4` (e2m1 experts), `fp8_block` (128x128 block scales).
"""
