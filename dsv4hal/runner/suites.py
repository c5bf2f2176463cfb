"""The suites `dsv4hal run` knows, as data: what each measures, the command that measures it, and how long it may
take. Each suite writes `<out-dir>/<card>/<name>.json`, overwritten on every run.

In a command, `{python}` is this interpreter, `{json}` a file the command writes its own report to (the runner reads
it into the result's "result"), `{dir}` the card's result folder and `{name}` the suite's name (plots and markdown
go to `{dir}/{name}.png`, `{dir}/{name}.md`)."""

from __future__ import annotations

from dataclasses import dataclass, field

# The guard-memory tests and the FlashMLA glue tests, on the GPU (the sm_90 compile check needs no GPU: CI runs
# it). A test file is named by its file name alone: the
# runner finds it under tests/
MEMORY_SAFETY_TESTS = (
    "test_unchecked_bounds.py", "test_unchecked_bounds_kernels.py", "test_flashmla_decode_op.py",
    "test_flashmla_sched.py", "test_flashmla_glue_ops.py", "test_indexer_q_prep.py", "test_triton_compress.py",
    "test_compress_decode.py", "test_indexer_logits_kernels.py", "test_offload_fetch.py")
GUARD_TESTS = ("test_unchecked_bounds.py", "test_unchecked_bounds_kernels.py")
PYTEST = ("{python}", "-m", "pytest", "-p", "no:cacheprovider", "-q")
DSV4HAL = ("{python}", "-m", "dsv4hal")
# The conformance catalog in three reports, each small enough for one command's time limit
CONFORMANCE_ATTENTION_OPS = "sparse_attention_decode,sparse_attention_prefill,compress,compress_decode,indexer_logits,"\
                            "mhc_post_pre"
CONFORMANCE_REST_OPS = "pack_store,dequant_gather,indexer_topk,indexer_q_prep,indexer_store,moe_route,mhc_pre,"\
                       "mhc_post,mhc_head,build_attention_metadata,offload_fetch,fp8_linear,fp8_grouped_linear"


@dataclass(frozen=True)
class Suite:
    name: str  # the result file's stem: what it measures
    measures: str
    command: tuple[str, ...]
    timeout_s: int
    tags: tuple[str, ...] = ()  # `dsv4hal run TAG` runs every suite with the tag
    junit: bool = False  # a pytest selection: its cases become the result
    stdout_json: bool = False  # the command prints its report as the last line of its output
    sanitizer: bool = False  # run under compute-sanitizer --tool memcheck; unavailable without it
    env: dict[str, str] = field(default_factory=dict)
    gpu: bool = True  # needs a GPU (`--list` marks the ones a CPU machine runs)


def _bench(op: str, name: str, timeout_s: int, *flags: str, plot: bool = False) -> Suite:
    return Suite(name, f"`dsv4hal bench {op}{''.join(' ' + f for f in flags)}`: GPU time of each kernel against the "
                       "op's floor", (*DSV4HAL, "bench", op, *flags, "--json", "{json}",
                                       *(("--plot", "{dir}/{name}.png") if plot else ())), timeout_s, ("figures",))


LONG = 1 << 19  # from this context on the demo's C4 pool is also measured offloaded


def _demo_c4(context: int, batch: int, offload: bool) -> Suite:
    """The V4-Flash decode step at a context, the C4 pool resident or offloaded (a quarter on the device): the pair
    at one shape gives the offloaded step's cost over the resident one; the resident steps from 4K to 1M context
    (tag `context`) how the step grows with context."""
    label = f"{context // 1024}k" if context < 1 << 20 else f"{context >> 20}m"
    how = "offloaded to pinned host memory, a quarter of it on the device" if offload else "resident"
    return Suite(f"demo-c4-{'offload' if offload else 'resident'}-{label}-b{batch}",
                 f"the V4-Flash decode step in one CUDA graph at batch {batch}, {label} context, the C4 pool {how}",
                 (*DSV4HAL, "demo", "--size", "flash", "--batch", str(batch), "--context", str(context), "--steps",
                  "4", "--fill", "random", *(("--offload-c4",) if offload else ()), "--json", "{json}"), 600,
                 (*(("offload",) if offload or context >= LONG else ()), *(() if offload else ("context",))))


def _conformance(part: str, ops: str, timeout_s: int) -> Suite:
    return Suite(f"conformance-cuda_sm90-{part}", f"the cuda_sm90 platform's conformance cells of {ops}, eager and "
                 "graph-captured, against the reference",
                 (*DSV4HAL, "conformance", "--platform", "cuda_sm90", "--ops", ops, "--quiet", "--json", "{json}",
                  "--markdown", "{dir}/{name}.md"), timeout_s, ("figures", "conformance"),
                 env={"DSV4HAL_NATIVE_GLUE": "1"})


SUITES: tuple[Suite, ...] = (
    Suite("memory-safety", "the guard-memory tests and the FlashMLA glue tests on the GPU",
          (*PYTEST, *MEMORY_SAFETY_TESTS), 400, ("trust",), junit=True),
    Suite("shape-sequence", "every vendor-bound op's conformance cases in shuffled shapes, eager and graph-captured, "
          "then garbage inputs, a valid call checked after each",
          ("{python}", "-m", "dsv4hal.conformance.sequence", "--rounds", "1", "--json", "{json}"), 500, ("trust",)),
    Suite("memcheck-guard-tests", "compute-sanitizer memcheck errors over the guard-memory tests",
          (*PYTEST, *GUARD_TESTS), 280, ("trust", "memcheck"), junit=True, sanitizer=True),
    Suite("memcheck-index-ops", "compute-sanitizer memcheck errors over the conformance cases of every op that takes "
          "indices (the CPU-sized ones, eager)",
          ("{python}", "-m", "dsv4hal.runner.index_op_cells", "--json", "{json}"), 280, ("trust", "memcheck"),
          sanitizer=True),
    Suite("flashmla-sequence", "FlashMLA decode calls in the sequence of an engine, streams ordered, against the "
          "reference", ("{python}", "-m", "dsv4hal.conformance.flashmla_sequence"), 300, ("trust",),
          stdout_json=True),
    Suite("gpu-tests", "the whole test suite on the GPU", (*PYTEST, "-x", "--maxfail", "30", "tests"), 580,
          ("tests",), junit=True),
    _bench("attention", "bench-attention", 200, "--quick"),
    _bench("moe", "bench-moe-quick", 600, "--quick", plot=True),
    _bench("moe", "bench-moe", 600, plot=True),
    _bench("topk", "bench-topk", 300, plot=True),
    _bench("mhc", "bench-mhc", 300, "--quick", plot=True),
    _bench("compress", "bench-compress", 300, "--quick", plot=True),
    _bench("indexer", "bench-indexer", 300, "--quick"),
    _bench("linear", "bench-linear", 300, "--quick"),
    _bench("pack_store", "bench-pack-store", 300),
    Suite("bench-offload", "`dsv4hal bench offload`: offload_fetch of n C4 pages from pinned host memory against a "
          "plain pinned copy_ of the same bytes", (*DSV4HAL, "bench", "offload", "--json", "{json}"), 300,
          ("figures", "offload")),
    _conformance("moe", "moe_experts", 600),
    _conformance("attention", CONFORMANCE_ATTENTION_OPS, 600),
    _conformance("rest", CONFORMANCE_REST_OPS, 600),
    _conformance("decode-step", "decode_step", 300),
    Suite("demo-flash", "the V4-Flash decode step in one CUDA graph at batch 64, 32K context: step time, tokens/s, "
          "each op alone against its floor, each attention call through every kernel that takes it",
          (*DSV4HAL, "demo", "--size", "flash", "--batch", "64", "--context", "32768", "--steps", "8", "--fill",
           "random", "--kernels-per-call", "sparse_attention_decode", "--json", "{json}", "--plot",
           "{dir}/{name}.png"), 600, ("figures",)),
    Suite("demo-flash-flashmla", "the V4-Flash decode step of demo-flash with FlashMLA forced for the sparse "
          "attention (sparse_attention_decode=flashmla_sm90_sgl), against demo-flash",
          (*DSV4HAL, "demo", "--size", "flash", "--batch", "64", "--context", "32768", "--steps", "8", "--fill",
           "random", "--json", "{json}"), 600, ("figures",),
          env={"DSV4HAL_KERNELS": "sparse_attention_decode=flashmla_sm90_sgl"}),
    Suite("demo-flash-compiled", "the V4-Flash decode step torch.compiled (Inductor) in one CUDA graph",
          (*DSV4HAL, "demo", "--size", "flash", "--batch", "64", "--context", "32768", "--steps", "8", "--fill",
           "random", "--compile", "--json", "{json}"), 600, ("figures",)),
    *(Suite(f"demo-flash-tpr{n}", f"the V4-Flash decode step at batch 64, 32K context with {n} tokens a request "
            "(MTP verify, every draft accepted): step time and query tokens/s, against demo-flash",
            (*DSV4HAL, "demo", "--size", "flash", "--batch", "64", "--context", "32768", "--steps", "8", "--fill",
             "random", "--tokens-per-request", str(n), "--json", "{json}"), 600, ("figures", "mtp"))
      for n in (2, 4)),
    *(_demo_c4(context, batch, False) for context in (1 << 12, 1 << 15, 1 << 17) for batch in (1, 64)),
    *(_demo_c4(context, batch, offload) for context in (LONG, 1 << 20) for batch in (1, 64)
      for offload in (False, True)),
    Suite("soak", "one minute of an engine's lifecycle with every op: captures, replays, checked calls, memory",
          (*DSV4HAL, "soak", "--minutes", "1", "--json", "{json}"), 300, ("figures",)),
    Suite("tune-cuda_sm90", "every eligible kernel timed per op and shape bucket; the lock file "
          "`cuda_sm90.lock.json` beside it and the choices that differ from the static priority in the markdown",
          (*DSV4HAL, "tune", "--platform", "cuda_sm90", "--out", "{dir}/cuda_sm90.lock.json", "--markdown",
           "{dir}/{name}.md"), 600, ("figures",)),
    Suite("fuzz-long", "the contract fuzzer at 2000 examples a contract: generic exceptions, accepted-but-wrong "
          "results, crashes", (*PYTEST, "test_fuzz_contracts.py"), 3600, ("cpu",), junit=True,
          env={"DSV4HAL_FUZZ_EXAMPLES": "2000", "DSV4HAL_FUZZ_JSON": "{json}"}, gpu=False),
)

SUITES_BY_NAME = {s.name: s for s in SUITES}
