"""Widgets several pages share: the step-time model controls, the notice area."""

import dataclasses
import typing

import streamlit as st

from core.config import SchedulerConfig
from core.errors import InputError
from core.formulas.kv import GPUS, MODELS
from core.sim.stepmodel import STEP_MODELS, StepModel
from ui.urls import URL_KEYS, bound

OPTION_GROUPS = {"SchedulerConfig": SchedulerConfig, "StepModel": StepModel}
UI_MAX = 1_000_000        # a number input's upper end where the option declares none


def _declaration(option: str):
    group, name = option.split(".")
    cls = OPTION_GROUPS[group]
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    tp = typing.get_type_hints(cls)[name]
    base = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
    return f.metadata, base


def option_input(key: str, default, container=None, **kw):
    """The widget of the option that URL key `key` sets (ui.urls.URL_KEYS: "SchedulerConfig.max_seqs"),
    generated from the option's declaration (core.config.opt): its label, its help, its bounds and
    type; where the key says so, 0 stands for the option's None ("0 = no limit"), and None is
    returned for it. `kw` overrides (a page's own help, format, min_value, max_value; a short label
    for a narrow column)."""
    uk = URL_KEYS[key]
    decl, tp = _declaration(uk.option)
    w = container if container is not None else st
    label = kw.pop("label", None) or decl["label"] + (f" (0 = {decl['none']})" if uk.zero_is_none else "")
    kw.setdefault("help", decl["help"])
    if tp is bool:
        return w.toggle(label, default, **bound(key), **kw)
    lo = 0 if uk.zero_is_none else decl.get("minimum") or 0
    hi = decl.get("maximum") or UI_MAX
    if tp is int:
        lo, hi, default = int(lo), int(hi), int(default)
    else:
        lo, hi, default = float(lo), float(hi), float(default)
    v = w.number_input(label, min_value=kw.pop("min_value", lo), max_value=kw.pop("max_value", hi), value=default,
                       **bound(key), **kw)
    return None if uk.zero_is_none and v == 0 else v


def scheduler_inputs(keys: dict[str, tuple[str, object]]) -> dict:
    """Widgets for the SchedulerConfig options `keys` names ({option: (URL key, the page's
    default)}), in that order: {option: value} (None where 0 means no limit)."""
    return {name: option_input(key, default) for name, (key, default) in keys.items()}


# URL key suffixes of the step-model widgets (ui.urls.URL_KEYS: prefix + suffix) -> StepModel option
STEP_MODEL_KEYS = {"kind": "kind", "step": "step_ms", "base": "base_ms", "pp": "prefill_ms_per_token",
                   "pd": "decode_ms_per_seq", "ppk": "prefill_ms_per_kpos", "pdk": "decode_ms_per_kpos",
                   "pch": "prefill_ms_per_chunk", "model": "model", "gpu": "gpu"}


def step_model_controls(prefix: str = "s_", kinds=None, defaults: dict | None = None) -> StepModel:
    """Sidebar widgets for the step-time model (bound to the URL under `prefix` + step, base, pp,
    pd, ...; each generated from StepModel's declarations). `kinds`: the models offered (one:
    no selector). `defaults`: the page's starting values, by option name."""
    d = {"step_ms": 10.0, "base_ms": 20.0, "prefill_ms_per_token": 20.0, "decode_ms_per_seq": 20.0,
         "prefill_ms_per_kpos": 0.0, "decode_ms_per_kpos": 0.0, "prefill_ms_per_chunk": 0.0, **(defaults or {})}
    kinds = list(kinds or STEP_MODELS)
    kind = kinds[0] if len(kinds) == 1 else st.segmented_control(
        "Step-time model", kinds, default="affine", required=True, **bound(prefix + "kind"))

    def num(key, fmt=None):
        return option_input(prefix + key, d[STEP_MODEL_KEYS[key]], **({"format": fmt} if fmt else {}))
    if kind == "constant":
        return StepModel("constant", step_ms=option_input(prefix + "step", d["step_ms"], min_value=0.001))
    base_ms = num("base")
    if kind in ("affine", "features"):
        pp = num("pp", "%.4f")
        pd_ = num("pd", "%.4f")
        more = {}
        if kind == "features":   # python -m core fit prints these for a measured trace
            more = dict(prefill_ms_per_kpos=num("ppk", "%.5f"), decode_ms_per_kpos=num("pdk", "%.5f"),
                        prefill_ms_per_chunk=num("pch", "%.4f"))
        try:
            return StepModel(kind, base_ms=base_ms, prefill_ms_per_token=pp, decode_ms_per_seq=pd_, **more)
        except InputError as e:
            st.error(f"Step model: {e}")
            st.stop()
    model = st.selectbox(_declaration("StepModel.model")[0]["label"], list(MODELS), **bound(prefix + "model"))
    gpu = st.selectbox(_declaration("StepModel.gpu")[0]["label"], list(GPUS), index=list(GPUS).index("A100-80GB"),
                       **bound(prefix + "gpu"))
    return StepModel("roofline", base_ms=base_ms, model=model, gpu=gpu)


def notices(notes: list[str], what: str = "these numbers") -> None:
    """At most one notice area: one note as a caption with a warning icon, several folded into
    one expander whose title counts them (a lecture screen is not a wall of yellow boxes)."""
    if len(notes) == 1:
        st.caption(f":material/warning: {notes[0]}")
    elif notes:
        with st.expander(f":material/warning: {len(notes)} notes on {what}"):
            for n in notes:
                st.markdown(f"- {n}")
