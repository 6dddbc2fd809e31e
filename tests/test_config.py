"""Options are declared once (core.config) and everything else is derived from the
declaration: dict round trips, command-line flags, trace metadata, and the docs' tables."""
import argparse
from pathlib import Path

import pytest

from core.config import SamplingParams, SchedulerConfig, add_flags, from_args, from_dict, options_markdown, to_dict
from core.errors import ConfigError
from core.sim.stepmodel import StepModel

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- options:begin -->", "<!-- options:end -->"


def option_groups():
    from core.fleet.options import FleetOptions
    from core.fleet.router import RouterConfig
    from gpu_runner.launch import ModelOptions
    from gpu_runner.options import EngineConfig
    return {"Scheduler": SchedulerConfig, "Step-time model (simulator)": StepModel, "Sampling": SamplingParams,
            "Runner engine": EngineConfig, "Runner model": ModelOptions, "Fleet": FleetOptions,
            "Router": RouterConfig}


@pytest.mark.parametrize("cfg", [SchedulerConfig("static", max_seqs=3, chunk=8, prefix_caching=True),
                                 StepModel("affine", base_ms=4, prefill_ms_per_token=0.05, decode_ms_per_seq=0.2),
                                 SamplingParams(0.7, 20, 0.9, 5)], ids=lambda c: type(c).__name__)
def test_dict_round_trip(cfg):
    assert from_dict(type(cfg), to_dict(cfg)) == cfg
    assert from_dict(type(cfg), cfg.to_dict(), strict=False) == cfg  # (to_dict may add descriptive keys)


def test_nested_groups_round_trip():
    from gpu_runner.options import EngineConfig
    cfg = EngineConfig(scheduler=SchedulerConfig(block_size=4), sampling=SamplingParams(top_k=3), gamma=2,
                       capture_tiles=(0, 1))
    d = to_dict(cfg)
    assert d["scheduler"]["block_size"] == 4 and d["capture_tiles"] == [0, 1]
    assert from_dict(EngineConfig, d) == cfg


def test_errors_name_the_option():
    with pytest.raises(ConfigError, match="unknown option 'max_seq'"):
        from_dict(SchedulerConfig, {"max_seq": 3})
    with pytest.raises(ConfigError, match=r"engine: max_seqs: expected a positive integer"):
        from_dict(SchedulerConfig, {"max_seqs": 0}, where="engine")
    with pytest.raises(ConfigError, match="policy"):
        SchedulerConfig(policy="round-robin")


def test_trace_metadata_restores_the_scheduler_options():
    # Lenient reading of a trace's meta.engine (which also carries the engine's name etc.).
    meta_engine = {"name": "gpu_runner", **SchedulerConfig("continuous", max_seqs=16, token_budget=2048,
                                                            chunk=512).to_dict(), "attention": "torch"}
    cfg = from_dict(SchedulerConfig, meta_engine, strict=False)
    assert (cfg.max_seqs, cfg.token_budget, cfg.chunk, cfg.policy) == (16, 2048, 512, "continuous")


def test_flags_are_generated_from_the_declaration():
    p = argparse.ArgumentParser()
    add_flags(p, SchedulerConfig)
    add_flags(p, StepModel)
    a = p.parse_args(["--policy", "static", "--max-seqs", "3", "--prefix-caching", "--step-model", "affine",
                      "--base-ms", "2.5"])
    assert from_args(SchedulerConfig, a) == SchedulerConfig("static", max_seqs=3, prefix_caching=True)
    assert from_args(StepModel, a) == StepModel("affine", base_ms=2.5)
    assert from_args(SchedulerConfig, p.parse_args([])) == SchedulerConfig()   # defaults = declared defaults
    assert not hasattr(a, "model_id") and not hasattr(a, "spec_gamma")        # set by programs, not flags
    with pytest.raises(SystemExit):
        p.parse_args(["--max-seqs", "0"])


def test_both_command_lines_share_the_scheduler_flags():
    from core.__main__ import build_parser as core_parser
    from gpu_runner.__main__ import build_parser as runner_parser

    def flags(parser, cmd):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd]
        return {s for a in sub._actions for s in a.option_strings}
    sched = {"--policy", "--max-seqs", "--token-budget", "--chunk", "--block-size", "--kv-blocks",
             "--prefix-caching", "--no-prefix-caching"}
    assert sched <= flags(core_parser(), "simulate")
    assert sched <= flags(runner_parser(), "capture")


def test_docs_option_tables_are_current():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    got = doc[doc.index(BEGIN) + len(BEGIN):doc.index(END)].strip()
    assert got == options_markdown(option_groups()).strip(), \
        "docs/configuration.md is stale: regenerate the tables with python -m tests.test_config"


if __name__ == "__main__":  # rewrite the tables in docs/configuration.md
    path = ROOT / "docs" / "configuration.md"
    doc = path.read_text()
    head, tail = doc[:doc.index(BEGIN) + len(BEGIN)], doc[doc.index(END):]
    path.write_text(head + "\n" + options_markdown(option_groups()) + tail)


def test_the_router_flags_are_declared_once_with_the_same_names_on_both_command_lines():
    """core.fleet.options.add_router_flags declares them for `python -m core simulate` and
    `python -m gpu_runner fleet` alike (they were declared twice, `--seed` against `--router-seed`)."""
    import argparse

    from core.__main__ import build_parser as core_parser
    from gpu_runner.__main__ import build_parser as gpu_parser

    def router_flags(ap, cmd):
        sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices[cmd]
        return {o: (a.help, a.choices) for a in sub._actions for o in a.option_strings if o.startswith("--router")}
    core, gpu = router_flags(core_parser(), "simulate"), router_flags(gpu_parser(), "fleet")
    assert set(core) == set(gpu) == {"--router", "--router-module", "--router-param", "--router-prefix",
                                     "--router-queue-limit", "--router-seed", "--router-staleness-ms"}
    assert {k: v[0] for k, v in core.items()} == {k: v[0] for k, v in gpu.items()}


def _subcommands(parser):
    import argparse
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_prints_its_help(capsys):
    """Help texts go through argparse's % formatting: a declared help with a bare % ("63% of") broke
    `simulate --help` until add_flags escaped it."""
    from core.__main__ import build_parser as core_parser
    from gpu_runner.__main__ import build_parser as gpu_parser
    for parser in (core_parser(), gpu_parser()):
        for name, sub in _subcommands(parser).items():
            assert sub.format_help(), name


def test_the_fleet_flags_are_generated_from_one_declaration_each():
    """The fleet's and the router's flags come from FleetOptions and RouterConfig (core.config.opt):
    no module adds one by hand, and gpu_runner fleet's share core simulate's names and help."""
    import re

    from core.__main__ import build_parser as core_parser
    from core.config import flag_name, options
    from core.fleet.options import REAL_FLEET, FleetOptions
    from core.fleet.router import RouterConfig
    from gpu_runner.__main__ import build_parser as gpu_parser
    declared = {flag_name(f, "router-") for f in options(RouterConfig)} | {flag_name(f) for f in options(FleetOptions)}
    assert {"--router", "--router-param", "--replicas", "--drain", "--kv-link-gbps"} <= declared
    by_hand = []
    for path in [*(ROOT / "core").rglob("*.py"), *(ROOT / "gpu_runner").rglob("*.py")]:
        for flag in re.findall(r"add_argument\(\s*\"(--[a-z-]+)\"", path.read_text()):
            if flag in declared:
                by_hand.append(f"{path.relative_to(ROOT)}: {flag}")
    assert not by_hand, by_hand

    def fleet_flags(parser, cmd):
        return {o: a.help for a in _subcommands(parser)[cmd]._actions for o in a.option_strings if o in declared}
    core, gpu = fleet_flags(core_parser(), "simulate"), fleet_flags(gpu_parser(), "fleet")
    real = {flag_name(f) for f in options(FleetOptions) if f.name in REAL_FLEET}
    assert set(core) == declared and set(gpu) == real | {flag_name(f, "router-") for f in options(RouterConfig)}
    assert all(gpu[k] == core[k] for k in gpu)
    assert set(fleet_flags(core_parser(), "sweep")) == declared - {"--router-seed"}   # (the arrivals' --seed)
