"""The package layout keeps its promises: planning code imports no torch, modules stay small,
there are no import cycles, and nothing points outside the repository."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "atac_hf"
MAX_MODULE_LINES = 500


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """Project modules that ``name`` imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in tree.body:  # module level only: lazy imports inside functions break no cycle
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names]
            # `from pkg import submodule` imports the submodule (and pkg's __init__, which is
            # only a cycle when pkg's __init__ imports us: counted when a name is not a module)
            candidates = [s for s in subs if s in modules]
            if len(candidates) < len(subs):
                candidates.append(target)
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for c in candidates:
            if c in modules and c != name:
                found.add(c)
    return found


def test_planning_packages_import_no_torch():
    code = ("import sys; import atac_hf, atac_hf.packing, atac_hf.packing.planners, atac_hf.sharding, "
            "atac_hf.sim, atac_hf.cost, atac_hf.cost.calibrate, atac_hf.workloads, atac_hf.packing.stream; "
            "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate', 'datasets') if m in sys.modules); "
            "assert not heavy, f'planning imported {heavy}'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_no_module_over_the_size_limit():
    big = {name: n for name, p in _modules().items()
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {big}"


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # a package's __init__ importing its own submodules is not a cycle when they do not import it back
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle = stack[stack.index(m):] + [m]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    # the check saw real edges (guard against passing vacuously)
    assert sum(len(v) for v in graph.values()) > 50


@pytest.mark.parametrize("folder", ["atac_hf", "docs", "examples", "configs", "scripts", "tests", "README.md"])
def test_nothing_points_outside_the_repository(folder):
    target = ROOT / folder
    files = [target] if target.is_file() else [p for p in target.rglob("*")
                                               if p.suffix in (".py", ".md", ".yaml", ".yml", ".json", ".toml")]
    outside = "../" + "shared"  # spelled in two parts so this file does not match itself
    bad = [str(p.relative_to(ROOT)) for p in files if outside in p.read_text(encoding="utf-8", errors="ignore")]
    assert not bad, f"files referring to a path outside the repository: {bad}"


def test_each_concept_has_its_own_module():
    """Where a contributor looks for each piece (docs/DESIGN.md's map)."""
    expected = {
        "atac_hf/packing/planners/wfap.py": "def plan_wfap",
        "atac_hf/packing/planners/baselines.py": "def plan_bfd",
        "atac_hf/packing/stream.py": "class StreamPacker",
        "atac_hf/packing/data/sampler.py": "class WFAPBatchSampler",
        "atac_hf/packing/data/iterable.py": "class PackedIterableDataset",
        "atac_hf/packing/data/dataset.py": "def pack_dataset",
        "atac_hf/packing/data/collator.py": "class PackedDataCollator",
        "atac_hf/packing/data/window_planner.py": "class WindowPlanner",
        "atac_hf/sharding/api.py": "def plan_shards",
        "atac_hf/sharding/atp.py": "def plan_atp",
        "atac_hf/sharding/baselines.py": "def plan_zigzag",
        "atac_hf/cost/model.py": "class CostModel",
        "atac_hf/cost/calibrate.py": "def calibrate",
        "atac_hf/workloads.py": "def load_workload",
    }
    for path, needle in expected.items():
        assert needle in (ROOT / path).read_text(encoding="utf-8"), f"{needle!r} not in {path}"


def test_the_design_map_names_every_module():
    """docs/DESIGN.md's layout is the contributors' map: every module of the package is on it."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    missing = sorted(str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
                     if p.name != "__init__.py" and p.name not in design)
    assert not missing, f"modules missing from docs/DESIGN.md's layout: {missing}"
