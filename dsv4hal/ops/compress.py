"""Op contract: `compress` (spec 4.1), prefill form over whole requests that start at position 0.

compress(kv_score, cu_seqlens, ape, norm_weight, cos, sin, ratio, eps=1e-6, hadamard=False, num_groups=None)
    -> fp32 [M, hd]
    kv_score: fp32 [N, 2*coff*hd], the per-token projection x @ wkv_gate^T of all requests packed together;
        ratio 4 (coff 2): [kv_ov | kv_cur | score_ov | score_cur], ratio 128 (coff 1): [kv | score], each hd wide.
    cu_seqlens: int32 [B+1], 0 = cu[0] <= cu[1] <= ... <= cu[B] = N; request b owns rows cu[b]:cu[b+1]
        (positions 0..L_b-1).
    ape: fp32 [ratio, coff*hd] positional bias of the scores; norm_weight: fp32 [hd] RMSNorm weight;
    cos, sin: fp32 [max_pos, 32] RoPE table of the layer (YaRN or not is the caller's choice).
    ratio in {4, 128}; hd in {512 (main), 128 (indexer)}; hadamard only with hd 128.
Output: request b emits L_b // ratio rows in group order, requests concatenated (M = sum_b L_b // ratio).
Group i covers positions [i*ratio, i*ratio + ratio - 1]:
    C128: c = sum_w softmax_w(score[w] + ape[w]) * kv[w] over the group's 128 tokens, per channel.
    C4: window of 8 rows: rows 0..3 = positions 4i-4..4i-1 from the ov halves with ape[w, :hd], rows 4..7 =
        positions 4i..4i+3 from the cur halves with ape[w, hd:]; group 0 masks the overlap rows (score -inf,
        kv 0); per-channel softmax over the 8 rows.
    Then c = RMSNorm(c) * norm_weight (eps), RoPE on the last 64 dims at position i*ratio, and if hadamard a
    Walsh-Hadamard transform (Sylvester order) scaled by 128^-0.5. fp32 throughout.
Every used position i*ratio must be < max_pos.
num_groups: None, or M itself (an int) when the caller knows it, as an engine that scheduled the prompts does.
    Without it a kernel reads M from cu_seqlens on the device (a host sync, so the call cannot be captured in a
    CUDA graph); with it the output shape is known on the host: no sync, graph-safe. Unchecked mode trusts it
    (every implementation returns num_groups rows: the first of the M, then zero rows past M); checked mode, and
    any call whose cu_seqlens lives on the CPU, refuses a value other than M.

Value checks read cu_seqlens. Checked mode reads it (a device sync) and all floating inputs (finite).
Unchecked mode reads it only when it lives on the CPU, where reading costs no device sync. A group position past
the RoPE table (unchecked cu_seqlens on a GPU) is clamped into it: that group rotates by the table's last row.

compress_decode(kv_score, state, slots, positions, ape, norm_weight, cos, sin, ratio, eps=1e-6, hadamard=False)
    -> fp32 [B, hd]: the decode form, one new token per row. state fp32 [S, ring, 2*coff*hd] holds each
    request's last `ring` kv_score rows (ring >= 8 for C4, >= 128 for C128; new_state() makes one: kv 0,
    score -inf); row b writes its kv_score into state[slots[b], positions[b] % ring] (in place), and when
    its token closes a group ((positions[b] + 1) % ratio == 0) returns that group's compressed row, the
    same value the prefill form gives; other rows are 0 (the engine writes them to the dummy slot).
    slots, positions int32 [B]. Fixed shapes, no host sync: CUDA-graph safe. Rows sharing a slot share a ring:
    which of their writes lands there, and their outputs, are unspecified (padding rows may share a dummy slot).
    Checked mode reads slots and positions (ranges) and every float input: kv_score, ape, norm_weight, cos and
    sin finite; the addressed rings' kv finite and their scores finite or -inf (new_state's empty marker).
    Unchecked, out-of-range indices stay inside the buffers (reference and portable kernel alike):
    slots: a value outside [0, S) (-1 = unused entry, any other negative, S or more) skips the row: no ring is
        read or written and its output is a zero row (what a row that closes no group gives).
    positions: a value outside [0, max_pos) (negative, max_pos or more, up to int32 max) is clamped to 0 or
        max_pos - 1 before use: the ring row written, whether the token closes a group and the RoPE row all
        follow the clamped position. An empty table (max_pos 0) rotates by nothing.
"""

from __future__ import annotations

import math

import torch

from dsv4hal.checks import check_choice, check_finite, check_same_device, check_tensor, describe, show
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.compressor_state import window_rows
from dsv4hal.ops.signatures import define

OP = "compress"
RATIOS = (4, 128)
HEAD_DIMS = (512, 128)
HADAMARD_DIM = 128
ROPE_PAIRS = 32


def coff(ratio: int) -> int:
    """C4 windows span the previous group too, so its projection carries two halves per kv/score."""
    return 2 if ratio == 4 else 1


def _head_dim(op: str, kv_score: torch.Tensor, ratio: int) -> int:
    """hd implied by kv_score's width; raises unless it is 512 or 128."""
    width, parts = kv_score.shape[1], 2 * coff(ratio)
    hd = width // parts
    if width % parts or hd not in HEAD_DIMS:
        want = " or ".join(str(parts * h) for h in HEAD_DIMS)
        raise InvalidArgumentError(
            op, "kv_score", f"width {want} (2*coff*hd for ratio {ratio}, hd in {HEAD_DIMS})", describe(kv_score)
        )
    return hd


def _check_scalars(op: str, eps: object, hadamard: object, hd: int) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise InvalidArgumentError(op, "eps", "a positive finite float", show(eps))
    if not isinstance(hadamard, bool):
        raise InvalidArgumentError(op, "hadamard", "a bool", show(hadamard))
    if hadamard and hd != HADAMARD_DIM:
        raise InvalidArgumentError(
            op, "hadamard", f"False for hd {hd}", "True", remedy="only the indexer compressor (hd 128) rotates"
        )


def _check_layer(op: str, kv_score: object, ratio: object, ape: object, norm_weight: object, cos: object,
                 sin: object) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """Checks both forms share: ratio, kv_score [*, 2*coff*hd] fp32, the layer's ape, norm weight and RoPE
    table. Returns kv_score, hd and the parameter tensors by name."""
    if isinstance(ratio, bool) or not isinstance(ratio, int):
        raise InvalidArgumentError(op, "ratio", "an int in (4, 128)", show(ratio))
    check_choice(op, "ratio", ratio, RATIOS)
    kv_score = check_tensor(op, "kv_score", kv_score, dtype=torch.float32, shape=(None, None))
    hd = _head_dim(op, kv_score, ratio)
    tensors = {
        "ape": check_tensor(op, "ape", ape, dtype=torch.float32, shape=(ratio, coff(ratio) * hd)),
        "norm_weight": check_tensor(op, "norm_weight", norm_weight, dtype=torch.float32, shape=(hd,)),
        "cos": check_tensor(op, "cos", cos, dtype=torch.float32, shape=(None, ROPE_PAIRS)),
        "sin": check_tensor(op, "sin", sin, dtype=torch.float32, shape=(None, ROPE_PAIRS)),
    }
    if tensors["sin"].shape != tensors["cos"].shape:
        raise InvalidArgumentError(op, "sin", f"the shape of cos {tuple(tensors['cos'].shape)}", describe(sin))
    return kv_score, hd, tensors


def num_groups_of(cu_seqlens: torch.Tensor, ratio: int) -> int:
    """M = sum_b L_b // ratio, the prefill form's row count, read from cu_seqlens (a host sync when it lives on a
    GPU: what num_groups spares a caller who knows M)."""
    cu = cu_seqlens.long()
    return int(torch.div(cu[1:] - cu[:-1], ratio, rounding_mode="floor").sum())


def _check_num_groups(num_groups: object) -> None:
    if num_groups is not None and (isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0):
        raise InvalidArgumentError(OP, "num_groups", "None or an int >= 0 (M = sum_b L_b // ratio)", show(num_groups),
                                   remedy="pass the number of compressed rows the prompts close, or None")


def _check_cu_seqlens_values(cu: torch.Tensor, n: int, ratio: int, max_pos: int, num_groups: int | None) -> None:
    """Reads cu_seqlens: starts at 0, ends at N, non-decreasing, every used position inside the table, and M equal
    to num_groups when given."""
    cu = cu.long()
    if int(cu[0]) != 0 or int(cu[-1]) != n:
        raise InvalidArgumentError(OP, "cu_seqlens", f"to start at 0 and end at N={n}", f"{int(cu[0])}..{int(cu[-1])}")
    lengths = cu[1:] - cu[:-1]
    if bool((lengths < 0).any()):
        raise InvalidArgumentError(OP, "cu_seqlens", "non-decreasing offsets", "a decreasing step")
    if num_groups is not None and (m := num_groups_of(cu, ratio)) != num_groups:
        raise InvalidArgumentError(OP, "num_groups", f"M = sum_b L_b // ratio = {m}", show(num_groups),
                                   remedy="pass the count cu_seqlens gives, or None")
    longest = int(lengths.max()) if lengths.numel() else 0
    last_pos = (longest // ratio - 1) * ratio  # first position of the last group of the longest request
    if last_pos >= max_pos:
        raise InvalidArgumentError(
            OP, "cos", f"a RoPE table covering position {last_pos}", f"{max_pos} positions",
            remedy="build the table with max_pos beyond the longest request",
        )


def validate(
    kv_score: object,
    cu_seqlens: object,
    ape: object,
    norm_weight: object,
    cos: object,
    sin: object,
    ratio: object,
    eps: object = 1e-6,
    hadamard: object = False,
    num_groups: object = None,
    *,
    checked: bool = False,
) -> None:
    """Raise InvalidArgumentError unless the arguments meet the compress contract (module docstring)."""
    kv_score, hd, tensors = _check_layer(OP, kv_score, ratio, ape, norm_weight, cos, sin)
    cu = check_tensor(OP, "cu_seqlens", cu_seqlens, dtype=torch.int32, shape=(None,))
    if cu.shape[0] < 2:
        raise InvalidArgumentError(OP, "cu_seqlens", "shape [B+1] with B >= 1", describe(cu))
    check_same_device(OP, {"cu_seqlens": cu, **tensors}, kv_score.device, "kv_score")
    _check_scalars(OP, eps, hadamard, hd)
    _check_num_groups(num_groups)
    # a CPU cu_seqlens is read (no device sync), except while torch.compile traces: its values are not known then
    if checked or (cu.device.type == "cpu" and not torch.compiler.is_compiling()):
        _check_cu_seqlens_values(cu, kv_score.shape[0], ratio, tensors["cos"].shape[0], num_groups)  # type: ignore[arg-type]
    if checked:
        for name, t in (("kv_score", kv_score), *tensors.items()):
            check_finite(OP, name, t)


def case(
    kv_score: torch.Tensor,
    cu_seqlens: torch.Tensor,
    ape: torch.Tensor,
    norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    ratio: int,
    eps: float = 1e-6,
    hadamard: bool = False,
    num_groups: int | None = None,
) -> dict[str, object]:
    """Hashable features for kernel selection: ratio, hd (512 main / 128 indexer), hadamard."""
    return {"ratio": int(ratio), "hd": int(norm_weight.shape[0]), "hadamard": bool(hadamard)}


DECODE_OP = "compress_decode"


def validate_decode(
    kv_score: object,
    state: object,
    slots: object,
    positions: object,
    ape: object,
    norm_weight: object,
    cos: object,
    sin: object,
    ratio: object,
    eps: object = 1e-6,
    hadamard: object = False,
    *,
    checked: bool = False,
) -> None:
    """Raise InvalidArgumentError unless the arguments meet the compress_decode contract (module docstring)."""
    op = DECODE_OP
    kv_score, hd, tensors = _check_layer(op, kv_score, ratio, ape, norm_weight, cos, sin)
    b, width = kv_score.shape
    st = check_tensor(op, "state", state, dtype=torch.float32, shape=(None, None, width), contiguous=True)
    window = window_rows(ratio)
    if st.shape[1] < window:
        raise InvalidArgumentError(op, "state", f"a ring of at least {window} rows for ratio {ratio}", describe(st),
                                   remedy="make it with dsv4hal.formats.compressor_state.new_state")
    tensors["slots"] = check_tensor(op, "slots", slots, dtype=torch.int32, shape=(b,))
    tensors["positions"] = check_tensor(op, "positions", positions, dtype=torch.int32, shape=(b,))
    check_same_device(op, {"state": st, **tensors}, kv_score.device, "kv_score")
    _check_scalars(op, eps, hadamard, hd)
    if checked and b:
        slot, pos = tensors["slots"], tensors["positions"]
        if bool(((slot < 0) | (slot >= st.shape[0])).any()):
            raise InvalidArgumentError(op, "slots", f"values in [0, {st.shape[0]})", f"{int(slot.min())}..."
                                       f"{int(slot.max())}")
        if bool(((pos < 0) | (pos >= tensors["cos"].shape[0])).any()):
            raise InvalidArgumentError(op, "positions", f"values in [0, {tensors['cos'].shape[0]}) (the RoPE table)",
                                       f"{int(pos.min())}...{int(pos.max())}")
        for name in ("kv_score", "ape", "norm_weight", "cos", "sin"):
            check_finite(op, name, kv_score if name == "kv_score" else tensors[name])
        _check_rings_finite(st, slot, width // 2)
    elif checked:  # no rows: nothing is read but the layer's parameters
        for name in ("ape", "norm_weight", "cos", "sin"):
            check_finite(op, name, tensors[name])


def _check_rings_finite(state: torch.Tensor, slots: torch.Tensor, half: int) -> None:
    """Checked mode: the rings the call reads hold finite kv; their scores are finite or -inf (a row not yet
    written: new_state's marker, which weighs 0)."""
    rings = state[slots.long()]
    if not bool(torch.isfinite(rings[..., :half]).all()):
        raise InvalidArgumentError(DECODE_OP, "state", "finite kv halves in the addressed rings", "NaN or infinity",
                                   remedy="inspect what wrote the ring (prefill seeding or an earlier step)")
    scores = rings[..., half:]
    if bool((torch.isnan(scores) | (scores == float("inf"))).any()):
        raise InvalidArgumentError(DECODE_OP, "state", "score halves finite or -inf in the addressed rings",
                                   "NaN or +inf", remedy="inspect what wrote the ring (prefill seeding or an "
                                   "earlier step)")


def case_decode(kv_score, state, slots, positions, ape, norm_weight, cos, sin, ratio, eps=1e-6,  # noqa: ANN001
                hadamard=False) -> dict[str, object]:
    return {"ratio": int(ratio), "hd": int(norm_weight.shape[0]), "hadamard": bool(hadamard),
            "ring": int(state.shape[1])}


def fake(kv_score, cu_seqlens, ape, norm_weight, cos, sin, ratio, eps=1e-6, hadamard=False,  # noqa: ANN001
         num_groups=None) -> torch.Tensor:  # noqa: ANN001
    """The output's shape and dtype (under torch.compile): sum_b L_b // ratio rows, the caller's num_groups or
    read from cu_seqlens (a data-dependent size)."""
    rows = torch.library.get_ctx().new_dynamic_size() if num_groups is None else num_groups
    return kv_score.new_empty(rows, norm_weight.shape[0])


def fake_decode(kv_score, state, slots, positions, ape, norm_weight, cos, sin, ratio, eps=1e-6,  # noqa: ANN001
                hadamard=False) -> torch.Tensor:  # noqa: ANN001
    """The output's shape and dtype (under torch.compile)."""
    return kv_score.new_empty(kv_score.shape[0], norm_weight.shape[0])


@define(validate=validate, case=case, memo=False, fake=fake)  # validation reads cu_seqlens when it is on the CPU
def compress(kv_score: torch.Tensor, cu_seqlens: torch.Tensor, ape: torch.Tensor, norm_weight: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor, ratio: int, eps: float = 1e-6, hadamard: bool = False,
             num_groups: int | None = None) -> torch.Tensor:
    """The C4 (overlapping windows) and C128 compressors over whole requests from position 0 (prefill form),
    with RMSNorm, RoPE and, for the indexer, a Hadamard rotation; fp32 throughout (spec 4.1).

    Arguments:
        kv_score: (N, 2 * coff * hd), torch.float32: x @ wkv_gate^T of all requests packed; ratio 4 (coff 2):
            [kv_ov | kv_cur | score_ov | score_cur], ratio 128 (coff 1): [kv | score], each hd wide.
        cu_seqlens: (B + 1,), torch.int32: 0 = cu[0] <= ... <= cu[B] = N; request b owns rows cu[b]:cu[b+1].
        ape: (ratio, coff * hd), torch.float32: positional bias of the scores.
        norm_weight: (hd,), torch.float32: RMSNorm weight; hd in {512 (main), 128 (indexer)}.
        cos, sin: (max_pos, 32), torch.float32: the layer's RoPE table.
        ratio: 4 or 128 (an int).
        eps: RMSNorm epsilon, a positive finite float.
        hadamard: True only with hd 128 (the indexer compressor).
        num_groups: None, or M (an int) when the caller knows it: then no host sync and the call can be captured
            in a CUDA graph. Unchecked mode trusts it (rows past the true M are 0); checked mode verifies it.

    Returns:
        (M, hd), torch.float32, M = sum_b L_b // ratio: request b's groups in order, requests concatenated. Group
        i pools positions [i*ratio, i*ratio + ratio) (C4: 8 rows, the previous group's from the ov halves, masked
        for group 0) by a per-channel softmax of score + ape, then RMSNorm * norm_weight, RoPE on the last 64
        dims at position i*ratio, and the scaled Walsh-Hadamard transform if hadamard.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices, widths not 2*coff*hd, hadamard with hd 512,
    cu_seqlens not from 0 to N or decreasing, a RoPE table shorter than the last group's position, num_groups not
    None or an int >= 0, or other than M (cu_seqlens is read when on the CPU or in checked mode). Checked mode also
    refuses non-finite inputs. Unchecked with cu_seqlens on a GPU, a group past the RoPE table rotates by its last
    row (never a read outside cos/sin).
    """


@define(validate=validate_decode, case=case_decode, fake=fake_decode, mutates=("state",))
def compress_decode(kv_score: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                    ape: torch.Tensor, norm_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ratio: int,
                    eps: float = 1e-6, hadamard: bool = False) -> torch.Tensor:
    """The compressors' decode form: one new token per row, each request's last kv_score rows kept in a ring.
    Fixed shapes, no host sync: CUDA-graph safe.

    Arguments:
        kv_score: (B, 2 * coff * hd), torch.float32: the new tokens' projections (as compress).
        state: (S, ring, 2 * coff * hd), torch.float32, contiguous; ring >= 8 for C4, >= 128 for C128
            (dsv4hal.formats.compressor_state.new_state makes one: kv 0, score -inf). Mutated: row b writes its
            kv_score into state[slots[b], positions[b] % ring].
        slots: (B,), torch.int32: each row's ring; rows sharing a ring give unspecified results. Unchecked, a
            slot outside [0, S) (-1 = unused entry) skips the row: no ring read or written, a zero row out.
        positions: (B,), torch.int32: each new token's position. Unchecked, one outside [0, max_pos) is clamped
            to 0 or max_pos - 1 (ring row, group closing and RoPE row follow the clamped value).
        ape, norm_weight, cos, sin, ratio, eps, hadamard: as compress.

    Returns:
        (B, hd), torch.float32: for a row whose token closes a group ((positions[b] + 1) % ratio == 0) the value
        compress gives for that group; 0 for other rows.

    Rejected (InvalidArgumentError): as compress, and a ring shorter than the window. Checked mode also refuses
    slots outside [0, S), positions outside the RoPE table, non-finite inputs and addressed rings holding NaN or
    +inf.
    """
