"""Selection on fake hardware: platforms per arch, priorities, requirements, supports(), ties,
overrides, strict mode, failing and competing plugins. No GPU needed."""

from __future__ import annotations

import pytest
from conftest import fake, plugin_module, registry_with

from dsv4hal import override as ov
from dsv4hal.errors import (
    AmbiguousPlatformError,
    BadOverrideError,
    NoKernelError,
    PlatformNotFoundError,
    PluginLoadError,
    RegistryError,
    UnsupportedCaseError,
)
from dsv4hal.plugins import PluginWarning
from dsv4hal.registry import KernelImpl, MinVersion, PlatformSpec
from dsv4hal.selection import select_kernel, select_platform_spec

OP = "sparse_attention_decode"
CASE = {"h_q": 64, "compress_ratio": 4, "fp8": "e4m3fn"}


def _refuse_h128(case, info):  # noqa: ANN001, ANN202
    return ["h_q 128 not supported by this fake kernel"] if case.get("h_q") == 128 else []


def _vendor_plugin(registry) -> None:  # noqa: ANN001
    registry.add_kernel(KernelImpl(op=OP, name="fake_vendor", target="builtins:len", platforms=("cuda_sm90",),
                                   priority=1000, tier="vendor", requires=("flash_mla",), supports=_refuse_h128))
    registry.add_kernel(KernelImpl(op=OP, name="fake_triton", target="builtins:len",
                                   platforms=("cuda_sm90", "rocm"), priority=900, requires=("triton",)))


@pytest.fixture()
def reg():  # noqa: ANN201
    return registry_with(("fakevendor", plugin_module("fakevendor", _vendor_plugin)))


@pytest.mark.parametrize(("arch", "platform", "fp8"), [
    ("sm90", "cuda_sm90", "e4m3fn"), ("sm100", "cuda_sm100", "e4m3fn"), ("sm103", "cuda_sm100", "e4m3fn"),
    ("sm120", "cpu", "e4m3fn"), ("gfx942", "rocm", "e4m3fnuz"), ("gfx950", "rocm", "e4m3fn"), ("cpu", "cpu", "e4m3fn"),
])
def test_platform_per_arch(reg, arch: str, platform: str, fp8: str) -> None:  # noqa: ANN001
    """Each arch selects its platform and FP8 format."""
    info = fake(arch)
    d = select_platform_spec(reg, info, ov.Overrides())
    assert d.chosen.name == platform and d.source == "auto"
    assert info.fp8 == fp8


def test_sm120_is_not_sm100(reg) -> None:  # noqa: ANN001
    """SM120 does not fit cuda_sm100, and the reasons say so."""
    d = select_platform_spec(reg, fake("sm120"), ov.Overrides())
    assert any("SM120 is not SM100" in r for r in d.reasons["cuda_sm100"])


def test_priority_and_requirements(reg) -> None:  # noqa: ANN001
    """The highest-priority kernel whose libraries are present is chosen; others say what is missing."""
    o = ov.Overrides()
    d = select_kernel(reg, OP, CASE, fake("sm90", flash_mla="1.0", triton="3"), "cuda_sm90", o)
    assert d.chosen.name == "fake_vendor" and d.source == "auto"
    d = select_kernel(reg, OP, CASE, fake("sm90", triton="3"), "cuda_sm90", o)
    assert d.chosen.name == "fake_triton"
    rejected = {c.name: c.reasons for c in d.candidates if c.status == "rejected"}
    assert rejected["fake_vendor"] == ("missing flash_mla",)
    eligible = {c.name for c in d.candidates if c.status == "eligible"}
    assert "torch_reference" in eligible


def test_supports_reasons_per_case(reg) -> None:  # noqa: ANN001
    """A kernel whose supports() refuses the case is rejected with that reason."""
    info = fake("sm90", flash_mla="1.0", triton="3")
    d = select_kernel(reg, OP, {**CASE, "h_q": 128}, info, "cuda_sm90", ov.Overrides())
    assert d.chosen.name == "fake_triton"
    assert any("h_q 128" in r for c in d.candidates for r in c.reasons if c.name == "fake_vendor")


def test_selection_is_pure(reg) -> None:  # noqa: ANN001
    """Selecting twice with the same inputs gives equal decisions."""
    info = fake("sm90", triton="3")
    a = select_kernel(reg, OP, CASE, info, "cuda_sm90", ov.Overrides())
    b = select_kernel(reg, OP, CASE, info, "cuda_sm90", ov.Overrides())
    assert a == b


def test_forced_kernel_env_and_errors(reg) -> None:  # noqa: ANN001
    """DSV4HAL_KERNELS forces a kernel, and forcing an unusable one raises with the reason."""
    info = fake("sm90", triton="3")
    o = ov.from_env({"DSV4HAL_KERNELS": f"{OP}=fake_triton"})
    d = select_kernel(reg, OP, CASE, info, "cuda_sm90", o)
    assert (d.chosen.name, d.source) == ("fake_triton", "env")
    o = ov.from_env({"DSV4HAL_KERNELS": f"{OP}=fake_vendor"})
    with pytest.raises(UnsupportedCaseError, match="missing flash_mla") as e:
        select_kernel(reg, OP, CASE, info, "cuda_sm90", o)
    assert "cuda_sm90" in str(e.value) and "h_q=64" in str(e.value) and "Remedy" in str(e.value)
    o = ov.from_env({"DSV4HAL_KERNELS": f"{OP}=nope"})
    with pytest.raises(BadOverrideError, match="fake_triton"):
        select_kernel(reg, OP, CASE, info, "cuda_sm90", o)


@pytest.mark.parametrize("text", ["sparse_attention_decode", "=x", "bogus_op=x", "indexer_topk=a,indexer_topk=b"])
def test_malformed_kernel_overrides(text: str) -> None:
    """Malformed DSV4HAL_KERNELS values raise BadOverrideError."""
    with pytest.raises(BadOverrideError):
        ov.from_env({"DSV4HAL_KERNELS": text})


def test_bad_strict_value() -> None:
    """A non-boolean DSV4HAL_STRICT raises BadOverrideError."""
    with pytest.raises(BadOverrideError, match="boolean"):
        ov.from_env({"DSV4HAL_STRICT": "maybe"})


def test_context_manager_overrides_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    """overrides() context managers nest over the environment and record each source."""
    monkeypatch.setenv("DSV4HAL_KERNELS", "indexer_topk=from_env")
    with ov.overrides(kernels={OP: "fake_triton"}) as o1:
        assert o1.kernels == {"indexer_topk": "from_env", OP: "fake_triton"}
        assert o1.kernel_source(OP) == "api" and o1.kernel_source("indexer_topk") == "env"
        with ov.overrides(kernels="indexer_topk=inner", strict=True) as o2:
            assert o2.kernels["indexer_topk"] == "inner" and o2.strict
        assert not ov.current().strict
    assert ov.current().kernels == {"indexer_topk": "from_env"}
    with pytest.raises(BadOverrideError):
        with ov.overrides(kernels={"no_such_op": "x"}):
            pass


def test_no_kernel_error_names_everything() -> None:
    """NoKernelError names the op, the platform and a remedy."""
    reg = registry_with(disabled=("cpu",))  # no references: nothing can run
    with pytest.raises(NoKernelError) as e:
        select_kernel(reg, OP, CASE, fake("sm90"), "cuda_sm90", ov.Overrides())
    assert OP in str(e.value) and "cuda_sm90" in str(e.value) and "Remedy" in str(e.value)


def test_strict_refuses_reference_on_gpu(reg) -> None:  # noqa: ANN001
    """Strict mode refuses a reference on a GPU platform but allows it on the cpu platform."""
    with pytest.raises(NoKernelError, match="strict mode refuses"):
        select_kernel(reg, "mhc_pre", {}, fake("sm90"), "cuda_sm90", ov.Overrides(strict=True))
    d = select_kernel(reg, "mhc_pre", {}, fake("cpu"), "cpu", ov.Overrides(strict=True))
    assert d.chosen.name == "torch_reference"


def test_priority_tie_is_a_registry_error() -> None:
    """Two kernels at the same priority on one platform are a registry error."""
    def a(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=OP, name="a", target="m:f", platforms=("cuda_sm90",), priority=5))

    def b(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=OP, name="b", target="m:f", platforms=("*",),
                                       priority={"cuda_sm90": 5, "*": 3}))

    with pytest.raises(RegistryError, match="priority 5"):
        registry_with(("a", plugin_module("a", a)), ("b", plugin_module("b", b)), strict=True)


def test_case_conditional_priority_is_data_and_explained() -> None:
    """A case-conditional priority applies to matching cases only and is explained."""
    def plugin(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=OP, name="steady", target="builtins:len", platforms=("cuda_sm90",),
                                       priority=950))
        registry.add_kernel(KernelImpl(op=OP, name="big_batches", target="builtins:len", platforms=("cuda_sm90",),
                                       priority=940,
                                       priority_when=(({"tokens": "prefill", "h_q": 64}, 960),)))

    reg = registry_with(("p", plugin_module("p", plugin)), strict=True)
    decode = select_kernel(reg, OP, {**CASE, "tokens": "decode"}, fake("sm90"), "cuda_sm90", ov.Overrides())
    prefill = select_kernel(reg, OP, {**CASE, "tokens": "prefill"}, fake("sm90"), "cuda_sm90", ov.Overrides())
    other = select_kernel(reg, OP, {**CASE, "tokens": "prefill", "h_q": 128}, fake("sm90"), "cuda_sm90",
                          ov.Overrides())  # every feature of the condition must match
    assert decode.chosen.name == "steady" and other.chosen.name == "steady"
    assert prefill.chosen.name == "big_batches"
    assert {c.name: c.priority for c in prefill.candidates}["big_batches"] == 960  # what explain shows
    assert {c.name: c.priority for c in decode.candidates}["big_batches"] == 940


def test_conditional_priority_tie_is_a_registry_error() -> None:
    """A conditional priority tying another kernel's priority is a registry error."""
    def plugin(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=OP, name="a", target="m:f", platforms=("cuda_sm90",), priority=5))
        registry.add_kernel(KernelImpl(op=OP, name="b", target="m:f", platforms=("cuda_sm90",), priority=3,
                                       priority_when=(({"tokens": "prefill"}, 5),)))

    with pytest.raises(RegistryError, match="priority 5 for cases \\[tokens=prefill\\]"):
        registry_with(("p", plugin_module("p", plugin)), strict=True)

    def both(registry):  # noqa: ANN001, ANN202  (each raised under its own condition: a case can meet both)
        registry.add_kernel(KernelImpl(op=OP, name="a", target="m:f", platforms=("cuda_sm90",), priority=5,
                                       priority_when=(({"format": "mxfp4"}, 8),)))
        registry.add_kernel(KernelImpl(op=OP, name="b", target="m:f", platforms=("cuda_sm90",), priority=3,
                                       priority_when=(({"tokens": "prefill"}, 8),)))

    with pytest.raises(RegistryError, match="priority 8 for cases \\[format=mxfp4, tokens=prefill\\]"):
        registry_with(("p", plugin_module("p", both)), strict=True)


def test_duplicate_kernel_name_rejected_and_plugin_reported() -> None:
    """A plugin registering an existing kernel name is refused with a warning naming the plugin."""
    def dup(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op="mhc_pre", name="torch_reference", target="m:f", platforms=("cpu",),
                                       priority=7))

    with pytest.warns(PluginWarning, match="registered twice"):
        reg = registry_with(("dup", plugin_module("dup", dup)))
    assert "dup" in reg.plugin_errors
    with pytest.raises(PluginLoadError, match="registered twice"):
        registry_with(("dup", plugin_module("dup", dup)), strict=True)


def test_plugin_raising_at_probe_time() -> None:
    """A platform whose probe raises is contained and reported, not fatal."""
    def boom(info):  # noqa: ANN001, ANN202
        raise RuntimeError("probe exploded")

    def reg_boom(registry):  # noqa: ANN001, ANN202
        registry.add_platform(PlatformSpec("boom", "x", 1, boom, "cuda"))

    reg = registry_with(("boom", plugin_module("boom", reg_boom)))
    # contained like an import error: the platform does not fit, the fault is recorded and shown
    with pytest.warns(PluginWarning, match="probe exploded"):
        d = select_platform_spec(reg, fake("cpu"), ov.Overrides())
    assert d.chosen.name == "cpu" and "probe exploded" in reg.plugin_errors["boom"]
    assert any("probe exploded" in r for r in d.reasons["boom"])
    strict = registry_with(("boom", plugin_module("boom", reg_boom)), strict=True)
    with pytest.raises(PluginLoadError, match="probe exploded"):  # strict mode makes it fatal
        select_platform_spec(strict, fake("cpu"), ov.Overrides())


def test_competing_platform_is_ambiguous() -> None:
    """Two platforms fitting one machine at equal priority raise AmbiguousPlatformError."""
    def rival(registry):  # noqa: ANN001, ANN202
        registry.add_platform(PlatformSpec("rival_sm90", "claims sm90 too", 100,
                                           lambda info: [] if info.arch == "sm90" else ["not sm90"], "cuda"))

    reg = registry_with(("rival", plugin_module("rival", rival)))
    with pytest.raises(AmbiguousPlatformError, match="rival_sm90") as e:
        select_platform_spec(reg, fake("sm90"), ov.Overrides())
    assert "DSV4HAL_PLATFORM" in str(e.value)
    d = select_platform_spec(reg, fake("sm90"), ov.Overrides(platform="cuda_sm90", sources={"platform": "env"}))
    assert d.chosen.name == "cuda_sm90" and d.source == "env"


def test_forced_platform_that_does_not_fit(reg) -> None:  # noqa: ANN001
    """Forcing a platform that does not fit, or does not exist, raises with the reasons or names."""
    with pytest.raises(PlatformNotFoundError, match="needs an NVIDIA GPU"):
        select_platform_spec(reg, fake("cpu"), ov.Overrides(platform="cuda_sm90"))
    with pytest.raises(PlatformNotFoundError, match="cuda_sm100, cuda_sm90"):
        select_platform_spec(reg, fake("cpu"), ov.Overrides(platform="tpu"))


def test_plugin_failing_half_way_leaves_nothing() -> None:
    """A plugin failing half way through registration leaves nothing in the registry."""
    def half(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op="mhc_post", name="half_done", target="m:f", platforms=("cpu",),
                                       priority=3))
        raise RuntimeError("probe of libfoo failed")

    with pytest.warns(PluginWarning, match="libfoo"):
        reg = registry_with(("half", plugin_module("half", half)))
    assert "half_done" not in reg.kernels["mhc_post"] and "half" in reg.plugin_errors


def test_cpu_platform_on_a_gpu_host_sees_a_cpu() -> None:
    """select_platform("cpu") on a host with a GPU: the platform's ops run on the CPU, so its kernels are judged as
    on a CPU-only host. Natively compiled Triton is refused without the interpreter (a forced Triton kernel is an
    error, not a launch with CPU tensors), and strict mode's refusal of the reference on GPUs does not apply."""
    import dsv4hal

    host = fake("sm90", triton="3", flash_mla="1.0.0")
    p = dsv4hal.select_platform("cpu", info=host)
    assert not p.info.is_gpu and p.info.arch == "cpu" and p.info.libraries == host.libraries and p.host_info is host
    assert any("CPU platform on a host with sm90" in n for n in p.info.notes)
    d = p.explain("pack_store")
    assert d.chosen.name == "torch_reference"
    assert any(c.name == "triton_pack_store" and any("interpreter" in r for r in c.reasons) for c in d.candidates)
    with dsv4hal.overrides(kernels={"pack_store": "triton_pack_store"}), pytest.raises(UnsupportedCaseError,
                                                                                       match="TRITON_INTERPRET"):
        dsv4hal.select_platform("cpu", info=host)
    with dsv4hal.overrides(strict=True):  # binds: the reference is what a CPU platform runs
        assert dsv4hal.select_platform("cpu", info=host).explain("pack_store").chosen.name == "torch_reference"
    assert dsv4hal.select_platform("cuda_sm90", info=host).info is host  # a GPU platform keeps the host's view


@pytest.mark.parametrize("lib", ["flash_mla", "vllm"])
def test_hopper_single_row_decode_prefers_triton_unless_the_extra_list_is_long(lib: str) -> None:
    """cuda_sm90's measured rule (platforms/cuda_sm90/kernels.py, FLASHMLA_SINGLE_ROW_CASES): one query row over the
    SWA window or a short extra list goes to triton_sparse_decode; a long C128 list, or more rows, to FlashMLA.
    A forced FlashMLA still runs the single row."""
    from dsv4hal.platform import load_registry

    info = fake("sm90", **{lib: "1.0.0", "triton": "3.9"})
    flashmla = "flashmla_sm90_sgl" if lib == "flash_mla" else "flashmla_sm90_vllm"
    base = {"h_q": 64, "compress_ratio": 4, "fp8": "e4m3fn", "swa_page_size": 256, "extra_page_size": 64,
            "extra_width": 512, "extra_class": "short", "tokens": "single"}
    swa_only = {**base, "compress_ratio": 0, "extra_page_size": None, "extra_width": None, "extra_class": None}
    long = {**base, "compress_ratio": 128, "extra_page_size": 2, "extra_width": 8192, "extra_class": "long"}
    registry = load_registry()
    for case, want in ((base, "triton_sparse_decode"), ({**base, "h_q": 128}, "triton_sparse_decode"),
                       (swa_only, "triton_sparse_decode"), (long, flashmla),
                       ({**base, "tokens": "batch"}, flashmla), ({**swa_only, "tokens": "batch"}, flashmla),
                       ({**base, "tokens": "wide"}, flashmla), ({**swa_only, "tokens": "wide"}, flashmla)):
        d = select_kernel(registry, "sparse_attention_decode", case, info, "cuda_sm90", ov.Overrides())
        assert d.chosen.name == want, case
    forced = ov.Overrides(kernels={"sparse_attention_decode": flashmla})
    d = select_kernel(registry, "sparse_attention_decode", base, info, "cuda_sm90", forced)
    assert d.chosen.name == flashmla
    # explain says where FlashMLA's priority comes from, and only where it is not its own
    own = 300 if lib == "flash_mla" else 290
    note = {c.name: c.priority_note for c in d.candidates}[flashmla]
    from dsv4hal_cuda_sm90.kernels import FLASHMLA_SINGLE_ROW_WHY

    assert "eagerly" in FLASHMLA_SINGLE_ROW_WHY  # the measurement behind the rule, and its eager cost, are shown
    assert note == f"for tokens=single, extra_class=short; {own} otherwise ({FLASHMLA_SINGLE_ROW_WHY})"
    assert note in d.explain()
    wide = select_kernel(registry, "sparse_attention_decode", {**base, "tokens": "wide"}, info, "cuda_sm90",
                         ov.Overrides())
    assert {c.name: (c.priority, c.priority_note) for c in wide.candidates}[flashmla] == (own, "")


def test_explain_says_flashmla_decode_is_not_bounds_checked() -> None:
    """explain names a chosen vendor kernel that checks no index against its buffer, and a checked one not."""
    reg = registry_with()
    case = {"h_q": 64, "fp8": "e4m3fn", "extra_class": "short", "tokens": "few"}
    d = select_kernel(reg, OP, case, fake("sm90", flash_mla="1.0.0", triton="3"), "cuda_sm90", ov.Overrides())
    assert d.chosen.name == "flashmla_sm90_sgl" and not d.chosen.bounds_checked
    assert "flashmla_sm90_sgl is not bounds-checked (indices: only -1 is skipped" in d.explain()
    assert d.to_json()["bounds_checked"] is False
    portable = select_kernel(reg, OP, case, fake("sm90", triton="3"), "cuda_sm90", ov.Overrides())
    assert portable.chosen.name == "triton_sparse_decode" and "bounds-checked" not in portable.explain()


def test_a_library_older_than_the_kernels_minimum_refuses_it_with_the_release() -> None:
    """KernelImpl.min_versions: an installed release older than the minimum refuses the kernel, naming both versions
    and what the minimum release brings; an unknown or newer version does not; the next kernel serves."""
    minimum = MinVersion("flash_mla", (1, 2, 0), "with the fake entry point", label="sgl-flash-mla",
                         remedy=" (pip install sgl-flash-mla)")

    def plugin(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=OP, name="versioned", target="builtins:len", platforms=("cuda_sm90",),
                                       priority=1000, tier="vendor", requires=("flash_mla",), min_versions=(minimum,)))
        registry.add_kernel(KernelImpl(op=OP, name="portable", target="builtins:len", platforms=("cuda_sm90",),
                                       priority=900))

    reg = registry_with(("p", plugin_module("p", plugin)))
    for version, chosen in (("1.1.9", "portable"), ("1.2.0", "versioned"), ("2.0", "versioned"),
                            ("unknown", "versioned")):
        d = select_kernel(reg, OP, CASE, fake("sm90", flash_mla=version), "cuda_sm90", ov.Overrides())
        assert d.chosen.name == chosen, version
    d = select_kernel(reg, OP, CASE, fake("sm90", flash_mla="1.1.9"), "cuda_sm90", ov.Overrides())
    why = list(next(c for c in d.candidates if c.name == "versioned").reasons)
    assert why == ["sgl-flash-mla 1.1.9 predates 1.2.0, the first release with the fake entry point; upgrade "
                   "sgl-flash-mla (pip install sgl-flash-mla)"]


def test_a_minimum_version_of_a_library_the_kernel_does_not_require_is_refused() -> None:
    """A min_versions entry for a library outside `requires` is a registration error naming the library."""
    def plugin(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=OP, name="k", target="builtins:len", platforms=("cuda_sm90",), priority=1,
                                       min_versions=(MinVersion("deep_gemm", (2, 0, 0), "with x"),)))

    with pytest.raises(PluginLoadError, match="min_versions names deep_gemm, which it does not require"):
        registry_with(("p", plugin_module("p", plugin)), strict=True)
