"""Speculative decoding: where the probability mass goes, and when speculation pays."""
import pandas as pd
import streamlit as st

from core.errors import InputError
from core.figures.spec import (
    acceptance_by_position_figure,
    break_even_chart,
    expected_tokens_chart,
    mass_sankey,
    monte_carlo_figure,
)
from core.formulas import speculative as spec
from ui import bound, ensure_app_frame, show_chart, show_table, spec_traces, theme

ensure_app_frame()

st.title("Speculative decoding")
st.markdown("A draft proposes x ~ q; the target, with distribution p, accepts it with probability "
            "min(1, p(x)/q(x)). On rejection it samples from the residual normalize(max(p − q, 0)). "
            "Accepted mass min(p, q) plus the rejected mass sent through the residual is exactly p.")

PRESETS = {
    "paris": ("Chapter: Paris / Lyon", ["Paris", "Lyon"], [0.6, 0.4], [0.8, 0.2]),
    "exercise": ("Exercise: p = [0.3, 0.7], q = [0.6, 0.4]", ["Paris", "Lyon"], [0.3, 0.7], [0.6, 0.4]),
    "three": ("Three candidates", ["A", "B", "C"], [0.2, 0.5, 0.3], [0.6, 0.3, 0.1]),
}
preset = st.segmented_control("Preset", list(PRESETS), default="paris", required=True, **bound("sp_preset"))
preset = preset if preset in PRESETS else "paris"      # "?sp_preset=" in a link selects none
desc, names, p0, q0 = PRESETS[preset]
seed = (names, p0, q0)
if "sp_pq" in st.query_params:   # a shared link carries its edited table
    try:
        seed = spec.table_from_link(st.query_params["sp_pq"])
        desc = f"{desc} — edited, from the link"
    except InputError as e:
        st.warning(f"{e}; showing the preset.", icon=":material/link_off:")
        del st.query_params["sp_pq"]
st.caption(desc)
edited = st.data_editor(pd.DataFrame({"candidate": seed[0], "p (target)": seed[1], "q (draft)": seed[2]}),
                        num_rows="dynamic", hide_index=True, key=f"sp_table_{preset}_{abs(hash(str(seed)))}")
try:
    names, p, q = spec.candidates(edited["candidate"].tolist(), edited["p (target)"].tolist(),
                                  edited["q (draft)"].tolist())
except InputError as e:
    st.error(f"Distributions: {e}")
    st.stop()
# the table goes into the link when it differs from the preset
if (list(names), list(p), list(q)) != (PRESETS[preset][1], PRESETS[preset][2], PRESETS[preset][3]):
    st.query_params["sp_pq"] = spec.table_to_link(names, p, q)
elif "sp_pq" in st.query_params:
    del st.query_params["sp_pq"]
acc = spec.acceptance(p, q)
res = spec.residual(p, q)
final = spec.final_distribution(p, q)
wrong = spec.wrong_final_distribution(p, q)
alpha = spec.alpha(p, q)
show_table(pd.DataFrame({"candidate": names, "p": p, "q": q, "accept min(1, p/q)": acc,
                           "accepted mass min(p, q)": spec.accepted_mass(p, q), "residual": res, "final": final,
                           "wrong rule": wrong}),
             hide_index=True, key="sp_numbers",
             column_config={c: st.column_config.NumberColumn(format="%.4g")
                            for c in ("p", "q", "accept min(1, p/q)", "accepted mass min(p, q)", "residual",
                                      "final", "wrong rule")})
c1, c2, c3 = st.columns(3)
c1.metric("α = Σ min(p, q) (acceptance rate)", f"{alpha:.4g}")
c2.metric("Rejection mass", f"{spec.rejection_mass(p, q):.4g}")
c3.metric(f"Wrong rule: {names[0]}", f"{wrong[0]:.4g}", delta=f"{wrong[0] - p[0]:+.4g} vs p", delta_color="inverse")
c1, c2 = st.columns(2)
show_chart(mass_sankey(p, q, names, theme=theme()), key="sp_sankey", where=c1)
show_chart(mass_sankey(p, q, names, wrong=True, theme=theme()), key="sp_sankey_wrong", where=c2)
st.caption(":blue-badge[given] preset values or your edits. "
           f"The wrong rule's largest error is {spec.wrong_rule_error(p, q):.4g}.")

st.header("Monte Carlo check")
c1, c2 = st.columns(2)
draws = c1.number_input("Draws", 100, 5_000_000, 100_000, step=10_000, **bound("sp_draws"))
seed = c2.number_input("Seed", 0, 2**31 - 1, 0, **bound("sp_seed"))
mc = spec.monte_carlo(p, q, int(draws), int(seed))
mc_wrong = spec.monte_carlo(p, q, int(draws), int(seed), wrong=True)
show_chart(monte_carlo_figure(mc, p, names, mc_wrong), key="sp_mc")
st.caption(f":orange-badge[simulated] {int(draws):,} seeded draws through the exact algorithm "
           f"(acceptance rate {mc['accept_rate']:.4f}, expected α = {alpha:.4f}); band = 99% normal interval "
           "around p.")

st.header("How many tokens per verification, and when it pays")
c1, c2, c3 = st.columns(3)
a_sel = c1.slider("α", 0.0, 1.0, float(round(alpha, 2)), 0.01, **bound("sp_alpha"))
gamma = c2.slider("γ (draft tokens)", 1, 16, 4, **bound("sp_gamma"))
verify = c3.number_input("Verify cost (× one decode step)", 0.1, 10.0, 1.0, 0.1, **bound("sp_verify"))
show_chart(expected_tokens_chart([0.5, 0.7, 0.8, 0.9, a_sel], 12, (a_sel, gamma)), key="sp_expected")
show_chart(break_even_chart(a_sel, gamma, verify), key="sp_breakeven")
st.caption(f"Expected tokens per verification (1 − α^(γ+1))/(1 − α) = {spec.expected_tokens(a_sel, gamma):.4g}; "
           f"speculation loses once a draft step costs more than "
           f"{spec.break_even_draft_cost(a_sel, gamma, verify):.4g} target steps. Assumes i.i.d. acceptance and "
           "an unsaturated target; a busy batched server changes the verify cost.")

st.header("Acceptance measured in a captured trace")
found = spec_traces()
if not found:
    st.info("No trace with `spec` events in data/traces yet. A `measured` trace from the runner with "
            "speculative decoding enables this view.")
else:
    name = st.selectbox("Trace", list(found), key="sp_trace")
    positions, rates, counts = found[name]
    show_chart(acceptance_by_position_figure(positions, rates, counts), key="sp_positions")
