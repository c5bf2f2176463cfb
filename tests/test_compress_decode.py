"""The compressor's decode form: token by token through the state ring it equals the prefill form, and its
validator refuses bad inputs with typed errors."""

from __future__ import annotations

import pytest
import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.compress import validate_decode
from dsv4hal.reference.compress import compress, compress_decode, new_state
from dsv4hal.reference.rope import make_rope_table


@pytest.mark.parametrize(("ratio", "hd", "hadamard", "ring"), [(4, 512, False, None), (4, 128, True, 16),
                                                             (128, 128, False, None)])
def test_decode_equals_prefill(ratio: int, hd: int, hadamard: bool, ring: int | None) -> None:
    g = torch.Generator().manual_seed(ratio + hd)
    coff = 2 if ratio == 4 else 1
    length, width = 260, 2 * coff * hd
    rows = torch.randn(2, length, width, generator=g)
    ape, w = torch.randn(ratio, coff * hd, generator=g) * 0.3, torch.rand(hd, generator=g) + 0.5
    cos, sin = make_rope_table(512, 160000.0)
    state = new_state(3, ratio, width, ring=ring)
    got: list[list[torch.Tensor]] = [[], []]
    for p in range(length):  # two requests decoded side by side, in state slots 2 and 0
        out = compress_decode(rows[:, p], state, torch.tensor([2, 0], dtype=torch.int32),
                              torch.tensor([p, p], dtype=torch.int32), ape, w, cos, sin, ratio, hadamard=hadamard)
        if (p + 1) % ratio == 0:
            got[0].append(out[0])
            got[1].append(out[1])
        else:
            assert out.eq(0).all()
    for b in range(2):
        want = compress(rows[b], torch.tensor([0, length], dtype=torch.int32), ape, w, cos, sin, ratio,
                        hadamard=hadamard)
        assert torch.equal(torch.stack(got[b]), want)


def _args() -> dict:
    return dict(kv_score=torch.zeros(2, 2048), state=new_state(4, 4, 2048), slots=torch.tensor([0, 3]).int(),
                positions=torch.tensor([3, 9]).int(), ape=torch.zeros(4, 1024), norm_weight=torch.ones(512),
                cos=torch.ones(64, 32), sin=torch.zeros(64, 32), ratio=4)


@pytest.mark.parametrize(("change", "argument"), [
    ({"state": new_state(4, 4, 2048)[:, :4].contiguous()}, "state"),
    ({"state": new_state(4, 4, 1024)}, "state"),
    ({"slots": torch.tensor([0, 3])}, "slots"),
    ({"positions": torch.tensor([3]).int()}, "positions"),
    ({"ratio": 8}, "ratio"),
    ({"slots": torch.tensor([0, 4]).int()}, "slots"),
    ({"positions": torch.tensor([3, 64]).int()}, "positions"),
    ({"sin": torch.zeros(32, 32)}, "sin"),
])
def test_validator(change: dict, argument: str) -> None:
    validate_decode(**_args(), checked=True)
    with pytest.raises(InvalidArgumentError) as e:
        validate_decode(**{**_args(), **change}, checked=True)
    assert e.value.argument == argument
