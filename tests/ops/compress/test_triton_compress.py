"""The portable Triton compressor (prefill and decode forms) against the PyTorch reference and the conformance
catalog, forced through the platform (under the interpreter on CPU machines)."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
from dsv4hal.conformance.runner import load_catalog, run_cell
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.reference import compress as ref
from dsv4hal.reference.rope import DSV4_YARN, make_rope_table

pytest.importorskip("triton")

FORCED = {"compress": "triton_compress", "compress_decode": "triton_compress_decode"}
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def platform():  # noqa: ANN201
    with dsv4hal.overrides(kernels=FORCED):
        return dsv4hal.select_platform()


CATALOG = [(s, b) for s, b in load_catalog(FORCED) if not s.gpu_only]


@pytest.mark.parametrize(("spec", "build"), CATALOG, ids=[f"{s.op}:{s.name}" for s, _ in CATALOG])
def test_catalog_with_triton(platform, spec, build) -> None:  # noqa: ANN001
    """The Triton compress kernels pass every compress catalog case."""
    cell = run_cell(platform, spec, build, "eager")
    assert cell.implementation == FORCED[spec.op]
    assert cell.status == "pass", cell.detail
    assert cell.max_error is not None and cell.max_error == cell.max_error


def test_not_chosen_on_cpu_without_override() -> None:
    """On a CPU machine the Triton compress kernels are candidates but not chosen."""
    p = dsv4hal.select_platform()
    if p.info.is_gpu:
        pytest.skip("GPU machine")
    for op, name in FORCED.items():
        d = p.explain(op)
        assert d.chosen.name == "torch_reference" and any(c.name == name for c in d.candidates)


def _layer(ratio: int, hd: int, n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    coff = 2 if ratio == 4 else 1
    ks = torch.randn(n, 2 * coff * hd, generator=g)
    ks[:, coff * hd:] *= 2.0
    cos, sin = make_rope_table(1024, 160000.0, DSV4_YARN)
    return {"kv_score": ks, "ape": 0.5 * torch.randn(ratio, coff * hd, generator=g),
            "norm_weight": 1.0 + 0.1 * torch.randn(hd, generator=g), "cos": cos, "sin": sin}


def _cu(lengths: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _on(d: dict) -> dict:
    return {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in d.items()}


@pytest.mark.parametrize(("ratio", "hd", "hadamard", "lengths"), [
    (4, 512, False, (3, 9, 0, 17)),
    (4, 128, True, (5, 4, 22)),
    (4, 128, False, (1, 11)),
    (128, 512, False, (130, 7, 256)),
    (128, 128, True, (129, 300)),
])
def test_prefill_matches_reference(ratio: int, hd: int, hadamard: bool, lengths: tuple[int, ...]) -> None:
    """The Triton prefill compress matches the reference over ratios, widths and lengths."""
    from dsv4hal.kernels.triton.compress import compress

    layer = _layer(ratio, hd, sum(lengths), ratio + hd + len(lengths))
    args = {**layer, "cu_seqlens": _cu(lengths), "ratio": ratio, "hadamard": hadamard}
    want = ref.compress(**args)
    got = compress(**_on(args)).cpu()
    assert got.shape == want.shape == (sum(n // ratio for n in lengths), hd)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("ratio", "hd", "hadamard", "lengths"), [(4, 128, True, (5, 0, 22, 3)),
                                                                 (128, 512, False, (130, 7, 256))])
def test_num_groups_gives_the_same_rows_and_zero_rows_past_m(ratio: int, hd: int, hadamard: bool,
                                                              lengths: tuple[int, ...]) -> None:
    """num_groups = M: the rows the count read from cu_seqlens gives, bit for bit (the same kernel, no sync); a count
    past M (unchecked mode trusts it) gets zero rows after the M real ones, and reads nothing past the rows."""
    from dsv4hal.kernels.triton.compress import compress

    layer = _layer(ratio, hd, sum(lengths), 7 + ratio)
    args = _on({**layer, "cu_seqlens": _cu(lengths), "ratio": ratio, "hadamard": hadamard})
    m = sum(n // ratio for n in lengths)
    base = compress(**args)
    assert torch.equal(compress(**args, num_groups=m), base)
    more = compress(**args, num_groups=m + 3).cpu()
    assert more.shape == (m + 3, hd)
    assert torch.equal(more[:m], base.cpu()) and not bool(more[m:].any())
    assert compress(**args, num_groups=0).shape == (0, hd)


def test_num_groups_checked_through_the_platform(platform) -> None:  # noqa: ANN001
    """The bound op: num_groups other than M is refused wherever cu_seqlens is read (on the CPU, or checked mode);
    a bool or a negative count always."""
    layer = _layer(4, 512, 20, 1)
    args = {**layer, "cu_seqlens": _cu((9, 11)), "ratio": 4}
    want = platform.ops.compress(**_on(args))
    torch.testing.assert_close(platform.ops.compress(**_on(args), num_groups=4), want)
    if DEV.type == "cpu":  # cu_seqlens on the CPU is read in unchecked mode too
        with pytest.raises(InvalidArgumentError, match="num_groups"):
            platform.ops.compress(**_on(args), num_groups=5)
    for bad in (True, -1, 2.0):
        with pytest.raises(InvalidArgumentError, match="num_groups"):
            platform.ops.compress(**_on(args), num_groups=bad)
    with dsv4hal.overrides(kernels=FORCED):
        checked = dsv4hal.select_platform(checked=True)
    with pytest.raises(InvalidArgumentError, match="num_groups"):
        checked.ops.compress(**_on(args), num_groups=3)


def test_prefill_more_requests_than_a_block() -> None:
    """300 requests (past the 256 a program sums per step): each group's request and offset found from cu_seqlens
    inside the kernel, across steps, with empty and group-less requests among them."""
    from dsv4hal.kernels.triton.compress import compress

    lengths = tuple(int(n) for n in torch.randint(0, 11, (300,), generator=torch.Generator().manual_seed(5)))
    args = {**_layer(4, 128, sum(lengths), 11), "cu_seqlens": _cu(lengths), "ratio": 4, "hadamard": True}
    want = ref.compress(**args)
    got = compress(**_on(args), num_groups=want.shape[0]).cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_prefill_strided_rows_and_masked_chunk() -> None:
    """kv_score as a row-strided view; a C128 window whose first rows have -inf scores (weight 0, never NaN)."""
    from dsv4hal.kernels.triton.compress import compress

    layer = _layer(128, 128, 256, 3)
    ks = layer["kv_score"]
    ks[:40, 128:] = float("-inf")
    wide = torch.zeros(256, 300)
    wide[:, 10:266] = ks
    args = {**layer, "cu_seqlens": _cu((256,)), "ratio": 128}
    want = ref.compress(**args)
    got = compress(**_on({**args, "kv_score": wide[:, 10:266]})).cpu()
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("ratio", "hd", "hadamard", "ring"), [(4, 512, False, None), (4, 128, True, 16),
                                                             (128, 512, False, None)])
def test_decode_matches_reference_and_updates_ring(ratio: int, hd: int, hadamard: bool, ring: int | None) -> None:
    """A batch at assorted positions (closing and not, group 0 included) in shuffled slots of dirty rings."""
    from dsv4hal.kernels.triton.compress import compress_decode

    positions = (3, 7, 8, 11, 101, 103) if ratio == 4 else (127, 255, 300, 383)
    layer = _layer(ratio, hd, len(positions), ratio + hd)
    g = torch.Generator().manual_seed(9)
    state = ref.new_state(len(positions) + 2, ratio, layer["kv_score"].shape[1], ring=ring)
    state[1:] = torch.randn(state[1:].shape, generator=g)  # stale rows everywhere: only the window may count
    slots = torch.randperm(len(positions), generator=g).int() + 1
    args = {**layer, "slots": slots, "positions": torch.tensor(positions, dtype=torch.int32), "ratio": ratio,
            "hadamard": hadamard}
    want_state = state.clone()
    want = ref.compress_decode(state=want_state, **args)
    dev_state = state.to(DEV)
    got = compress_decode(state=dev_state, **_on(args)).cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    closes = torch.tensor([(p + 1) % ratio == 0 for p in positions])
    assert bool(got[~closes].eq(0).all()) and bool(got[closes].abs().amax(1).gt(0).all())
    assert torch.equal(dev_state.cpu(), want_state)  # the ring write, in place, and nothing else


def test_decode_token_by_token_equals_prefill() -> None:
    """Two requests decoded side by side from fresh rings give the prefill kernel's rows."""
    from dsv4hal.kernels.triton.compress import compress, compress_decode

    ratio, hd, length = 4, 128, 13
    layer = _layer(ratio, hd, 2 * length, 21)
    rows = layer.pop("kv_score").view(2, length, -1)
    state = ref.new_state(3, ratio, rows.shape[2]).to(DEV)
    params = _on({**layer, "ratio": ratio, "hadamard": True})
    got = [[], []]
    for p in range(length):
        out = compress_decode(rows[:, p].to(DEV), state, torch.tensor([2, 0], dtype=torch.int32, device=DEV),
                              torch.tensor([p, p], dtype=torch.int32, device=DEV), **params).cpu()
        if (p + 1) % ratio == 0:
            got[0].append(out[0])
            got[1].append(out[1])
    for b in range(2):
        want = compress(rows[b].contiguous().to(DEV), _cu((length,)).to(DEV), **params).cpu()
        torch.testing.assert_close(torch.stack(got[b]), want, rtol=1e-5, atol=1e-5)


def test_decode_strided_inputs() -> None:
    """Strided views (kv_score rows, slots, positions, the RoPE tables) read as their values."""
    from dsv4hal.kernels.triton.compress import compress_decode

    positions = (3, 8, 11, 1002)
    layer = _layer(4, 128, len(positions), 5)
    state = ref.new_state(5, 4, 512)
    state.normal_(generator=torch.Generator().manual_seed(1))
    args = {**layer, "slots": torch.tensor([4, 2, 1, 3], dtype=torch.int32),
            "positions": torch.tensor(positions, dtype=torch.int32), "ratio": 4, "hadamard": True}
    want_state = state.clone()
    want = ref.compress_decode(state=want_state, **args)
    wide = torch.zeros(len(positions), 700)
    wide[:, 100:612] = layer["kv_score"]
    table = torch.zeros(1024, 2, 32)
    table[:, 0], table[:, 1] = layer["cos"], layer["sin"]
    strided = {**args, "kv_score": wide[:, 100:612], "slots": torch.stack((args["slots"], args["slots"]), 1)[:, 0],
               "positions": torch.stack((args["positions"],) * 3, 1)[:, 1], "cos": table[:, 0], "sin": table[:, 1]}
    assert not strided["slots"].is_contiguous() and not strided["cos"].is_contiguous()
    dev_state = state.to(DEV)
    got = compress_decode(state=dev_state, **_on(strided)).cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(dev_state.cpu(), want_state)
