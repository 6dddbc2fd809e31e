"""Batch seats step by step (core.lessons.slots) and their animation (core.figures.animate): the seat
grid against the batch events it is drawn from, and hand-worked static vs continuous."""
import numpy as np
import pytest

from core.config import SchedulerConfig
from core.figures.animate import SPEEDS, slot_animation
from core.lessons.scenarios import load_scenario
from core.lessons.schedules import run_policies
from core.lessons.slots import DECODE, EMPTY, HELD, PREFILL, slot_grid, step_story
from core.sim.simulate import simulate
from core.sim.stepmodel import StepModel
from core.workload import make_workload

UNIT = StepModel("constant", step_ms=1.0)


def burst5(policy):
    (_, tr), = run_policies(load_scenario("burst5"), [policy], SchedulerConfig(max_seqs=3), UNIT)
    return tr


def test_burst5_static_leaves_seats_idle_and_continuous_refills_them():
    # Outputs [5, 20, 10, 15, 10], three seats, one token per request per step (no chunking).
    static, cont = slot_grid(burst5("static")), slot_grid(burst5("continuous"))
    # static: R1-R3 run until R2's 20th token (steps 0-19), then R4, R5 until R4's 15th (20-34)
    assert static.total_steps == 35 and static.seats == 3
    assert static.idle_fraction() == pytest.approx(1 - 60 / (3 * 35))   # 60 tokens = busy seat-steps
    assert static.req[0, :5].tolist() == [0] * 5 and (static.req[0, 5:20] == -1).all()   # R1's seat idles
    assert static.req[0, 20] == 3 and static.req[1, 20] == 4             # R4, R5 seated together at step 20
    # continuous: R1 ends at step 4 and R4 takes its seat at step 5; R3 ends at 9, R5 seated at 10
    assert cont.total_steps == 20 and cont.idle_fraction() == 0.0
    assert cont.req[0, 4] == 0 and cont.req[0, 5] == 3 and cont.kind[0, 5] == PREFILL
    assert cont.req[2, 9] == 2 and cont.req[2, 10] == 4
    ids = load_scenario("burst5").ids
    story = step_story(cont, ids, 5)
    assert "prefill: R4" in story and "seated: R4" in story and "freed: R1" in story and "3/3 seats busy" in story


def _check_against_batch(tr, grid):
    """Every batch row of the shown steps is in exactly one seat at its step's column, with its
    kind and tokens; every computed cell is a batch row; a request keeps one seat per stay."""
    b = tr.batch
    col = {int(s): j for j, s in enumerate(grid.steps)}
    b = b[b["step"].isin(list(col))]
    computed = (grid.kind == PREFILL) | (grid.kind == DECODE)
    assert int(computed.sum()) == len(b)
    for step, req, kind, tokens in zip(b["step"], b["req"], b["kind"], b["tokens"]):
        j = col[int(step)]
        seats = np.flatnonzero(grid.req[:, j] == req)
        assert len(seats) == 1
        assert grid.kind[seats[0], j] == (PREFILL if kind == "prefill" else DECODE)
        assert grid.tokens[seats[0], j] == tokens
    assert set(np.unique(grid.kind)) <= {EMPTY, PREFILL, DECODE, HELD}
    assert ((grid.req >= 0) == (grid.kind != EMPTY)).all()


@pytest.mark.parametrize("cfg", [
    SchedulerConfig("continuous", max_seqs=4, token_budget=12, chunk=5),
    SchedulerConfig("static", max_seqs=3),
    SchedulerConfig("continuous", max_seqs=6, block_size=2, kv_blocks=14),     # preempts
])
def test_the_grid_holds_exactly_the_batch_events(cfg):
    rng = np.random.default_rng(7)
    w = make_workload([(f"Q{i}", float(rng.integers(0, 40)), int(rng.integers(1, 12)), int(rng.integers(1, 9)))
                       for i in range(14)])
    tr = simulate(w, cfg, UNIT)
    grid = slot_grid(tr)
    _check_against_batch(tr, grid)
    if cfg.kv_blocks:
        assert len(tr.preempts)                           # the case meant to preempt does
    # a request's seat is constant between its first and last step (absent preemption)
    for r in range(len(w)):
        seats = {int(s) for s in np.flatnonzero((grid.req == r).any(axis=1))}
        if not (tr.preempts["req"] == r).any():
            assert len(seats) <= 1


def test_long_runs_show_their_first_steps_and_large_batches_are_refused():
    tr = burst5("serial")
    grid = slot_grid(tr, max_steps=12)
    assert len(grid.steps) == 12 and grid.total_steps == 60 and grid.truncated
    _check_against_batch(tr, grid)
    assert slot_grid(burst5("continuous"), max_seats=2) is None
    given = run_policies(load_scenario("chapter31"), ["continuous"], SchedulerConfig(), UNIT)[0][1]
    given.steps = given.steps.iloc[0:0]                     # no step events: nothing to draw
    assert slot_grid(given) is None


def test_the_animation_has_one_frame_per_step_and_moves_only_light_traces():
    grids = [(label, slot_grid(tr), tr.ids) for label, tr in
             (("static", burst5("static")), ("continuous", burst5("continuous")))]
    fig = slot_animation(grids)
    assert len(fig.frames) == 35                           # the longer run's steps
    assert len(fig.layout.sliders[0].steps) == 35
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert labels[:len(SPEEDS)] == [text for _, text in SPEEDS] and "pause" in labels[-1]
    for f in fig.frames:                                   # the curtain and the story line per schedule
        assert len(f.data) == 4 and all(d.type == "scatter" for d in f.data)
    # at frame 5 the continuous curtain starts right after step 5; past its 20 steps it stays at 19
    cont_curtain = fig.frames[5].data[2]
    assert min(cont_curtain.x) == 5.5
    assert min(fig.frames[30].data[2].x) == 19.5 and "done after 20 steps" in fig.frames[30].data[3].text[0]
    assert fig.layout.height <= 900
