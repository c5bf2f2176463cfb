"""The FP8 encoders of the Triton kernels: the integer encoder (everywhere) and the hardware conversion (NVIDIA from
SM89) give the same e4m3fn bytes, both equal to torch's cast, for every value the kernels pass them (clamped to
+-448): every representable value, every midpoint between neighbours (the ties), their neighbours one fp32 ulp
away, subnormals, and random values over the whole range. On the CPU the hardware path is off and the encoder is
checked against torch; on an SM89+ GPU both paths run."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dsv4hal.kernels.triton import fp8_codec  # noqa: E402
from dsv4hal.kernels.triton.fp8_codec import _decode_fp8, fp8_bits, hardware_fp8  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@triton.jit
def _encode_kernel(x_ptr, out_ptr, n, HW: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, fp8_bits(tl.load(x_ptr + i, mask=m, other=0.0), False, HW), mask=m)


@triton.jit
def _decode_kernel(b_ptr, out_ptr, FNUZ: tl.constexpr):
    i = tl.arange(0, 256)
    tl.store(out_ptr + i, _decode_fp8(tl.load(b_ptr + i), FNUZ))


@pytest.mark.parametrize("fnuz", [False, True])
def test_decoder_gives_torchs_bits_for_every_byte(fnuz: bool) -> None:
    """Every finite byte decodes to torch's fp32 value bit for bit, -0 (0x80 in e4m3fn) included: the GPU compile
    of a negation can turn it into +0 (seen on the H200)."""
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn).float()
    out = torch.empty(256, dtype=torch.float32, device=DEV)
    _decode_kernel[(1,)](codes.to(DEV), out, FNUZ=fnuz)
    finite = torch.isfinite(want)
    assert int(finite.sum()) == (255 if fnuz else 254)
    assert torch.equal(out.cpu().view(torch.int32)[finite], want.view(torch.int32)[finite])


def _values(random: int) -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    pos = torch.unique(codes[torch.isfinite(codes) & (codes >= 0)])  # 0 .. 448, sorted
    mids = (pos[1:] + pos[:-1]) / 2  # exact in fp32: the round-half-to-even cases
    edges = torch.cat([pos, mids])
    up = torch.nextafter(edges, torch.full_like(edges, 1e9))
    down = torch.nextafter(edges, torch.zeros_like(edges))
    g = torch.Generator().manual_seed(0)
    rand = torch.cat([torch.rand(random, generator=g) * 448,
                      torch.exp2(torch.rand(random, generator=g) * 30 - 24)])  # log-uniform, subnormals included
    v = torch.cat([edges, up, down, rand]).clamp(max=448.0)
    return torch.cat([v, -v])


def _encode(x: torch.Tensor, hw: bool) -> torch.Tensor:
    out = torch.empty(x.numel(), dtype=torch.uint8, device=x.device)
    _encode_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), HW=hw, BLOCK=1024)
    return out


def test_integer_encoder_matches_torch() -> None:
    """The integer FP8 e4m3fn encoder gives the same bytes as torch's cast."""
    x = _values(2000 if DEV.type == "cpu" else 200000).to(DEV)
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(_encode(x, False), want)


def test_hardware_path_is_off_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hardware FP8 cast is off on the CPU, under the interpreter and when disabled."""
    assert not hardware_fp8(torch.device("cpu"))
    monkeypatch.setattr(fp8_codec, "_INTERPRET", True)
    assert not hardware_fp8(torch.device("cuda", 0))  # interpreting: never, whatever the device
    monkeypatch.setattr(fp8_codec, "_INTERPRET", False)
    monkeypatch.setattr(fp8_codec, "HARDWARE_FP8_CAST", False)
    assert not hardware_fp8(torch.device("cuda", 0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9)
                    or torch.version.hip is not None, reason="needs an NVIDIA GPU with an fp8 conversion (SM89+)")
def test_hardware_conversion_gives_the_encoders_bytes() -> None:
    """On an SM89+ GPU the hardware FP8 cast gives the integer encoder's bytes."""
    assert hardware_fp8(DEV)
    x = _values(1 << 20).to(DEV)
    hw, sw = _encode(x, True), _encode(x, False)
    bad = (hw != sw).nonzero().flatten()
    assert bad.numel() == 0, [(float(x[i]), int(hw[i]), int(sw[i])) for i in bad[:10].tolist()]
    assert torch.equal(hw, x.to(torch.float8_e4m3fn).view(torch.uint8))
