"""Under torch.compile, platform.ops.<op> refuses what eager refuses with the same typed error (validated while
Dynamo traces, before the arguments are flattened for the custom op), and a valid call's validation leaves nothing
in the graph. Compiles are slow on the CPU: shapes are tiny, the backend is "eager" where it shows the same thing,
and the cases of one op share a test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import dsv4hal
from dsv4hal.errors import BadCallError, Dsv4HalError, InvalidArgumentError
from dsv4hal.formats.v4_cache import V4PagedCache

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cpu() -> dsv4hal.Platform:
    return dsv4hal.select_platform("cpu")


def _eager_error(fn: Callable[..., Any], *args: Any) -> Dsv4HalError:
    with pytest.raises(Dsv4HalError) as e:
        fn(*args)
    return e.value


def _assert_compiled_like_eager(fn: Callable[..., Any], *args: Any, fullgraphs: tuple[bool, ...] = (True, False),
                                backend: str = "eager") -> None:
    """fn(*args) raises the same typed error (class, message) compiled, with and without fullgraph, as eagerly."""
    eager = _eager_error(fn, *args)
    for fullgraph in fullgraphs:
        torch._dynamo.reset()
        with pytest.raises(type(eager)) as e:
            torch.compile(fn, fullgraph=fullgraph, backend=backend)(*args)
        # Dynamo appends where in the user's code the call was traced; the message is eager's up to there
        assert str(e.value).startswith(str(eager)), (fullgraph, str(e.value), str(eager))
        if isinstance(eager, InvalidArgumentError):
            assert (e.value.op, e.value.argument, e.value.got) == (eager.op, eager.argument, eager.got)


def _topk_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.randn(2, 700), torch.tensor([700, 300], dtype=torch.int32),
            torch.arange(22, dtype=torch.int32).reshape(2, 11))


def test_compiled_call_refuses_bool_page_size_like_eager(cpu: dsv4hal.Platform) -> None:
    """indexer_topk(page_size=True) is InvalidArgumentError compiled (aot_eager, fullgraph or not) as in eager."""
    _assert_compiled_like_eager(lambda s, l, pt: cpu.ops.indexer_topk(s, l, 512, pt, True), *_topk_inputs(),
                                backend="aot_eager")


def test_compiled_call_refuses_bad_softmax_scales_like_eager(cpu: dsv4hal.Platform) -> None:
    """softmax_scale True, a string or a tensor is refused compiled as in eager (no float() conversion first)."""
    c = V4PagedCache.empty(1, 256)
    q = torch.randn(1, 64, 512).bfloat16()
    idx, ln, sink = torch.arange(64, dtype=torch.int32)[None], torch.tensor([8], dtype=torch.int32), torch.zeros(64)
    for scale in (True, "0.044", torch.tensor(0.044)):
        _assert_compiled_like_eager(
            lambda q, scale=scale: cpu.ops.sparse_attention_decode(q, c, idx, ln, sink, scale), q, fullgraphs=(True,))


def test_compiled_call_refuses_malformed_arguments_like_eager(cpu: dsv4hal.Platform) -> None:
    """A cache that is None or a raw tensor, a loc list, rms_eps None: eager's typed error, not one of flattening."""
    c = V4PagedCache.empty(1, 256)
    k, loc = torch.randn(4, 512).bfloat16(), torch.arange(4)
    for fn in (lambda k, loc: cpu.ops.pack_store(k, loc, None),
               lambda k, loc: cpu.ops.pack_store(k, loc, c.data),
               lambda k, loc: cpu.ops.pack_store(k, [0, 1, 2, 3], c)):
        _assert_compiled_like_eager(fn, k, loc)
    x, fn_, base, scale = torch.randn(2, 4, 8).bfloat16(), torch.zeros(4, 32), torch.zeros(4), torch.ones(1)
    _assert_compiled_like_eager(lambda x: cpu.ops.mhc_head(x, fn_, base, scale, None), x, fullgraphs=(True,))
    assert torch.equal(c.data, torch.zeros_like(c.data))  # nothing was stored by a refused call


def test_compiled_call_with_a_bad_signature_is_a_typed_error(cpu: dsv4hal.Platform) -> None:
    """Too many arguments or checked= under torch.compile: BadCallError naming the op, as in eager."""
    c = V4PagedCache.empty(1, 64)
    k, loc = torch.randn(4, 512).bfloat16(), torch.arange(4)
    _assert_compiled_like_eager(lambda k, loc: cpu.ops.pack_store(k, loc, c, 5), k, loc)
    _assert_compiled_like_eager(lambda k, loc: cpu.ops.pack_store(k, loc, c, checked=True), k, loc)
    with pytest.raises(BadCallError, match=r"pack_store\(k, loc, cache\)"):
        torch._dynamo.reset()
        torch.compile(lambda k: cpu.ops.pack_store(k), fullgraph=True, backend="eager")(k)


def test_compiled_valid_call_leaves_only_the_custom_op_in_the_graph(cpu: dsv4hal.Platform) -> None:
    """Validation runs while Dynamo traces: the graph of a valid call holds the op's custom op and nothing else,
    and its result equals eager's."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    s, lengths, pt = _topk_inputs()
    torch._dynamo.reset()
    got = torch.compile(lambda s, l, pt: cpu.ops.indexer_topk(s, l, 512, pt, 64), fullgraph=True,
                        backend=backend)(s, lengths, pt)
    want = cpu.ops.indexer_topk(s, lengths, 512, pt, 64)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    calls = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert [str(t) for t in calls if "dsv4hal" in str(t)] == [f"dsv4hal.indexer_topk_p{cpu.handle}"]
    assert all("dsv4hal" in str(t) or "getitem" in str(t) for t in calls), calls


def test_traced_function_validates_before_flattening(cpu: dsv4hal.Platform) -> None:
    """custom_ops.traced(bound op), called as Dynamo would, refuses a malformed call with the typed error, not an
    AttributeError or a schema error from the flattening."""
    from dsv4hal import custom_ops

    k, loc = torch.randn(4, 512).bfloat16(), torch.arange(4)
    with pytest.raises(InvalidArgumentError, match="'cache' expected a V4PagedCache, got None"):
        custom_ops.traced(cpu.ops.pack_store)(k, loc, None)
    x, fn_, base, scale = torch.randn(2, 4, 8).bfloat16(), torch.zeros(4, 32), torch.zeros(4), torch.ones(1)
    with pytest.raises(InvalidArgumentError, match="'rms_eps' expected a positive finite float, got None"):
        custom_ops.traced(cpu.ops.mhc_head)(x, fn_, base, scale, None)
