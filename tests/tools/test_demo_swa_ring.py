"""The demo's SWA ring: after a random fill the SWA cache holds one 256-slot page a request (as an engine keeps only
the window), and decoding over it gives the bits of the run whose SWA cache mirrors the whole pool."""

from __future__ import annotations

from functools import partial

import torch

import dsv4hal
from dsv4hal.demo import run_demo
from dsv4hal.engine_model.model import DemoModel


def test_swa_ring_decodes_the_bits_of_the_full_swa_cache() -> None:
    """Random fill, 2 requests of 600 tokens, 2 decode steps of 2 tokens a request: every layer's outputs with the
    SWA ring equal those with the SWA cache as large as the pool, and the ring's cache is a page a request."""
    platform = dsv4hal.select_platform("cpu")
    models: dict[bool, DemoModel] = {}

    def make(ring: bool, cfg: object) -> DemoModel:
        models[ring] = DemoModel(platform, cfg, 2, 0, tokens_per_request=2, swa_ring=ring)  # type: ignore[arg-type]
        return models[ring]

    runs = {ring: run_demo(platform, batch=2, context=600, steps=2, fill="random", tokens_per_request=2,
                           make_model=partial(make, ring)) for ring in (True, False)}
    assert models[True].layers[0]["swa"].data.shape[0] == 3  # the null page and one a request
    assert models[False].layers[0]["swa"].data.shape[0] > 3
    for ring, full in zip(runs[True]["layer_outputs"], runs[False]["layer_outputs"]):
        for a, b in zip(ring, full):
            assert bool(torch.isfinite(a).all()) and torch.equal(a, b)


def test_swa_ring_maps_each_position_to_its_request_page_modulo_256() -> None:
    """full_to_swa sends request r's position p to slot (r + 1) * 256 + p % 256; the null page maps to -1."""
    from dataclasses import replace

    from dsv4hal.engine_model.config import DemoConfig

    model = DemoModel(dsv4hal.select_platform("cpu"), replace(DemoConfig(), max_pages=3), 2, swa_ring=True)
    req = torch.tensor([0, 0, 1, 1, 1])
    pos = torch.tensor([0, 700, 5, 256, 767])
    assert model.swa_loc(req, pos).tolist() == [256, 256 + 700 % 256, 512 + 5, 512, 512 + 767 % 256]
    assert bool((model.full_to_swa[:256] == -1).all())
