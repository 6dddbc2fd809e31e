"""Exercises: chapter 31's six exercises, the serving lesson's ten recall questions and five on routing a fleet, each
with a link to the page that works it, answer checks, and a hidden reference answer."""
import streamlit as st

from core.lessons.exercises import EXERCISES, GROUPS
from ui import ensure_app_frame, md

ensure_app_frame()

st.title("Exercises")
st.caption("Work each one on the linked page (it opens with the right parameters), enter your numbers, then "
           "reveal the reference answer. Numeric answers are checked against the core's own computation "
           "within the stated tolerance.")

for group, prefix in GROUPS:
    st.header(group)
    for ex in (e for e in EXERCISES if e.key.startswith(prefix)):
        st.subheader(ex.source)
        st.markdown(md(ex.question))
        if ex.link:
            st.markdown(f"[Try it on the page ↗](/{ex.link})")
        if ex.numeric:
            cols = st.columns(min(len(ex.numeric), 4))
            results = []
            for i, n in enumerate(ex.numeric):
                v = cols[i % len(cols)].number_input(n.label, value=None, format="%.6g", key=f"ex_{ex.key}_{i}",
                                                     placeholder="your answer")
                results.append((n, v, n.check(v)))
            entered = [r for r in results if r[2] is not None]
            if entered:
                ok = sum(1 for r in entered if r[2])
                wrong = [(n, v) for n, v, good in entered if not good]
                asked = "" if len(entered) == len(results) else f" ({len(results)} asked)"
                if wrong:     # a wrong answer must not look like a right one: red, named, with a direction
                    hints = "; ".join(f"**{md(n.label)}**: {v:.6g} is too {'high' if v > n.value() else 'low'} "
                                      f"(right within ± {n.tolerance:g}{' ' + md(n.unit) if n.unit else ''})"
                                      for n, v in wrong)
                    st.error(f"{len(wrong)} of {len(entered)} entered not right{asked} — {hints}",
                             icon=":material/close:")
                elif ok == len(results):
                    st.success(f"All {ok} correct", icon=":material/check:")
                else:
                    st.info(f"{ok} of {len(entered)} entered correct so far{asked}", icon=":material/check:")
        with st.expander("Reference answer"):
            st.markdown(md(ex.answer))
            for n in ex.numeric:
                st.markdown(f"- {md(n.label)}: **{n.value():.6g}** {md(n.unit)} (± {n.tolerance:g})")
