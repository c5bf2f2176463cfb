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
    """compress_decode one token at a time gives the same compressed rows as the prefill compress."""
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
        # the same arithmetic in another batching: equal here, within a few ULPs where the CPU's kernels (the
        # Hadamard's matmul) split the work by batch size, as on some GPU hosts' CPUs
        torch.testing.assert_close(torch.stack(got[b]), want, rtol=4e-6, atol=1e-6)


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
    """Each malformed compress_decode argument (state, slots, positions, ratio, sin) is refused by name."""
    validate_decode(**_args(), checked=True)
    with pytest.raises(InvalidArgumentError) as e:
        validate_decode(**{**_args(), **change}, checked=True)
    assert e.value.argument == argument


def _poisoned(name: str, value: float) -> dict:
    args = _args()
    t = args[name]
    if name == "state":
        t[3, 5, 100 if value != float("-inf") else 1500] = value  # slot 3 is addressed (kv half, score half)
    else:
        t.view(-1)[7] = value
    return args


@pytest.mark.parametrize(("name", "value"), [("kv_score", float("nan")), ("state", float("nan")),
                                             ("state", float("inf")), ("norm_weight", float("nan")),
                                             ("ape", float("inf")), ("cos", float("nan")), ("sin", float("-inf"))])
def test_checked_mode_refuses_every_non_finite_float(name: str, value: float) -> None:
    """A NaN or inf in kv_score, state, norm_weight, ape, cos or sin is refused by checked mode, naming the argument."""
    args = _poisoned(name, value)
    validate_decode(**args)  # unchecked mode reads no values
    with pytest.raises(InvalidArgumentError) as e:
        validate_decode(**args, checked=True)
    assert e.value.argument == name


def test_checked_mode_state_rules() -> None:
    """Checked mode ignores NaN in unaddressed state slots and accepts -inf scores as empty."""
    args = _args()
    args["state"][1, 2, 5] = float("nan")  # slot 1 is not addressed: never read
    validate_decode(**args, checked=True)  # and new_state's -inf scores are the empty marker
    args = _args()
    args["state"][3, 2, 1500] = float("-inf")  # -inf in a score half: weight 0
    validate_decode(**args, checked=True)
    args["state"][0, 2, 5] = float("-inf")  # -inf in a kv half of an addressed ring
    with pytest.raises(InvalidArgumentError, match="kv halves"):
        validate_decode(**args, checked=True)


@pytest.mark.parametrize("eps", [True, float("inf"), float("nan"), -1e-6, "1e-6"])
def test_eps_refused_in_both_forms(eps: object) -> None:
    """compress and compress_decode refuse an eps that is not a positive finite float."""
    from dsv4hal.ops.compress import validate

    with pytest.raises(InvalidArgumentError) as e:
        validate_decode(**_args(), eps=eps)
    assert e.value.argument == "eps"
    a = _args()
    pre = dict(kv_score=a["kv_score"], cu_seqlens=torch.tensor([0, 1, 2]).int(), ape=a["ape"],
               norm_weight=a["norm_weight"], cos=a["cos"], sin=a["sin"], ratio=4)
    validate(**pre, checked=True)
    with pytest.raises(InvalidArgumentError) as e:
        validate(**pre, eps=eps)
    assert e.value.argument == "eps"
