"""embvar_study.checks: the validation every numerical module shares, on numpy arrays, lists and torch tensors."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from embvar_study.checks import (as_float_array, check_at_least, check_finite, check_nonzero_rows, check_rank, check_real,
                                 check_same_shape, is_tensor)

torch = pytest.importorskip("torch")


def test_is_tensor_without_importing_torch_by_name():
    assert is_tensor(torch.ones(2)) and is_tensor(torch.nn.Parameter(torch.ones(2)))
    assert not any(is_tensor(v) for v in (np.ones(2), [1.0], 3.0, torch.float32, torch.nn.Linear(2, 2), "torch"))

    class Fake:                          # a class defined in a module called torch.x but without tensor methods
        __module__ = "torch.fake"
    assert not is_tensor(Fake())


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=3), elements=st.integers(-5, 5)),
       st.sampled_from([np.float32, np.float64, np.int64, np.bool_]))
def test_as_float_array_matches_numpy_conversion(ints, dtype):
    a = ints.astype(dtype)
    got = as_float_array(a, "X")
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, a.astype(np.float64))
    np.testing.assert_array_equal(as_float_array(torch.tensor(a), "X"), got)
    np.testing.assert_array_equal(as_float_array(a.tolist(), "X"), got)


def test_float64_input_is_not_copied():
    a = np.ones((3, 2))
    assert as_float_array(a, "X") is a


@pytest.mark.parametrize("x", [np.ones(3) + 2j, [1 + 0j, 2], np.ones(2, np.complex64)])
def test_complex_refused(x):
    with pytest.raises(ValueError, match=r"X: expected real numbers, got complex dtype complex(64|128); pass its"):
        as_float_array(x, "X")


def test_complex_tensor_refused_with_the_numpy_wording():
    with pytest.raises(ValueError) as t:
        check_real(torch.ones(2, dtype=torch.complex128), "X")
    with pytest.raises(ValueError) as n:
        check_real(np.ones(2, dtype=np.complex128), "X")
    assert str(t.value) == str(n.value)


ERRORS = [
    (lambda: as_float_array([[1.0, np.nan]], "X"), "X: expected finite values, got 1 NaN/inf entry in shape (1, 2)"),
    (lambda: as_float_array([np.inf, -np.inf], "v"), "v: expected finite values, got 2 NaN/inf entries in shape (2)"),
    (lambda: as_float_array(np.zeros((0, 3)), "X"), "X: expected a non-empty array"),
    (lambda: as_float_array(np.zeros(3), "X", min_ndim=2, dims="(..., N, d)"), "X: expected shape (..., N, d), got shape (3)"),
    (lambda: as_float_array(np.zeros((2, 2, 2)), "X", ndim=2), "X: expected shape 2-d array, got shape (2, 2, 2)"),
    (lambda: as_float_array(["a", "b"], "X"), "X: expected a numeric array, got list"),
    (lambda: as_float_array([[1.0], [1.0, 2.0]], "X", dims="(N, d)"), "X: expected a numeric array (N, d), got list"),
    (lambda: as_float_array(object(), "X"), "X: expected a numeric array, got object"),
    (lambda: as_float_array(torch.tensor([1.0, float("nan")]), "t"), "t: expected finite values, got 1 NaN/inf entry in shape (2)"),
    (lambda: check_rank((2,), "X", min_ndim=3), "X: expected shape array with at least 3 dimension(s), got shape (2)"),
    (lambda: check_finite(torch.tensor([[float("inf")]]), "t"), "t: expected finite values, got 1 NaN/inf entry in shape (1, 1)"),
    (lambda: check_same_shape(np.zeros(2), torch.zeros(3), "a", "b"), "a and b: expected the same shape, got (2) and (3)"),
    (lambda: check_at_least(2, 3, "runs", "runs (K)"), "runs: expected at least 3 runs (K), got 2"),
    (lambda: check_nonzero_rows(np.array([[1.0, 0], [0, 0], [0, 0]]), "X"), "X: cosine needs non-zero vectors, got 2 zero-norm vector(s) (first at index (1,))"),
    (lambda: check_nonzero_rows(torch.tensor([[[1.0], [0.0]]]), "t"), "t: cosine needs non-zero vectors, got 1 zero-norm vector(s) (first at index (0, 1))"),
    (lambda: check_nonzero_rows(np.array([[1e-3, 0]]), "X", eps=1e-2), "X: cosine needs non-zero vectors, got 1 zero-norm vector(s)"),
]


@pytest.mark.parametrize("call,message", ERRORS, ids=[m[:40] for _, m in ERRORS])
def test_error_messages(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value)


def test_non_finite_allowed_when_asked():
    assert np.isnan(as_float_array([np.nan], "X", finite=False)).all()
