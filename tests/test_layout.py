"""The structure holds: no import cycles among core/ and gpu_runner/ modules, core/ never
imports streamlit or torch, no library module grows past ~500 lines, pages hold only pages."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBS = ("core", "gpu_runner")
MAX_LINES = 500
FORBIDDEN_IN_CORE = ("streamlit", "torch", "triton", "gpu_runner")


def modules() -> dict[str, Path]:
    out = {}
    for lib in LIBS:
        for p in (ROOT / lib).rglob("*.py"):
            name = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = p
    return out


def imported(path: Path, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_no_import_cycles():
    mods = modules()

    def resolve(name):
        while name not in mods and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in mods else None
    # Module-level imports only: a function-local import runs later and cannot form a cycle at import time.
    graph = {m: {r for d in imported(p, True) if (r := resolve(d)) and r != m and not m.startswith(r + ".")}
             for m, p in mods.items()}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = "done"
    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_core_never_imports_streamlit_or_torch():
    for name, path in modules().items():
        if name.startswith("core"):
            bad = {d for d in imported(path, False) if d.split(".")[0] in FORBIDDEN_IN_CORE}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_library_modules_stay_small():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in modules().values()}
    assert {f: n for f, n in sizes.items() if n > MAX_LINES} == {}


def test_pages_hold_only_pages():
    # Every file in pages/ is a page registered in app.py; shared helpers live in ui.py.
    app = (ROOT / "app.py").read_text()
    for p in (ROOT / "pages").glob("*.py"):
        assert f"pages/{p.name}" in app, f"{p.name} is in pages/ but is not a page of app.py"


def test_pages_run_through_app_py():
    """Streamlit runs a deep-linked page file on its own until a session has called
    st.navigation (it finds pages/ next to app.py): each page calls ui.ensure_app_frame() before
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
