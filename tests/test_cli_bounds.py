"""Values past what the tools can hold are refused in one line naming the flag (issue 27, item
10): never a traceback, a spin or a crash at save."""
import json

import pytest

from core.__main__ import main
from tests.conftest import DATA
from tests.helpers import peak_mib

W = str(DATA / "workloads" / "burst5.json")
TRACE = str(DATA / "traces" / "shared_prefix_caching_on.json.gz")


@pytest.mark.parametrize("args,names", [
    (["sweep", W, "--rates", "1e308", "--json"], ("--rates", "1e6")),
    (["simulate", W, "--block-size", "100000000000000000000", "--out", "{out}"], ("block_size", "1048576")),
    (["simulate", W, "--block-size", "1000000000", "--out", "{out}"], ("block_size",)),
    (["simulate", W, "--step-ms", "1e308", "--out", "{out}"], ("step_ms",)),
    (["simulate", W, "--kv-blocks", "100000000000", "--out", "{out}"], ("kv_blocks",)),
    (["fit", TRACE, "--from-requests", "--kv-blocks", "1"], ("kv_blocks", "the pool has 1")),
    (["fit", TRACE, "--from-requests", "--search-rounds", "100000000"], ("--search-rounds", "1..1000")),
])
def test_out_of_range_values_get_one_line(tmp_path, capsys, args, names):
    out = tmp_path / "o.json"
    rc = main([a.replace("{out}", str(out)) for a in args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in names:
        assert n in err, err
    assert not out.exists()


def test_files_that_are_not_text_or_json_numbers(tmp_path, capsys):
    for name, data in (("n.json", b"1e309"), ("l.json", "\xe9t\xe9".encode("latin-1")),
                       ("deep.json", json.dumps({"schema": "serving-trace/1", "meta": {"source": "given"},
                                                 "requests": [{"id": "a", "arrival_ms": 1e309, "prompt_tokens": 1,
                                                               "max_output_tokens": 1}],
                                                 "events": []}).replace("Infinity", "1e309").encode())):
        p = tmp_path / name
        p.write_bytes(data)
        rc = main(["metrics", str(p)])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and name in err, err


def test_serve_threads_bounded(capsys):
    from gpu_runner.__main__ import main as gmain
    assert gmain(["serve", "--threads", "100000", "--port", "1"]) == 2
    assert "threads: expected an integer in 1..1024" in capsys.readouterr().err


def test_a_json_trace_too_large_to_write_in_seconds_is_refused_naming_parquet(tmp_path, capsys):
    w = tmp_path / "long.json"
    w.write_text(json.dumps({"requests": [{"id": "a", "arrival_ms": 0, "prompt_tokens": 4,
                                           "max_output_tokens": 10_000_000}]}))
    rc = main(["simulate", str(w), "--out", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert rc == 2 and ".parquet" in err and "5,000,000" in err and not (tmp_path / "t.json").exists()
    assert main(["simulate", str(w), "--out", str(tmp_path / "t.parquet")]) == 0       # streamed: seconds
    capsys.readouterr()


def _metrics_peak_rss(args) -> tuple[int, str, int]:
    """(exit code, stderr without the last line, peak resident memory in MiB) of `metrics ARGS` run
    in its own process."""
    return peak_mib(["metrics", *args])


@pytest.mark.slow    # builds 1 GiB of padding
def test_a_trace_padded_with_a_gigabyte_opens_holding_what_it_keeps(tmp_path):
    """1 GiB of whitespace after the events (gzip: 4 MB) used to be rescanned per piece (40 s), then
    held whole by the whole-document path (2.1 GiB peak): the streaming reader squeezes it out as it
    comes (issue 36, item 14), so the process stays within a fixed 512 MiB."""
    import zlib

    from tests.helpers import minimal
    doc = json.dumps(minimal()).encode()
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    path = tmp_path / "pad.json.gz"
    with open(path, "wb") as f:
        f.write(c.compress(doc[:-1]))
        for _ in range(16):
            f.write(c.compress(b" " * (1 << 26)))
        f.write(c.compress(b"}") + c.flush())
    rc, err, rss_mib = _metrics_peak_rss([str(path), "--json"])
    assert rc == 0, err[-2000:]
    assert rss_mib < 512, rss_mib


@pytest.mark.slow    # inflates 2 GiB
def test_a_small_gzip_inflating_past_the_limit_in_one_string_is_refused_holding_little(tmp_path):
    """2 MB of gzip inflating to 2.1 GiB inside one string of the trace's meta (no event boundary, no white
    space): refused in one line once the reader holds 64 MiB (the input is counted first, keeping
    nothing), not after holding 2 GiB of it (issue 36, item 14)."""
    import zlib
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    path = tmp_path / "long.json.gz"
    with open(path, "wb") as f:
        f.write(c.compress(b'{"schema": "serving-trace/1", "meta": {"source": "given", "x": "'))
        for _ in range(33):
            f.write(c.compress(b"A" * (1 << 26)))
        f.write(c.compress(b'"}, "requests": [], "events": []}') + c.flush())
    assert path.stat().st_size < 3 << 20
    rc, err, rss_mib = _metrics_peak_rss([str(path)])
    assert rc == 2 and err.count("\n") == 0 and "long.json.gz: gzip data inflates to more than 2 GiB" in err, err
    assert rss_mib < 512, rss_mib
