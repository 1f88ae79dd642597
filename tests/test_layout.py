"""The package's rooms: one job each, imports only downwards, no private names across modules.

Read from the source with ``ast`` (nothing is imported), so a new module is held to the
same rules the moment it exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "fastload"

#: Modules that read finished datasets or train from them: none may depend on the pack side.
#: (``fastload.cache`` is the one bridge: FastLoader packs a torchvision dataset through it.)
READ_SIDE = {
    "fastload.errors", "fastload.format", "fastload.imaging", "fastload.store", "fastload.reader",
    "fastload.checks", "fastload.sampler", "fastload.shuffle", "fastload.augment", "fastload.pipeline", "fastload.loader",
    "fastload.dlcompat", "fastload.host", "fastload.views", "fastload.transforms", "fastload.tvkinds",
}  # fmt: skip


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` of every fastload import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("fastload"):
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                if sub in MODULES:  # `from . import store`: a module, not a name
                    found.append((sub, None, node.lineno))
                else:
                    found.append((mod, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.startswith("fastload")]
    return found


def test_the_package_has_the_documented_rooms():
    assert {"fastload.packing", "fastload.packing.run", "fastload.packing.images", "fastload.packing.shards",
            "fastload.packing.journal", "fastload.packing.outdir", "fastload.packing.workers",
            "fastload.packing.sources", "fastload.store", "fastload.reader"} <= set(MODULES)  # fmt: skip
    assert "fastload.writer" not in MODULES and "fastload.sources" not in MODULES


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_says_its_job_in_its_first_line(name):
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    if name == "fastload.__main__":
        return
    assert doc and doc.splitlines()[0].strip(), f"{name} has no docstring saying what it is for"


def test_no_module_imports_another_modules_private_names():
    bad = [
        f"{MODULES[name].relative_to(PKG.parent)}:{line}: {mod}.{what}"
        for name, path in MODULES.items()
        for mod, what, line in _imports(name, path)
        if what is not None and what.startswith("_") and not what.startswith("__") and mod != name
    ]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_read_side_never_imports_the_pack_side():
    bad = [
        f"{name} imports {mod} (line {line})"
        for name in sorted(READ_SIDE)
        for mod, _what, line in _imports(name, MODULES[name])
        if mod == "fastload.packing" or mod.startswith("fastload.packing.")
    ]
    assert not bad, "\n".join(bad)


def test_imports_form_no_cycle():
    """Module-level imports between fastload modules point one way only (the package root aside)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top = ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
        tmp = {m for m, _w, _l in _imports_of_tree(name, path, top)}
        graph[name] = {m for m in tmp if m in MODULES and m != name and m != "fastload"}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1 and not (m.startswith(n + ".") or n.startswith(m + ".")):
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def _imports_of_tree(name: str, path: Path, tree: ast.Module) -> list[tuple[str, str | None, int]]:
    src = ast.unparse(tree)
    tmp = path.with_name(f".layout-{path.name}")
    try:
        tmp.write_text(src)
        return _imports(name, tmp)
    finally:
        tmp.unlink()


#: Room sizes: a module over this many lines holds more than one job.
MAX_MODULE_LINES = 900
#: A function over this many lines is several steps that want names of their own.
MAX_FUNCTION_LINES = 120


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_over_the_size_of_one_job(name):
    n = len(MODULES[name].read_text().splitlines())
    assert n <= MAX_MODULE_LINES, f"{name} has {n} lines (at most {MAX_MODULE_LINES}): split it by job"


def test_no_function_is_over_the_size_of_one_step():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {node.name} has {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_the_loader_is_split_by_job():
    """The read side's rooms of issue 'the read side in rooms': facade, settings, resume state, core, producer."""
    assert {"fastload.loader", "fastload.augment.settings", "fastload.resume", "fastload.core", "fastload.epochs"} <= set(MODULES)
    imports = {m for m, _w, _l in _imports("fastload.loader", MODULES["fastload.loader"])}
    assert {"fastload.core", "fastload.epochs", "fastload.resume", "fastload.augment.settings"} <= imports
    # the arrows point one way: nothing below the facade reaches back up to it
    for low in ("fastload.core", "fastload.epochs", "fastload.resume", "fastload.augment.settings"):
        assert "fastload.loader" not in {m for m, _w, _l in _imports(low, MODULES[low])}, low
    assert "fastload.epochs" not in {m for m, _w, _l in _imports("fastload.core", MODULES["fastload.core"])}
