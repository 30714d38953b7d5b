"""Coverage of nominal 95% intervals over seeds on clustered data with a known mean (issue 21, item 1)."""
import numpy as np
import pytest

from embvar_study.stats import seed_interval, cluster_bootstrap_ci

MU, N_STUDIES, N_PROBES = 0.3, 4000, 20


def _studies(C: int, n: int, seed: int) -> np.ndarray:  # (n, C, I): cluster effect + probe noise, probes correlated within a cluster
    rng = np.random.default_rng(seed)
    return MU + 0.05 * rng.standard_normal((n, C, 1)) + 0.03 * rng.standard_normal((n, C, N_PROBES))


@pytest.mark.parametrize("C", [3, 5, 10])
def test_seed_interval_covers(C):
    y = _studies(C, N_STUDIES, C)
    r = seed_interval(np.moveaxis(y.mean(-1), 1, 0))          # (C, n_studies): one call for all studies
    cover = float(((r["low"] <= MU) & (MU <= r["high"])).mean())
    print(f"t interval, {C} clusters: coverage {100 * cover:.1f}% over {N_STUDIES} studies")
    assert 0.93 <= cover <= 0.97


def test_old_cluster_bootstrap_undercovers_at_3():
    y = _studies(3, 300, 99)                                   # fewer studies: one bootstrap call each
    cover = np.mean([(c.low <= MU <= c.high) for c in (cluster_bootstrap_ci(s, n_resamples=999, seed=i) for i, s in enumerate(y))])
    print(f"cluster bootstrap, 3 clusters: coverage {100 * cover:.1f}% over 300 studies")
    assert cover < 0.9
