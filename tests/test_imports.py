"""The import graph is one-way: decode < ahconf < runtime < data_gen < {model_build, accept_heads} < benchmarks, with
no module cycle. model_build and accept_heads share a layer and import nothing of each other.

Inside decode, the same holds for its parts: the core concepts at its root < artifacts < loops < ensemble <
the package's ``__init__`` (the public names).

The layer contract is checked statically (``ast``): every import counts, also one inside a function
or an ``if TYPE_CHECKING:`` block. The inference library (decode) names no part of the training stack
anywhere, and imports with the training stack hidden. The development tools (``dev/``) may import anything and
nothing imports them. Test code reaches other test code one way, ``from tests.helpers.<module> import ...``, and a
conftest file holds fixtures only. Inside accept_heads the stages hand files, not imports: nothing outside the
evaluation and its entry point imports accept_heads.evaluation, and accept_heads.measure (what they share) imports
neither stage. Below model_build nothing loads a module by name: the resolvers of ``zoo:`` / ``real:`` ids reach
runtime.schemes as package entry points that model_build declares (``pyproject.toml``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"decode": 0, "ahconf": 1, "runtime": 2, "data_gen": 3, "model_build": 4, "accept_heads": 4, "benchmarks": 5}
DECODE_PARTS = {"core": 0, "artifacts": 1, "loops": 2, "ensemble": 3, "public": 4}  # decode's sub-packages
TRAINING_STACK = ("hydra", "lightning", "pytorch_lightning", "wandb", "omegaconf", "datasets")  # never in decode


@dataclass(frozen=True)
class Edge:
    """One import statement from one of our modules to another."""

    source: str  # importing module, dotted
    target: str  # imported module, dotted (the most specific of our modules the statement names)
    path: str  # importing file, relative to the root
    line: int


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` file of the layered packages under ``root``."""
    modules = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (None: not ours)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """Absolute dotted names an import statement in ``module`` names (``from a import b``: ``a.b``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    for alias in node.names:
        yield f"{base}.{alias.name}"  # a submodule if there is one; else _known falls back to ``base``


def _statements(modules: dict[str, Path]) -> Iterator[tuple[str, Path, int, list[str]]]:
    """Every import statement of ``modules``, at any depth: module, file, line, the absolute names it imports."""
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield module, path, node.lineno, list(_imported(node, module, path.name == "__init__.py"))


def import_edges(root: Path) -> list[Edge]:
    """Every import among the layered packages under ``root`` (lazy and type-checking ones included)."""
    modules = module_files(root)
    edges = []
    for module, path, line, names in _statements(modules):
        targets = {_known(name, modules) for name in names}
        for target in sorted(targets - {None, module}):
            edges.append(Edge(module, target, path.relative_to(root).as_posix(), line))
    return edges


def training_stack_imports(root: Path, package: str) -> list[str]:
    """Imports of the training stack (:data:`TRAINING_STACK`) anywhere in ``package`` under ``root``."""
    return [
        f"{path.relative_to(root).as_posix()}:{line} imports {name}"
        for module, path, line, names in _statements(module_files(root))
        if module.split(".")[0] == package
        for name in names
        if name.split(".")[0] in TRAINING_STACK
    ]


def layer_violations(edges: list[Edge]) -> list[str]:
    """Imports from a lower layer of a higher one, or of another package on the same layer, each naming the file,
    line and layers."""
    violations = []
    for edge in edges:
        source, target = edge.source.split(".")[0], edge.target.split(".")[0]
        have, used = LAYERS[source], LAYERS[target]
        if used > have:
            violations.append(f"{edge.path}:{edge.line} imports {edge.target} (layer {used} > {have})")
        elif used == have and source != target:
            violations.append(f"{edge.path}:{edge.line} imports {edge.target} (beside it on layer {have})")
    return violations


def decode_part(module: str) -> str:
    """The part of decode a module of it belongs to (:data:`DECODE_PARTS`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "public"
    return parts[1] if parts[1] in DECODE_PARTS else "core"


def decode_part_violations(edges: list[Edge]) -> list[str]:
    """Imports inside decode from a higher part into a lower one (e.g. a core module importing a loop)."""
    violations = []
    for edge in edges:
        if edge.source.split(".")[0] != "decode" or edge.target.split(".")[0] != "decode":
            continue
        have, used = decode_part(edge.source), decode_part(edge.target)
        if DECODE_PARTS[used] > DECODE_PARTS[have]:
            violations.append(f"{edge.path}:{edge.line} imports {edge.target} (decode.{used} above decode.{have})")
    return violations


def package_graph(edges: list[Edge]) -> dict[str, set[str]]:
    """Top-level package → the other top-level packages it imports."""
    graph: dict[str, set[str]] = {package: set() for package in LAYERS}
    for edge in edges:
        source, target = edge.source.split(".")[0], edge.target.split(".")[0]
        if source != target:
            graph[source].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles found by a depth-first search (one per back edge), each as a closed path ``[a, b, ..., a]``."""
    found: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the DFS stack, then "done"
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def contract_violations(root: Path) -> list[str]:
    """Everything that breaks the layer contract under ``root``: upward imports, then module cycles."""
    edges = import_edges(root)
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    return layer_violations(edges) + decode_part_violations(edges) + [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]


def test_packages_import_downward_only_and_modules_form_no_cycle():
    violations = contract_violations(ROOT)
    assert not violations, ("layer contract (decode < ahconf < runtime < data_gen < {model_build, accept_heads} < "
                            "benchmarks):\n" + "\n".join(violations))


def test_package_graph_follows_the_layers():
    graph = package_graph(import_edges(ROOT))
    assert {package: sorted(used) for package, used in graph.items()} == {
        "decode": [],
        "ahconf": ["decode"],
        "runtime": ["ahconf", "decode"],
        "data_gen": ["ahconf", "decode", "runtime"],
        "model_build": ["ahconf", "data_gen", "decode", "runtime"],
        "accept_heads": ["ahconf", "data_gen", "decode", "runtime"],
        "benchmarks": ["accept_heads", "ahconf", "data_gen", "decode", "model_build", "runtime"],
    }


#: Inside accept_heads: who may import each stage. The evaluation only from itself and its entry point; what it
#: shares with training and the levers (accept_heads.measure) imports neither stage.
STAGE_IMPORTERS = {
    "accept_heads.evaluation": ("accept_heads.evaluation", "accept_heads.evaluate"),
    "accept_heads.training": ("accept_heads.training", "accept_heads.train", "accept_heads.push_head",
                              "accept_heads.evaluation", "accept_heads.evaluate", "accept_heads.levers"),
}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def stage_violations(edges: list[Edge]) -> list[str]:
    """Imports of a stage of accept_heads (:data:`STAGE_IMPORTERS`) from a module not allowed to import it."""
    return [f"{edge.path}:{edge.line} imports {edge.target}"
            for edge in edges for stage, allowed in STAGE_IMPORTERS.items()
            if _inside(edge.target, stage) and not any(_inside(edge.source, a) for a in allowed)]


def test_stages_hand_files_not_imports():
    """Training, the levers and the shared measurements never import the evaluation; the shared ones never training."""
    assert stage_violations(import_edges(ROOT)) == []


STAGE_TREE = {
    "accept_heads/__init__.py": "",
    "accept_heads/evaluate.py": "from accept_heads.evaluation.table import select\n",
    "accept_heads/evaluation/__init__.py": "",
    "accept_heads/evaluation/table.py": "from accept_heads.measure.costing import costed\n"
                                        "from accept_heads.training.metrics import ece\n",
    "accept_heads/measure/__init__.py": "",
    "accept_heads/measure/costing.py": "def f():\n    from accept_heads.evaluation import table\n",
    "accept_heads/measure/threshold.py": "from accept_heads.training.export import x\n",
    "accept_heads/training/__init__.py": "",
    "accept_heads/training/metrics.py": "from accept_heads.evaluation.table import select\n",
    "accept_heads/training/export.py": "",
    "accept_heads/levers/driver.py": "import accept_heads.evaluation.table\n",
}


def test_the_stage_check_reports_every_import_of_a_stage_it_may_not_make(tmp_path):
    """Negative control: training, the levers and the shared package importing the evaluation (one lazily), the
    shared package importing training; the evaluation's own imports pass."""
    for name, text in STAGE_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert sorted(stage_violations(import_edges(tmp_path))) == [
        "accept_heads/levers/driver.py:1 imports accept_heads.evaluation.table",
        "accept_heads/measure/costing.py:2 imports accept_heads.evaluation.table",
        "accept_heads/measure/threshold.py:1 imports accept_heads.training.export",
        "accept_heads/training/metrics.py:1 imports accept_heads.evaluation.table",
    ]


def test_decode_never_imports_the_training_stack():
    assert training_stack_imports(ROOT, "decode") == []


SYNTHETIC = {
    "decode/__init__.py": "from decode import rules\n",
    "decode/rules.py": "import torch\n",
    "decode/artifacts/hub.py": "def quiet():\n    import datasets.utils\n    from omegaconf import OmegaConf\n",
    "decode/loops/speculative_decoder.py": "def main():\n    from model_build.zoo import ensure_zoo\n",
    "decode/profile.py": "from decode.loops.speculative_decoder import main\n",
    "ahconf/__init__.py": "",
    "ahconf/schema.py": "from decode.rules import x\nfrom typing import TYPE_CHECKING\n"
                        "if TYPE_CHECKING:\n    from accept_heads.training.run_summary import Table\n",
    "data_gen/__init__.py": "",
    "model_build/__init__.py": "",
    "model_build/zoo/__init__.py": "from .build import ensure_zoo\n",
    "model_build/zoo/build.py": "from data_gen import collect\n",
    "data_gen/collect.py": "from data_gen.manifest import build\n",
    "data_gen/manifest.py": "from . import collect\n",
    "accept_heads/__init__.py": "",
    "accept_heads/training/run_summary.py": "",
    "accept_heads/train.py": "import model_build.zoo.build\nfrom ahconf.schema import Config\nimport decode\n",
}


def test_the_checks_report_upward_imports_a_cycle_and_the_training_stack(tmp_path):
    """Negative control: a tree with upward imports (one lazy, one for type checking only), an import of a package
    beside the importer, a cycle, lazy datasets."""
    for name, text in SYNTHETIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert contract_violations(tmp_path) == [
        "decode/loops/speculative_decoder.py:2 imports model_build.zoo (layer 4 > 0)",
        "ahconf/schema.py:4 imports accept_heads.training.run_summary (layer 4 > 1)",
        "accept_heads/train.py:1 imports model_build.zoo.build (beside it on layer 4)",
        "decode/profile.py:1 imports decode.loops.speculative_decoder (decode.loops above decode.core)",
        "import cycle: data_gen.collect -> data_gen.manifest -> data_gen.collect",
    ]
    edges = {(e.source, e.target) for e in import_edges(tmp_path)}
    assert {("model_build.zoo", "model_build.zoo.build"), ("model_build.zoo.build", "data_gen.collect"),
            ("accept_heads.train", "model_build.zoo.build"), ("decode", "decode.rules")} <= edges
    assert package_graph(import_edges(tmp_path))["decode"] == {"model_build"}
    assert training_stack_imports(tmp_path, "decode") == [
        "decode/artifacts/hub.py:2 imports datasets.utils", "decode/artifacts/hub.py:3 imports omegaconf.OmegaConf"
    ]


BY_NAME_TOOLS = ("importlib", "importlib.import_module", "importlib.__import__", "runpy")  # (importlib.util: no)


def by_name_loaders(root: Path) -> list[str]:
    """Files of the layers below model_build under ``root`` that import a tool to load a module by name
    (:data:`BY_NAME_TOOLS`, any part of runpy) or call ``__import__``."""
    found = set()
    for module, path, _, names in _statements(module_files(root)):
        if LAYERS[module.split(".")[0]] < LAYERS["model_build"] and any(
                name in BY_NAME_TOOLS or name.split(".")[0] == "runpy" for name in names):
            found.add(path.relative_to(root).as_posix())
    for package in (p for p, layer in LAYERS.items() if layer < LAYERS["model_build"]):
        for path in sorted((root / package).rglob("*.py")):
            if any(isinstance(n, ast.Name) and n.id == "__import__" for n in ast.walk(ast.parse(path.read_text()))):
                found.add(path.relative_to(root).as_posix())
    return sorted(found)


def test_nothing_below_model_build_loads_a_module_by_name():
    """An import by name hides an edge from the checks above: below model_build none is made."""
    assert by_name_loaders(ROOT) == []


def test_the_by_name_check_finds_importlib_runpy_and___import__(tmp_path):
    """Negative control: each way of loading by name, one of them lazily, and a package above model_build (allowed)."""
    tree = {"decode/__init__.py": "", "decode/a.py": "def f():\n    import importlib\n", "decode/e.py": "from importlib import util, resources\n",
            "ahconf/b.py": "from runpy import run_module\n", "data_gen/c.py": "x = __import__('model_build')\n",
            "benchmarks/d.py": "import importlib\n"}
    for name, text in tree.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert by_name_loaders(tmp_path) == ["ahconf/b.py", "data_gen/c.py", "decode/a.py"]


def test_the_model_builders_declare_the_resolver_of_every_scheme():
    """Every scheme the config knows has a resolver installed as an entry point (``pyproject.toml``), a function of
    model_build that exists: ``zoo:`` and ``real:`` ids resolve from every entry point without one importing
    model_build."""
    from decode.artifacts.hub import ModelLoadError
    from runtime.schemes import SCHEMES, declared, resolver

    assert sorted(declared()) == sorted(SCHEMES)
    for prefix, point in declared().items():
        assert point.value.split(".")[0] == "model_build", point
        assert callable(resolver(prefix)), point
    with pytest.raises(ModelLoadError, match="no resolver of hub: ids is installed"):  # negative control: one line
        resolver("hub:")


def _imported_names(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of ``tree`` at any depth with each dotted name it imports from (relative: dots kept)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node, "." * node.level + (node.module or "")


def dev_imports(root: Path) -> list[str]:
    """Imports of the development tools (``dev``) in the layered packages or the tests under ``root``."""
    paths = [p for package in LAYERS for p in sorted((root / package).rglob("*.py"))] + sorted(
        (root / "tests").rglob("*.py"))
    return [f"{path.relative_to(root).as_posix()}:{node.lineno} imports {name}"
            for path in paths for node, name in _imported_names(ast.parse(path.read_text(), filename=str(path)))
            if name.split(".")[0] == "dev"]


def _is_fixture(node: ast.stmt) -> bool:
    """A ``@pytest.fixture`` function (called or not) or a pytest hook."""
    if not isinstance(node, ast.FunctionDef):
        return False
    decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
    return node.name.startswith("pytest_") or any(
        (isinstance(d, ast.Attribute) and d.attr == "fixture") or (isinstance(d, ast.Name) and d.id == "fixture")
        for d in decorators)


def _conftest_extras(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """What a conftest file defines besides fixtures: (line, what). Imports, calls and environment settings
    (``os.environ[...] = ...``) are allowed."""
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr)) or _is_fixture(node):
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Subscript) for t in node.targets):
            continue
        names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
        yield node.lineno, ", ".join(names) or getattr(node, "name", type(node).__name__)


def shared_test_code_violations(root: Path) -> list[str]:
    """Imports of test code other than ``from tests.helpers.<module> import ...`` anywhere under ``root/tests``
    (``tests.<package>.<module>``, a test module by its bare name, a relative import), and conftest files that
    define anything but fixtures."""
    tests = root / "tests"
    local = {path.stem for path in tests.rglob("*.py")} - {"__init__"}  # bare names pytest's sys.path makes importable
    found = []
    for path in sorted(tests.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, name in _imported_names(tree):
            one_way = isinstance(node, ast.ImportFrom) and name.startswith("tests.helpers.")
            if not one_way and (name.startswith(".") or name.split(".")[0] in local | {"tests"}):
                found.append(f"{where}:{node.lineno} imports {name} (test code: from tests.helpers.<module> import)")
        if path.name == "conftest.py":
            found += [f"{where}:{line} defines {what} (a conftest file holds fixtures only)"
                      for line, what in _conftest_extras(tree)]
    return found


def test_nothing_imports_the_development_tools():
    assert dev_imports(ROOT) == []


def test_test_code_is_shared_only_through_tests_helpers():
    assert shared_test_code_violations(ROOT) == []


TEST_TREE = {
    "decode/__init__.py": "def probe():\n    from dev.old_vs_new_decoding import main\n",
    "tests/helpers/__init__.py": "",
    "tests/helpers/models.py": "from tests.helpers.config import OVERRIDES\n",
    "tests/helpers/config.py": "OVERRIDES = []\n",
    "tests/conftest.py": "import os\nimport pytest\nos.environ['X'] = '1'\nSHAPES = {}\n\n\n"
                         "@pytest.fixture(scope='session')\ndef trio():\n    return SHAPES\n\n\n"
                         "def build():\n    return 1\n",
    "tests/decode/conftest.py": "from tests.helpers.models import OVERRIDES\n",
    "tests/decode/test_a.py": "from tests.decode.conftest import OVERRIDES\nfrom test_b import CASES\n"
                              "from . import test_b\nimport tests.helpers.config\nfrom tests.helpers import models\n"
                              "from tests.helpers.models import OVERRIDES\n",
    "tests/decode/test_b.py": "CASES = []\n",
}


def test_the_checks_report_imports_of_test_code_and_of_dev(tmp_path):
    """Negative control: a tree whose tests import each other in every other way, a conftest with a constant and a
    plain function, and a package that imports a development tool."""
    for name, text in TEST_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert dev_imports(tmp_path) == ["decode/__init__.py:2 imports dev.old_vs_new_decoding"]
    assert shared_test_code_violations(tmp_path) == [
        "tests/conftest.py:4 defines SHAPES (a conftest file holds fixtures only)",
        "tests/conftest.py:12 defines build (a conftest file holds fixtures only)",
        "tests/decode/test_a.py:1 imports tests.decode.conftest (test code: from tests.helpers.<module> import)",
        "tests/decode/test_a.py:2 imports test_b (test code: from tests.helpers.<module> import)",
        "tests/decode/test_a.py:3 imports . (test code: from tests.helpers.<module> import)",
        "tests/decode/test_a.py:4 imports tests.helpers.config (test code: from tests.helpers.<module> import)",
        "tests/decode/test_a.py:5 imports tests.helpers (test code: from tests.helpers.<module> import)",
    ]

BLOCK_TRAINING_STACK = f"""
import importlib.machinery
import sys
BLOCKED = {TRAINING_STACK!r}
class _HidingPathFinder(importlib.machinery.PathFinder):
    # The training stack looks uninstalled: find_spec says None, import raises ModuleNotFoundError
    # (libraries that probe for optional packages, e.g. accelerate for wandb, see it as absent).
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [_HidingPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
import decode
import decode.artifacts.hub
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


def test_decode_imports_without_hydra_lightning_wandb():
    result = subprocess.run([sys.executable, "-c", BLOCK_TRAINING_STACK], check=False, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok []"


def test_the_block_itself_works():
    """Negative control: the same guard makes an import of hydra fail."""
    code = BLOCK_TRAINING_STACK.replace("import decode\n", "import hydra\n", 1)
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "No module named 'hydra'" in result.stderr
