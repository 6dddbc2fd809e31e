"""Command line: python -m core {simulate,metrics,sweep,search,fit,export,merge,fidelity,fleet-merge,compare,
overview} ...  (run with -h for each command). The commands live in core/commands by group: run
(simulate, sweep, search), report (metrics, compare, overview, export), measured (fit, merge,
fidelity, fleet-merge).

Bad input exits with code 2 and one line on stderr naming the problem.
"""
from __future__ import annotations

import argparse
import gc
import sys

from core.cli import Parser
from core.commands import measured, report, run


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m core", description="Serving Explorer core: simulate schedules, compute metrics.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    run.add_parsers(sub)
    report.add_parsers(sub)
    measured.add_parsers(sub)
    return ap


def main(argv=None) -> int:
    from core.cli import fail
    from core.cli import run as run_cli
    from core.errors import ConfigError
    from core.fleet.router import load_policies, router_modules
    try:
        load_policies(router_modules(sys.argv[1:] if argv is None else argv))
    except ConfigError as e:
        return fail(str(e))
    return run_cli(build_parser(), {"simulate": run.cmd_simulate, "metrics": report.cmd_metrics, "sweep": run.cmd_sweep,
                                    "search": run.cmd_search, "compare": report.cmd_compare,
                                    "overview": report.cmd_overview, "fit": measured.cmd_fit,
                                    "export": report.cmd_export, "merge": measured.cmd_merge,
                                    "fleet-merge": measured.cmd_fleet_merge, "fidelity": measured.cmd_fidelity}, argv)


if __name__ == "__main__":
    code = main()
    # The interpreter's last act is a full garbage collection over every object still alive: the
    # imported modules' (numpy, pyarrow, ours), ~30 ms of a 10k-request `simulate` (docs/benchmarks.md,
    # issue 50). Nothing of them is garbage now; frozen, that pass skips them (they are freed as ever).
    gc.freeze()
    sys.exit(code)
