"""Slides and handouts (core.figures.slides): presentation fonts, still images of animations,
and the zips of a view's figures (SVG/PNG through the system Chromium) and tables (CSV)."""
import io
import zipfile

import pandas as pd
import pytest

from core.config import SchedulerConfig
from core.errors import ConfigError
from core.figures.animate import slot_animation
from core.figures.slides import chromium, figures_zip, for_presentation, still_figure, tables_zip
from core.figures.timeline import schedule_timeline
from core.lessons.scenarios import load_scenario
from core.lessons.schedules import run_policies
from core.lessons.slots import slot_grid
from core.sim.stepmodel import StepModel


def burst5():
    return run_policies(load_scenario("burst5"), ["static", "continuous"], SchedulerConfig(max_seqs=3),
                        StepModel("constant", step_ms=1.0))


def test_presentation_copies_have_fonts_of_at_least_16_px_and_leave_the_original_alone():
    fig = schedule_timeline(burst5())
    big = for_presentation(fig)
    assert big.layout.font.size >= 16 and big.layout.legend.font.size >= 16
    for ax in [k for k in big.layout if k.startswith(("xaxis", "yaxis"))]:
        assert big.layout[ax].tickfont.size >= 16
    assert all(a.font.size >= 16 for a in big.layout.annotations)
    assert fig.layout.font.size is None and fig.layout.legend.font.size is None     # the cached one unchanged


def test_a_still_animation_shows_its_last_frame_without_controls():
    sch = burst5()
    fig = slot_animation([(label, slot_grid(tr), tr.ids) for label, tr in sch])
    still = still_figure(fig)
    assert not still.frames and not still.layout.updatemenus and not still.layout.sliders
    last = fig.frames[-1]
    for i, d in zip(last.traces, last.data):      # what the last frame sets is what the still shows
        for prop, value in d.to_plotly_json().items():
            if prop != "type":
                assert list(still.data[i][prop]) == list(value)
    assert len(fig.frames) == 35                          # the original keeps its frames


def test_tables_zip_holds_one_csv_per_table_by_key():
    data = tables_zip({"sched summary": pd.DataFrame({"a": [1, 2]}), "sched/summary": pd.DataFrame({"b": [3]})})
    z = zipfile.ZipFile(io.BytesIO(data))
    assert z.namelist() == ["sched_summary.csv", "sched_summary_2.csv"]   # safe, distinct names
    assert z.read("sched_summary.csv").decode().splitlines() == ["a", "1", "2"]
    with pytest.raises(ConfigError, match="no tables"):
        tables_zip({})


def test_figures_zip_without_chromium_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chromium")
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ConfigError, match="Chromium"):
        figures_zip({"t": schedule_timeline(burst5())}, "svg")
    with pytest.raises(ConfigError, match="svg or png"):
        figures_zip({"t": schedule_timeline(burst5())}, "pdf")


@pytest.mark.slow
def test_figures_render_to_svg_and_png_with_the_system_chromium():
    if chromium() is None:
        pytest.skip("no Chromium on this machine")
    pytest.importorskip("kaleido")
    sch = burst5()
    figs = {"timeline": schedule_timeline(sch), "slots": slot_animation([(l, slot_grid(t), t.ids) for l, t in sch])}
    svg = zipfile.ZipFile(io.BytesIO(figures_zip(figs, "svg")))
    assert svg.namelist() == ["timeline.svg", "slots.svg"]
    assert svg.read("slots.svg").startswith(b"<svg") and b"R4" in svg.read("slots.svg")
    png = zipfile.ZipFile(io.BytesIO(figures_zip({"timeline": figs["timeline"]}, "png", scale=0.5)))
    assert png.read("timeline.png")[:8] == b"\x89PNG\r\n\x1a\n"
