import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core.order import stable_order


@given(st.lists(st.integers(-3, 2**33), max_size=300), st.sampled_from([np.int64, np.int32, np.uint32]),
       st.integers(0, 40))
@settings(max_examples=200, deadline=None)
def test_stable_order_is_numpys_stable_argsort(keys, dtype, shift):
    # keys spread over 16-bit, 32-bit and wider ranges, with many ties (shifted down)
    k = np.array([x >> shift for x in keys], dtype=np.int64)
    if dtype is not np.int64:
        info = np.iinfo(dtype)
        k = np.clip(k, info.min, info.max).astype(dtype)
    assert stable_order(k).tolist() == np.argsort(k, kind="stable").tolist()


def test_stable_order_two_passes_on_large_ids():
    rng = np.random.default_rng(1)
    k = rng.integers(0, 3 * 2**16, 50_000)           # above 16 bits: the two-pass radix path
    assert (stable_order(k) == np.argsort(k, kind="stable")).all()
