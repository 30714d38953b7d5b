"embvar_study.compare: arrays of layers, the table, the HTML page, and the CLI's one-line errors."
import subprocess, sys
import numpy as np
import pytest
from embvar_study.compare import compare, write_compare_html

rng = np.random.default_rng(0)
A = rng.normal(size=(2, 30, 6))
B = A[::-1] @ np.linalg.qr(rng.normal(size=(6, 6)))[0] + 0.05 * rng.normal(size=A.shape)   # layers swapped, rotated

def test_arrays_table_and_names():
    t = compare(A, B, None, n_resamples=5)
    names = set(t["measure"])
    for part in ["svcca", "pwcca", "cka", "procrustes", "cknna", "mutual_knn", "rsa"]:
        assert any(part in n for n in names), part
    cka = t[t.measure == "linear_cka"].set_index(["layer_a", "layer_b"])["value"]
    assert cka[(0, 1)] > 0.99 and cka[(1, 0)] > 0.99 and cka[(0, 0)] < 0.9     # finds the swap
    assert (t["ci_low"] <= t["ci_high"]).all()

def test_html(tmp_path):
    out = write_compare_html(compare(A, B, n_resamples=3, measures=["linear_cka", "svcca"]), str(tmp_path))
    page = open(out).read()
    assert page.count("<img") == 2 and "linear cka" in page.replace("_", " ")

def test_mismatch_one_line():
    with pytest.raises(ValueError, match="same probes"): compare(A, B[:, :20])

def test_cli_errors_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-c", "from embvar_study.cli import main; main()", "compare", "x", "y",
                        "--probes", str(tmp_path / "none.txt"), "--out", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--probes" in r.stderr
