"""The structure holds, measured by rules about design rather than size:
- layering: each package of core/ imports only packages at its own level or below (the order
  below), gpu_runner only core and itself, core never streamlit, torch or gpu_runner, the app
  (app.py, ui/, pages/) never torch or gpu_runner;
- no import cycles among core/, gpu_runner/ and ui/ modules, function-level imports included
  (only `if TYPE_CHECKING:` blocks are left out: they never run);
- no module writes another object's private fields (`x._f = ...`, `x._f[k] = ...`,
  `setattr(x, "_f", ...)`): a needed mutation is a method of the field's owner;
- pages hold only pages, each run through app.py.
Complexity (McCabe <= 20 per function) is ruff's C901 (pyproject.toml), checked in CI."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBS = ("core", "gpu_runner", "ui")
FORBIDDEN_IN_CORE = ("streamlit", "torch", "triton", "gpu_runner")

# Bottom to top: a module may import modules of its own level and of the levels below it.
# formulas (the chapters' math) and the data model (workload, trace) come first; the engine
# core runs on them; analysis defines every metric once (the simulator's sweeps and the fits
# report with it); then the simulator, the fits, the page computations, the figures, and the
# command lines. gpu_runner sits above all of core.
LEVELS = [
    ("core.errors", "core.order", "core.config", "core.cli", "core.compiled"),
    ("core.formulas",),
    ("core.workload",),
    ("core.trace",),
    ("core.engine", "core.kvtier"),   # the engine core, and the KV tier its scheduler asks (core.kvtier.tier)
    ("core.analysis",),
    ("core.sim",),
    ("core.fleet",),          # several engine cores (core.sim's simulators) behind a router, one virtual clock
    ("core.experiments",),    # sweeps and searches over one engine or a fleet
    ("core.fit",),
    ("core.lessons",),
    ("core.figures",),
    ("core.__main__", "core.commands"),   # the command line and its commands by group
    ("gpu_runner",),
    ("ui",),          # the app's glue: core only (test_the_app_never_imports_gpu_runner_or_torch)
]


def level(module: str) -> int:
    for k, names in enumerate(LEVELS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return k
    raise AssertionError(f"{module}: not placed in tests/test_layout.py's LEVELS")


def modules() -> dict[str, Path]:
    out = {}
    for lib in LIBS:
        for p in (ROOT / lib).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = p
    return out


def _type_checking_blocks(tree) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth, except under `if TYPE_CHECKING:`.
    `from pkg import name` counts as importing pkg.name when that is a module."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_blocks(tree)
    names = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def graph() -> dict[str, set[str]]:
    mods = modules()

    def resolve(name):
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else None
    # a package's __init__ is not an edge of its own submodules (importing core.x.y runs core.x first)
    return {m: {r for d in imports_of(p) if (r := resolve(d)) and r != m and not m.startswith(r + ".")}
            for m, p in mods.items()}


def test_no_import_cycles_even_through_function_level_imports():
    g = graph()
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for d in sorted(g[m]):
            if state.get(d) == "open":
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = "done"
    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_layers_import_only_downwards():
    bad = [f"{m} (level {level(m)}) imports {d} (level {level(d)})"
           for m, deps in graph().items() for d in sorted(deps) if level(d) > level(m)]
    assert bad == []


def test_core_never_imports_streamlit_or_torch():
    for name, path in modules().items():
        if name.startswith("core"):
            bad = {d for d in imports_of(path) if d.split(".")[0] in FORBIDDEN_IN_CORE}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_app_never_imports_gpu_runner_or_torch():
    files = [ROOT / "app.py", *(ROOT / "ui").rglob("*.py"), *(ROOT / "pages").glob("*.py")]
    for path in files:
        bad = {d for d in imports_of(path) if d.split(".")[0] in ("torch", "triton", "gpu_runner")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def _private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def _owner_is_self(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def private_writes(path: Path) -> list[str]:
    """`x._f = v`, `x._f += v`, `x._f[k] = v`, `del x._f`, `setattr(x, "_f", v)` with x not self/cls."""
    tree = ast.parse(path.read_text())
    found = []

    def target(t):
        while isinstance(t, ast.Subscript):
            t = t.value
        if isinstance(t, ast.Attribute) and _private(t.attr) and not _owner_is_self(t):
            found.append(f"{path.relative_to(ROOT)}:{t.lineno}: {ast.unparse(t)}")
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                target(e)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            target(node.target)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                target(t)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_writes_another_objects_private_fields():
    files = [p for lib in (*LIBS, "pages") for p in (ROOT / lib).rglob("*.py")] + \
        [ROOT / "app.py", *(ROOT / "ui").rglob("*.py")]
    assert [w for p in files for w in private_writes(p)] == []


def test_the_private_write_rule_sees_what_it_forbids(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("class A:\n    def f(self, o):\n        self._ok = 1\n        o._bad = 2\n        o._tab[3] = 4\n"
                 "        setattr(o, '_worse', 5)\n        o.public = 6\n")
    got = [w.split(": ", 1)[1] for w in private_writes_rel(p)]
    assert got == ["o._bad", "o._tab", "setattr(o, '_worse', 5)"]


def private_writes_rel(p: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, p.parent
    try:
        return private_writes(p)
    finally:
        ROOT = saved


def test_the_cycle_rule_sees_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    import b\n")
    (tmp_path / "b.py").write_text("import a\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    assert "b" in imports_of(tmp_path / "a.py") and "a" not in imports_of(tmp_path / "c.py")


def test_pages_hold_only_pages():
    # Every file in pages/ is a page registered in app.py; shared helpers live in ui/.
    app = (ROOT / "app.py").read_text()
    for p in (ROOT / "pages").glob("*.py"):
        assert f"pages/{p.name}" in app, f"{p.name} is in pages/ but is not a page of app.py"


def test_pages_run_through_app_py():
    """Streamlit runs a deep-linked page file on its own until a session has called
    st.navigation (it finds pages/ next to app.py): each page calls ensure_app_frame() before
    drawing anything, and its URL path is its file name, so the rerun through app.py lands on
    the same page."""
    app = ast.parse((ROOT / "app.py").read_text())
    pages = {}
    for node in ast.walk(app):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Page":
            kw = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
            pages[node.args[0].value] = kw
    assert len(pages) == len(list((ROOT / "pages").glob("*.py")))
    for path, kw in pages.items():
        stem = Path(path).stem
        assert kw.get("url_path", stem) == stem or kw.get("default"), f"{path}: url_path {kw.get('url_path')!r}"
        body = ast.parse((ROOT / path).read_text()).body
        first_call = next(n for n in body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call))
        assert ast.unparse(first_call) == "ensure_app_frame()", f"{path}: first call is {ast.unparse(first_call)}"


def attributes(o) -> dict:
    """An object's attributes: its __dict__, or (a class compiled by setup.py has none) every
    attribute its type declares."""
    if hasattr(o, "__dict__"):
        return vars(o)
    return {k: getattr(o, k) for k in dir(o) if not k.startswith("__") and not callable(getattr(o, k))}


def readme_map() -> dict[str, str]:
    """README's Architecture block: folder path ("core/engine") -> the text of its entries."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Architecture"):readme.index("## Command line")]
    block = block[block.index("```") + 3:block.rindex("```")]
    out, stack = {}, []   # (indent, folder path)
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        first = line.split()[0]
        if stack:
            out[stack[-1][1]] += " " + line
        if first.endswith("/"):
            path = (stack[-1][1] + "/" if stack else "") + first.rstrip("/")
            out[path] = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
            stack.append((indent, path))
    return out


def test_the_readme_map_names_every_module():
    """README's Architecture block names every module of core/, gpu_runner/ and ui/ by its file
    name, under its own folder, so a newcomer finds each one."""
    entries = readme_map()
    missing = []
    for lib in LIBS:
        for p in (ROOT / lib).rglob("*.py"):
            folder = str(p.parent.relative_to(ROOT))
            if p.name != "__init__.py" and p.name not in entries.get(folder, "").split():
                missing.append(str(p.relative_to(ROOT)))
    assert missing == []


ENGINE_PARTS = ("core/engine/scheduler.py", "core/engine/running.py", "core/engine/kv_cache.py",
                "core/engine/block_pool.py", "core/engine/prefix_cache.py", "core/engine/policies.py",
                "core/engine/admission.py", "core/engine/requests.py")
RECORDERS = ("core.engine.steplog", "core.engine.kvlog", "core.trace.writer", "core.trace.build", "core.trace.save")


def test_the_scheduler_holds_no_trace_writer():
    """Recording a run observes the engine core's outputs: the scheduler and its parts import no
    recorder, and after a recorded run neither the scheduler nor its KV cache holds one (their
    attributes are checked, not their names)."""
    bad = [f"{m} imports {d}" for m in ENGINE_PARTS for d in sorted(imports_of(ROOT / m))
           if d.startswith(RECORDERS)]
    assert bad == []
    from core.config import SchedulerConfig
    from core.engine import loop
    from core.engine.kvlog import KVLog
    from core.engine.steplog import StepLog
    from core.sim.simulate import simulator
    from core.workload import Request, Workload
    core = simulator(SchedulerConfig(max_seqs=2, kv_blocks=16, block_size=4, prefix_caching=True),
                     workload=Workload([Request(f"r{i}", float(i), 9, 5, prompt_ids=(1,) * 9) for i in range(4)]))
    loop.run(core, loop.VirtualClock(0.0))
    assert len(core.log.steps) > 0 and len(core.log.kv) > 0           # it recorded, through the outputs
    sched = core.scheduler
    held = [f"{type(o).__name__}.{k}" for o in (sched, sched.kv, sched.kv.pool) for k, v in attributes(o).items()
            if isinstance(v, (StepLog, KVLog))]
    assert held == []


def test_messages_between_processes_are_declared_structs():
    """Between the server and its engine process only gpu_runner.messages Structs travel,
    msgpack-encoded: every send_bytes sends encode(msg), every recv_bytes is decoded against the
    declared union; nothing is pickled (.send / .recv of a pipe) and nothing is faked
    (SimpleNamespace). Every class in gpu_runner/messages.py is a msgspec Struct."""
    import msgspec
    bad = []
    for p in (ROOT / "gpu_runner").rglob("*.py"):
        tree = ast.parse(p.read_text())
        where = str(p.relative_to(ROOT))
        parents = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Name, ast.Attribute)) and (getattr(node, "id", None) or node.attr) == \
                    "SimpleNamespace":
                bad.append(f"{where}:{node.lineno}: SimpleNamespace")
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            attr = node.func.attr
            if attr in ("send", "recv", "send_multipart") and "engine" in where:
                bad.append(f"{where}:{node.lineno}: .{attr}() (pickled or untyped)")
            if attr == "send_bytes" and not (node.args and isinstance(node.args[0], ast.Call)
                                             and ast.unparse(node.args[0].func) == "encode"):
                bad.append(f"{where}:{node.lineno}: send_bytes of something not encode(msg)")
            if attr == "recv_bytes":
                up = parents.get(id(node))
                if not (isinstance(up, ast.Call) and ast.unparse(up.func).startswith("decode_")):
                    bad.append(f"{where}:{node.lineno}: recv_bytes not decoded against the declared messages")
    assert bad == []
    from gpu_runner import messages
    classes = [v for v in vars(messages).values() if isinstance(v, type) and v.__module__ == messages.__name__]
    assert classes and all(issubclass(c, msgspec.Struct) for c in classes)


def test_one_waiting_queue_limit():
    """The server's waiting-queue limit (--max-waiting) is implemented once, in the engine client
    both the engine thread and the engine process sit behind (a fleet passes it to each replica's)."""
    raisers = [str(p.relative_to(ROOT)) for p in (ROOT / "gpu_runner").rglob("*.py")
               if "raise Overloaded(" in p.read_text()]
    assert raisers == ["gpu_runner/client.py"]
    users = [str(p.relative_to(ROOT)) for p in (ROOT / "gpu_runner").rglob("*.py")
             if "max_waiting" in p.read_text()
             and p.name not in ("client.py", "__main__.py", "engine_process.py", "fleet.py", "fleet_serve.py")]
    assert users == []


def test_the_http_layer_only_streams_what_the_engine_gives_it():
    """Detokenising and stop strings live in the engine's output processor: the HTTP handlers
    decode no token ids and search no text for stop strings."""
    src = (ROOT / "gpu_runner" / "server.py").read_text()
    assert ".decode(self.ids" not in src and "tok.decode" not in src and ".find(x)" not in src


def test_importers_are_registered_in_one_table():
    """Importers are one declared table (core.trace.imports.sniff.IMPORTERS): import_doc,
    import_lines, import_text and import_directory name no recogniser: they ask the table (a new
    importer is one entry, not an if in four places)."""
    tree = ast.parse((ROOT / "core" / "trace" / "imports" / "sniff.py").read_text())
    entry = {"import_doc", "import_lines", "import_text", "import_directory"}
    bad = [f"{f.name}: {ast.unparse(n)}" for f in tree.body if isinstance(f, ast.FunctionDef) and f.name in entry
           for n in ast.walk(f) if isinstance(n, (ast.Name, ast.Attribute))
           and "looks_like" in (n.id if isinstance(n, ast.Name) else n.attr)]
    assert bad == []
    assert len({f.name for f in tree.body if isinstance(f, ast.FunctionDef)} & entry) == 4


def _code_files():
    for lib in ("core", "gpu_runner", "ui", "pages"):
        yield from (ROOT / lib).rglob("*.py")


def test_every_meta_and_request_key_the_code_reads_is_declared_in_the_schema():
    """A trace's meta keys (`x.meta["k"]`, `x.meta.get("k")`, and `meta[...]` / `meta.get(...)` of a
    variable named meta) and the per-request engine_* keys that code reads are declared in
    core/trace/schema.py (META, REQUEST), and so in the JSON Schema and docs/trace-format.md."""
    from core.trace.schema import META, REQUEST
    meta_keys = {f.name for f in META.fields}
    request_keys = {f.name for f in REQUEST.fields}
    undeclared = set()
    for p in _code_files():
        if p.name == "config.py" or "figures" in p.parts and p.name == "slides.py":
            continue      # (option metadata named `meta`, not a trace's)
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            recv = key = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                recv, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                recv, key = node.func.value, node.args[0].value
            if not isinstance(key, str):
                continue
            is_meta = (isinstance(recv, ast.Attribute) and recv.attr == "meta") or \
                (isinstance(recv, ast.Name) and recv.id == "meta")
            if is_meta and key not in meta_keys:
                undeclared.add(f"meta.{key} ({p.relative_to(ROOT)}:{node.lineno})")
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"engine_[a-z]+_(ms|id)", node.value) and node.value not in request_keys:
                undeclared.add(f"request.{node.value} ({p.relative_to(ROOT)}:{node.lineno})")
    assert sorted(undeclared) == []


def test_request_fields_are_declared_once():
    """A request's optional fields are one tuple (core.workload.model.OPTIONAL) that to_dict, the
    trace writer's request extras and Trace.workload iterate; the trace schema's REQUEST record and
    our JSON workload's RequestDoc declare the same names."""
    from dataclasses import fields

    from core.trace.schema import REQUEST
    from core.workload.model import OPTIONAL, Request
    from core.workload.native import RequestDoc
    assert set(OPTIONAL) <= {f.name for f in REQUEST.fields}
    assert set(OPTIONAL) <= set(RequestDoc.__struct_fields__)
    assert {f.name for f in fields(Request)} == set(OPTIONAL) | {"id", "arrival_ms", "prompt_tokens",
                                                                 "max_output_tokens", "extra"}
    for mod in ("core/trace/writer.py", "core/trace/model.py"):
        src = (ROOT / mod).read_text()
        assert not any(f'"{name}"' in src for name in OPTIONAL if name != "tenant"), mod


OURS = ("core", "gpu_runner", "ui", "pages", "bench", "deploy", "tests")


def private_imports(path: Path) -> list[str]:
    """`from <one of our modules> import _name`: another module's private name (a name it keeps to
    itself; one another module needs is public)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in OURS:
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}"
                      for a in node.names if _private(a.name)]
    return found


def _shipped_and_bench():
    return [p for lib in (*LIBS, "pages", "bench", "deploy") for p in (ROOT / lib).rglob("*.py")] + [ROOT / "app.py"]


def test_no_module_imports_another_modules_private_names():
    assert [f for p in _shipped_and_bench() for f in private_imports(p)] == []


def test_the_private_import_rule_sees_what_it_forbids(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("from core.sim.simulate import _hidden, simulate\nfrom os import _exit\n"
                 "def f():\n    from core.trace.writer import _dumps\n")
    saved = globals()["ROOT"]
    globals()["ROOT"] = tmp_path
    try:
        got = [f.split(": ", 1)[1] for f in private_imports(p)]
    finally:
        globals()["ROOT"] = saved
    assert got == ["core.sim.simulate._hidden", "core.trace.writer._dumps"]


def test_bench_imports_nothing_from_tests_and_edits_no_sys_path():
    """The benchmarks run from the repository root (`python -m bench.X`): what they share with the
    tests lives in bench/helpers.py, which the tests import."""
    bad = []
    for p in (ROOT / "bench").rglob("*.py"):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tests":
                bad.append(f"{p.name}:{node.lineno}: from {node.module}")
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests" for a in node.names):
                bad.append(f"{p.name}:{node.lineno}: import tests")
            elif isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                    and node.value.id == "sys":
                bad.append(f"{p.name}:{node.lineno}: sys.path")
    assert bad == []


def test_fleet_imbalance_is_defined_once():
    """One definition (core.analysis.definitions.imbalance) that the fleet summary, the policy
    comparison and bench/fleet_routing.py all use: no function of that name anywhere else."""
    where = []
    for p in _shipped_and_bench():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "imbalance" in node.name:
                where.append(f"{p.relative_to(ROOT)}:{node.name}")
    assert where == ["core/analysis/definitions.py:imbalance"]


SIMULATORS = ("core.sim.simulate", "core.sim.parallel", "core.fleet.sim", "core.experiments")


def test_figures_take_data_in_and_run_no_simulation():
    """core/figures draws what it is given: the experiments that run simulations are
    core.experiments', the fleet's routing read back core.analysis.routing's."""
    bad = {str(p.relative_to(ROOT)): sorted(d for d in imports_of(p) if d.startswith(SIMULATORS))
           for p in (ROOT / "core" / "figures").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


ROOM_LINES = 600
OVERSIZE: dict[str, int] = {}   # (none: the scheduler is the step, scheduler.py, on its state, running.py)


def test_no_room_of_core_or_gpu_runner_grows_past_600_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for lib in ("core", "gpu_runner") for p in (ROOT / lib).rglob("*.py")}
    assert {k: n for k, n in sizes.items() if n > OVERSIZE.get(k, ROOM_LINES)} == {}
    assert sizes["core/__main__.py"] <= 400    # (the commands by group: core/commands)
    assert len((ROOT / "pages" / "replay.py").read_text().splitlines()) <= 300   # (its sections: ui/replay)


def test_the_fleets_talk_to_their_engines_through_the_engine_core_front():
    """The simulated fleet and gpu_runner's fleet (its front end and the replica's engine host) take
    the prefix cache's news from EngineOutputs.cache_news and reach no scheduler or KV manager inside
    an engine (a listener set on its prefix cache, a horizon written into its scheduler, a KV query)."""
    files = [*(ROOT / "core" / "fleet").glob("*.py"), ROOT / "gpu_runner" / "fleet.py",
             ROOT / "gpu_runner" / "fleet_serve.py"]
    inside = re.compile(r"\.(sched|scheduler)\b|\.listener\b|\.horizon_ms\b|\.match_prefix\(")
    bad = [f"{p.relative_to(ROOT)}:{k + 1}: {line.strip()}" for p in files
           for k, line in enumerate(p.read_text().splitlines()) if inside.search(line)]
    assert bad == []
    serving = (ROOT / "gpu_runner" / "serving.py").read_text()
    assert ".listener" not in serving and "cache_news=publish_cache" in serving


def test_one_router_front_end_for_both_fleets():
    """What the simulated fleet and `gpu_runner fleet` did twice is written once (core/fleet/front.py,
    core/fleet/board.py): no other fleet module hashes prompt blocks, words a queue-limit refusal,
    builds a route event or keeps a board of news."""
    files = [*(ROOT / "core" / "fleet").glob("*.py"), *(ROOT / "gpu_runner").glob("*.py")]
    bad = []
    for p in files:
        if p.name in ("front.py", "board.py"):
            continue
        text = p.read_text()
        for what in ("block_hash(", '"type": "route"', "waiting across the fleet (limit", "heapq.heappush(self.news",
                     "def signals_as_of", "def as_of(self, t_ms"):
            if what in text:
                bad.append(f"{p.relative_to(ROOT)}: {what}")
    assert bad == []


COMPLEX, TOO_COMPLEX, MOST_COMPLEX = 20, 10, 30


def _complexities() -> dict[str, int]:
    """Every function's cyclomatic complexity (radon's), outside tests: "path:Class.name" -> n."""
    from radon.complexity import cc_visit
    out = {}
    for path in [ROOT / "app.py", *[p for d in ("core", "gpu_runner", "pages", "ui", "bench")
                                    for p in (ROOT / d).rglob("*.py")]]:
        for b in cc_visit(path.read_text()):
            name = f"{b.classname}.{b.name}" if getattr(b, "classname", None) else b.name
            out[f"{path.relative_to(ROOT)}:{name}"] = b.complexity
    return out


def test_few_functions_are_complex_and_none_very():
    """At most 10 functions over complexity 20 outside tests, none over 30; the server's stream loop
    (the path every streamed token takes) at most 15."""
    cc = _complexities()
    over = {k: n for k, n in cc.items() if n > COMPLEX}
    assert len(over) <= TOO_COMPLEX, sorted(over.items(), key=lambda kv: -kv[1])
    assert {k: n for k, n in over.items() if n > MOST_COMPLEX} == {}
    assert cc["gpu_runner/server.py:App._stream"] <= 15


def test_the_complexity_count_sees_what_it_counts():
    from radon.complexity import cc_visit
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(25))
    (block,) = cc_visit(f"def f(x):\n{branches}\n    return -1\n")
    assert block.complexity == 26
