"""The URL-key table in ui/urls.py: every bound widget is declared there once, presets reach the
widgets through it, and pages hold only pages."""
import ast
import re

import pytest

import ui
from core.lessons.scenarios import SCHEDULE_PRESETS
from tests.conftest import ROOT

PAGES = sorted((ROOT / "pages").glob("*.py"))
SOURCES = PAGES + sorted((ROOT / "ui").rglob("*.py"))


def test_every_bound_widget_goes_through_the_table():
    used = set()
    for path in SOURCES:
        text = path.read_text()
        used |= set(re.findall(r'bound\("([A-Za-z0-9_]+)"\)', text))
        used |= set(re.findall(r'option_input\("([A-Za-z0-9_]+)"', text))        # widgets made from declarations
        for group in re.findall(r"scheduler_inputs\(\{([^}]*)\}", text):
            used |= set(re.findall(r'\("([A-Za-z0-9_]+)",', group))
        for prefix in re.findall(r'step_model_controls\(("[A-Za-z0-9_]+")?', text):
            p = prefix.strip('"') or "s_"
            used |= {p + k for k in ui.STEP_MODEL_KEYS} & set(ui.URL_KEYS)
        if path.parent.name != "ui":
            assert 'bind="query-params"' not in text, f"{path.name}: bind a widget with **bound(key)"
    assert used == set(ui.URL_KEYS), "declared but unused / used but undeclared URL keys"
    with pytest.raises(KeyError, match="not declared"):
        ui.bound("nope")


def test_option_keys_name_real_options():
    from core.config import SchedulerConfig, options
    from core.sim.stepmodel import StepModel
    fields = {f"{cls.__name__}.{f.name}" for cls in (SchedulerConfig, StepModel) for f in options(cls)}
    for key, u in ui.URL_KEYS.items():
        assert not u.option or u.option == "policies" or u.option in fields, key


# The presets as the schedules page had them, keyed by widget, before they became option values.
OLD_SCHEDULE_PRESETS = {
    "chapter31": dict(pol=["serial", "static", "continuous", "chunked"], ms=0, tb=0, ch=2, kb=0, s_kind="affine",
                      s_step=10.0, s_base=20.0, s_pp=20.0, s_pd=20.0),
    "burst5": dict(pol=["static", "continuous"], ms=3, tb=0, ch=4, kb=0, s_kind="constant", s_step=1.0,
                   s_base=20.0, s_pp=20.0, s_pd=20.0),
    "shared_prefix": dict(pol=["static", "continuous", "chunked"], ms=32, tb=2048, ch=512, kb=0, s_kind="affine",
                          s_step=10.0, s_base=5.0, s_pp=0.05, s_pd=0.25),
    "poisson2000": dict(pol=["continuous", "chunked"], ms=256, tb=8192, ch=512, kb=0, s_kind="affine",
                        s_step=10.0, s_base=5.0, s_pp=0.02, s_pd=0.05),
    "custom": dict(pol=["serial", "static", "continuous", "chunked"], ms=0, tb=0, ch=2, kb=0, s_kind="affine",
                   s_step=10.0, s_base=20.0, s_pp=20.0, s_pd=20.0),
    "upload": dict(pol=["continuous", "chunked"], ms=64, tb=4096, ch=512, kb=0, s_kind="affine", s_step=10.0,
                   s_base=5.0, s_pp=0.02, s_pd=0.1),
}


@pytest.mark.parametrize("name", list(OLD_SCHEDULE_PRESETS))
def test_presets_set_the_same_widgets_as_before(name):
    got = ui.preset_widget_values("schedules", SCHEDULE_PRESETS[name])
    assert got == OLD_SCHEDULE_PRESETS[name]
    assert all(type(got[k]) is type(v) for k, v in OLD_SCHEDULE_PRESETS[name].items())


def test_scenario_labels_cover_the_presets():
    assert set(ui.SCENARIO_LABELS.values()) == set(SCHEDULE_PRESETS)


def test_pages_hold_only_pages():
    for path in PAGES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("pages"), f"{path.name} imports from pages/"
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports private {private} from {node.module}"
            elif isinstance(node, ast.Attribute):
                assert not node.attr.startswith("_") or node.attr.startswith("__"), f"{path.name}: .{node.attr}"
    assert not (ROOT / "pages" / "common.py").exists()


def test_option_widgets_are_generated_from_the_declarations():
    """A widget that sets a scheduler or step-model option is made by ui.widgets.option_input from
    the option's declaration (label, help, bounds): no page writes one by hand."""
    hand_made = []
    for path in PAGES:
        for call in re.findall(r"\.(?:number_input|toggle|slider)\((.*?bound\(\"([A-Za-z0-9_]+)\"\))", path.read_text(),
                               re.S):
            key = call[1]
            if ui.URL_KEYS[key].option.startswith(("SchedulerConfig.", "StepModel.")):
                hand_made.append(f"{path.name}: {key}")
    assert hand_made == []
    from core.config import SchedulerConfig, options
    labels = {f.name: f.metadata.get("label") for f in options(SchedulerConfig)}
    assert labels["max_seqs"] == "Max running sequences" and labels["kv_blocks"] == "KV blocks"
