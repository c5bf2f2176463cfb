"""What the vendor kernels that check no index against its buffer do with a bad one: the `bounds_note` of their
KernelImpl (bounds_checked=False), shown by explain. Plain strings, so the plugins' registration modules import
no torch and no vendor library. Facts: docs/vendor-apis.md 1.3, 1.4; the table in docs/unchecked-indices.md."""

from __future__ import annotations

# FlashMLA decode skips only -1 (another negative or a slot past the cache is read); the lengths, which it would take
# as that many entries past the index width, the binding clamps into [0, width] (flashmla_glue.within_widths)
FLASHMLA_DECODE = ("indices: only -1 is skipped, another negative or a slot past the cache is read (lengths are "
                   "clamped into the index width by the binding)")
# SM90 prefill masks t >= 0 && t < s_kv (FlashMLA 9241ae3 csrc/sm90/prefill/sparse/phase1.cuh) and the binding
# clamps the lengths, so it stays inside its buffers: registered bounds-checked. The SM100 prefill's index masks are
# not read here (no Blackwell GPU): only -1 and >= s_kv are documented
FLASHMLA_PREFILL_SM100 = ("indices: only -1 and indices past kv are documented as skipped (another negative is "
                          "not; lengths are clamped into the index width by the binding)")
# sgl-kernel's HIP deepseek_v4_topk_transform_512 checks neither n <= S nor the page table's width
SGL_HIP_TOPK = ("lengths past the score width read past the scores row; a page table shorter than a row's "
                "candidates need is read past its row")
# DeepGEMM's paged MQA logits reads the pages the block table names and the table entries the context lengths
# cover; neither is checked against its buffer in the binding, and DeepGEMM 2.5.0 documents no mask for them
DEEPGEMM_PAGED_MQA_LOGITS = ("block_table entries and context_lens are used as given: a page id outside the cache or a "
                             "length past the table's width is read (not verified on the GPU to fault or not)")
# vLLM's topk_softplus_sqrt indexes its hash table by input id and takes the table's entries as expert ids
VLLM_ROUTER = ("input_ids index the hash table and its entries index the experts as given: an id outside either is "
               "read or written past its buffer")
