"""The one percentile every report uses (specd.stats.percentile)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specd.stats import percentile


def test_percentile_interpolates_between_the_nearest_ranks():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # any order
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)  # the usual median
    # nearest rank would say 95 here; interpolation between 95 and 96 says 95.05
    assert percentile(range(1, 101), 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError, match="percentile q"):
        percentile([1.0], 101)


@given(
    values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40),
    q=st.floats(0, 100),
)
def test_percentile_is_numpys_default(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)
