"""Links that spell what no widget can hold open the page with a notice, never an error
(issue 27, item 6)."""
import pytest

from tests.helpers import open_page


@pytest.mark.parametrize("page,params", [
    ("schedules", {"ms": "inf"}), ("kv", {"pg_bs": "Infinity"}), ("tiles", {"at_T": "inf"}),
    ("speculative", {"sp_draws": "inf"}), ("roofline", {"rf_batch": "-inf"}), ("load", {"ld_seed": "nan"}),
])
def test_non_finite_numbers_in_a_link(page, params):
    at = open_page(page, params)      # open_page asserts there was no exception
    key = next(iter(params))
    assert key not in at.query_params   # dropped (with a notice on the first run), the widget at its default


def test_an_empty_choice_and_a_huge_token_id():
    at = open_page("speculative", {"sp_preset": ""})
    assert not at.exception
    at = open_page("kv", {"px_a": "99999999999999999999999"})
    assert not at.exception
    said = " ".join(e.value for e in [*at.error, *at.warning])
    assert "token ids must be in 0.." in said
