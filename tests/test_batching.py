"""embvar_study._batching: blocks, promotion, broadcasting, rescaling and the numpy/torch backends."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import embvar_study._batching as B
from embvar_study._batching import (NUMPY_OPS, TorchOps, stable_argsort, backend_of, leading_blocks, broadcast_lead, chunked_apply, valid_floats,
                                    put_last, rescaled_pow2, running_extreme, take_last, top_k)

torch = pytest.importorskip("torch")
FAST = settings(max_examples=40, deadline=None)
CPU = TorchOps("cpu")


@FAST
@given(st.lists(st.integers(1, 5), min_size=0, max_size=3), st.integers(1, 40), st.integers(1, 60))
def test_blocks_cover_the_leading_shape_once(lead, cost, budget):
    lead = tuple(lead)
    old, B._CHUNK_ELEMS = B._CHUNK_ELEMS, budget
    try:
        seen = np.zeros(lead, dtype=int)
        for idx, shape in leading_blocks(lead, cost):
            assert seen[idx].shape == shape
            seen[idx] += 1
    finally:
        B._CHUNK_ELEMS = old
    assert (seen == 1).all()


@FAST
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 200), st.integers(0, 2**16))
def test_chunked_equals_unchunked_on_both_backends(a, b, budget, seed):
    x = np.random.default_rng(seed).normal(size=(a, b, 3, 2)).astype(np.float32)
    f = lambda blk: (blk * blk).sum(-1)      # float64 inside: the block was promoted
    whole = f(x.astype(np.float64))
    old, B._CHUNK_ELEMS = B._CHUNK_ELEMS, budget
    try:
        np.testing.assert_array_equal(chunked_apply(f, [x], (a, b), cost=6), whole)
        got = chunked_apply(f, [torch.tensor(x)], (a, b), cost=6)
        assert got.dtype == torch.float64
        np.testing.assert_array_equal(got.numpy(), whole)
    finally:
        B._CHUNK_ELEMS = old


def test_floats_keeps_float32_without_copy_and_validates():
    x = np.ones((3, 2), np.float32)
    assert valid_floats(x, "X", NUMPY_OPS, min_ndim=2, dims="") is x
    t = torch.ones(3, 2, dtype=torch.float16)
    assert valid_floats(t, "X", CPU, min_ndim=2, dims="").dtype == torch.float16
    assert valid_floats(x, "X", CPU, min_ndim=2, dims="").dtype == torch.float32       # numpy joins the torch backend
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy(); y[2, 1] = bad
        for v, xp in ((y, NUMPY_OPS), (torch.tensor(y), CPU)):
            with pytest.raises(ValueError, match="X: expected finite values, got 1 NaN/inf entry in shape \\(3, 2\\)"):
                valid_floats(v, "X", xp, min_ndim=2, dims="")
    with pytest.raises(ValueError, match="X: expected real numbers"):
        valid_floats(torch.ones(2, 2, dtype=torch.complex64), "X", CPU, min_ndim=2, dims="")


def test_backend_choice_and_devices():
    assert backend_of([np.ones(1), [1.0]], ["X", "Y"]) is NUMPY_OPS
    xp = backend_of([np.ones(1), torch.ones(1)], ["X", "Y"])
    assert isinstance(xp, TorchOps) and xp.zeros((2,)).dtype == torch.float64
    with pytest.raises(ValueError, match="X and Y: expected tensors on one device, got cpu and meta"):
        backend_of([torch.ones(1), torch.ones(1, device="meta")], ["X", "Y"])


def test_broadcast_lead_views_and_message():
    x, y = np.ones((4, 3)), np.ones((2, 1, 4, 5))
    lead, (p, q) = broadcast_lead([x, y], ["X", "Y"], [2, 2])
    assert lead == (2, 1) and p.shape == (2, 1, 4, 3) and np.shares_memory(p, x)
    with pytest.raises(ValueError, match=r"X and Y: leading \(batch\) dimensions must broadcast, got shapes \(3, 4, 3\) and \(2, 4, 5\)$"):
        broadcast_lead([np.ones((3, 4, 3)), np.ones((2, 4, 5)), np.ones((3, 4))], ["X", "Y"], [2, 2, 1])


@FAST
@given(st.floats(-1000, 1000), st.integers(0, 2**16))
def test_rescaled_is_exact_and_of_order_one(log2_scale, seed):
    x = np.random.default_rng(seed).normal(size=(3, 4, 5)) * 2.0 ** log2_scale
    for X in (x, torch.tensor(x)):
        y, e = rescaled_pow2(X)
        m = np.abs(np.asarray(y)).max(axis=(-2, -1))
        assert ((m >= 0.5) & (m < 1)).all()
        back = np.ldexp(np.asarray(y), np.asarray(e))
        np.testing.assert_array_equal(back, x)


def test_index_operations_agree_across_backends():
    rng = np.random.default_rng(0)
    v = rng.integers(0, 5, size=(3, 8)).astype(float)          # many ties: the sort must be stable
    t = torch.tensor(v)
    np.testing.assert_array_equal(stable_argsort(t).numpy(), stable_argsort(v))
    np.testing.assert_array_equal(stable_argsort(v), np.argsort(v, axis=-1, kind="stable"))
    o = stable_argsort(v)
    np.testing.assert_array_equal(take_last(t, torch.tensor(o)).numpy(), take_last(v, o))
    np.testing.assert_array_equal(put_last(np.empty_like(v), o, take_last(v, o)), v)
    for op, ref in ((max, np.maximum), (min, np.minimum)):
        np.testing.assert_array_equal(running_extreme(t, op).numpy(), ref.accumulate(v, axis=-1))
    S = rng.normal(size=(2, 6, 6))
    for k in (1, 3, 6):
        want = np.argsort(-S, axis=-1)[..., :k]
        np.testing.assert_array_equal(top_k(S.copy(), k), want)
        np.testing.assert_array_equal(top_k(torch.tensor(S), k).numpy(), want)


def test_torch_ldexp_does_not_overflow_in_the_factor():
    x = torch.tensor([1e-300, 5e-320], dtype=torch.float64)
    got = CPU.ldexp(x, torch.tensor([1000, 1060]))
    np.testing.assert_array_equal(got.numpy(), [math.ldexp(1e-300, 1000), math.ldexp(5e-320, 1060)])
