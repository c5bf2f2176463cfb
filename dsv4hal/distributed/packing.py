"""One dispatched row as bytes: the token (bf16, or fp8 with its fp32 1x128 block scales) then its k local expert ids
(int32) and k weights (fp32). One byte tensor per exchange: a single collective moves tokens and routing together."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4hal.formats.fp8 import fp8_dtype
from dsv4hal.formats.fp8_block import act_quant_1x128

FP8_BLOCK = 128


@dataclass(frozen=True)
class RowCodec:
    hidden: int
    top_k: int
    fp8: str | None = None  # None: bf16 rows; else the FP8 flavor tokens are quantized to
    pow2_scales: bool = False

    @property
    def payload_bytes(self) -> int:
        if self.fp8 is None:
            return 2 * self.hidden
        return self.hidden + 4 * (self.hidden // FP8_BLOCK)

    @property
    def row_bytes(self) -> int:
        return self.payload_bytes + 8 * self.top_k

    def payload(self, x: torch.Tensor) -> torch.Tensor:
        """bf16 [T, H] -> uint8 [T, payload_bytes] (quantized on the way for fp8)."""
        if self.fp8 is None:
            return x.contiguous().view(torch.uint8)
        if x.shape[0] == 0:  # an empty quantization has stride-0 scales, which no byte view takes
            return torch.empty((0, self.payload_bytes), dtype=torch.uint8, device=x.device)
        q, scale = act_quant_1x128(x, self.fp8, pow2_scales=self.pow2_scales)
        return torch.cat([q.view(torch.uint8), scale.contiguous().view(torch.uint8)], dim=1)

    def pack(self, payload: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """uint8 [N, P], int32 [N, k], fp32 [N, k] -> uint8 [N, row_bytes]."""
        return torch.cat([payload, ids.to(torch.int32).contiguous().view(torch.uint8),
                          weights.to(torch.float32).contiguous().view(torch.uint8)], dim=1)

    def unpack(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """uint8 [N, row_bytes] -> (x bf16 [N, H] or fp8 [N, H], fp32 scales [N, H/128] or None, ids int32 [N, k],
        weights fp32 [N, k])."""
        p, k = self.payload_bytes, self.top_k
        if rows.shape[0] == 0:
            rows = torch.zeros((1, self.row_bytes), dtype=torch.uint8, device=rows.device)[:0]
        ids = rows[:, p:p + 4 * k].contiguous().view(torch.int32)
        weights = rows[:, p + 4 * k:].contiguous().view(torch.float32)
        if self.fp8 is None:
            return rows[:, :p].contiguous().view(torch.bfloat16), None, ids, weights
        h = self.hidden
        x = rows[:, :h].contiguous().view(fp8_dtype(self.fp8))
        return x, rows[:, h:p].contiguous().view(torch.float32), ids, weights
