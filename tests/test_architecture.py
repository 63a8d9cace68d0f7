"""The import graph follows the layer order of docs/architecture.md: every module imports only
from its own layer or the layers above it (imports inside functions included), and no two modules
import each other, directly or through others. The tests mirror the package: a module's tests are
in ``tests/<its folder>/``, a root module's in ``tests/test_<module>.py``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import ragutil_dagster

PACKAGE = Path(ragutil_dagster.__file__).parent

# Top to bottom; a layer may import the layers before it. The ground floor is one layer.
LAYERS: list[set[str]] = [
    {"", "errors", "sampling", "prompts", "tables"},
    {"infra"},
    {"metrics"},
    {"config"},
    {"data"},
    {"embedded"},
    {"models"},
    {"retrieval"},
    {"evaluation"},
    {"resources"},
    {"instance"},
    {"tracking"},
    {"assets"},
    {"automation"},
    {"celery_executor"},
    {"definitions"},
    {"skip_unchanged"},
    {"runner"},
    {"cli"},
    {"testing"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every ragutil_dagster module ``path`` imports (``from pkg import module`` counts as the module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "ragutil_dagster":
                continue
            found.add(node.module)
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                relative = Path(*candidate.split(".")[1:])
                if (PACKAGE / relative).with_suffix(".py").is_file() or (
                    PACKAGE / relative
                ).is_dir():
                    found.add(candidate)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ragutil_dagster"}
    return found


def _graph() -> dict[str, set[str]]:
    """Every module's ragutil imports, parsed in a child interpreter: CPython 3.11's ast
    constructor failed once in a full CI run ("AST constructor recursion depth mismatch") in a
    process whose threads earlier tests had left running; a fresh interpreter is unaffected."""
    child = subprocess.run(
        [sys.executable, __file__, str(PACKAGE)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return {module: set(targets) for module, targets in json.loads(child.stdout).items()}


def _parse_package() -> dict[str, list[str]]:
    return {_module_name(p): sorted(_imports(p)) for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for index, members in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module} is in no layer; add {top!r} to LAYERS and docs/architecture.md")


def test_every_import_points_up_the_layer_order() -> None:
    upward = sorted(
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) > _layer(module)
    )
    assert not upward, "\n".join(upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle between modules, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        # A package's __init__ importing its own modules is not a cycle through the package.
        for nxt in sorted(
            t
            for t in graph.get(node, ())
            if t in graph and t != node and not node.startswith(f"{t}.")
        ):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle or [])


BACKEND_MODULES = {f"ragutil_dagster.models.{name}_backend" for name in ("hf", "vllm", "openai")}


def backend_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every asset module's import of a backend module: assets reach a backend only through the
    registry (models/backends.py), so a new backend touches no asset."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith("ragutil_dagster.assets")
        for target in targets & BACKEND_MODULES
    )


def test_no_asset_imports_a_backend() -> None:
    assert all(
        (PACKAGE / "models" / f"{m.rsplit('.', 1)[1]}.py").is_file() for m in BACKEND_MODULES
    )
    found = backend_imports(_graph())
    assert not found, "\n".join(found)


def test_config_modules_import_each_other_not_the_package() -> None:
    """The cycle check passes over a module's import of its own package, so this keeps the
    package ``config/__init__``, which re-exports every config module, out of their imports."""
    through_package = sorted(
        module
        for module, targets in _graph().items()
        if module.startswith("ragutil_dagster.config.") and "ragutil_dagster.config" in targets
    )
    assert not through_package, f"import from their sibling modules instead: {through_package}"


def test_the_checks_catch_what_they_look_for() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _layer("ragutil_dagster.metrics.seper") < _layer("ragutil_dagster.models.generation")
    assert _layer("ragutil_dagster.config.base") == _layer("ragutil_dagster.config")
    assert backend_imports(
        {"ragutil_dagster.assets.generations": {"ragutil_dagster.models.vllm_backend"}}
    ) == ["ragutil_dagster.assets.generations imports ragutil_dagster.models.vllm_backend"]


TESTS = Path(__file__).parent

# Test folders that name no package folder, and why.
OTHER_TEST_FOLDERS = {
    "dagster": "end-to-end tests of the asset graph, the runner, the executors and the commands",
    "reliability": "bad inputs and guards across every layer",
}
# Test files at the root that test no root module, and why.
CROSS_CUTTING_TESTS = {
    "test_architecture.py": "the package's import graph and the tests' layout",
    "test_skip_rule.py": "the suite's own skip rule (tests/conftest.py)",
}


def misplaced_tests(tests: Path, package: Path) -> list[str]:
    """Test folders naming no folder of the package and root test files naming no root module,
    outside the lists above (``__pycache__`` and hidden folders are not test folders)."""
    folders = [
        f"tests/{path.name}/ names no folder of {package.name}/"
        for path in sorted(tests.iterdir())
        if path.is_dir()
        and path.name != "__pycache__"
        and not path.name.startswith(".")
        and path.name not in OTHER_TEST_FOLDERS
        and not (package / path.name / "__init__.py").is_file()
    ]
    files = [
        f"tests/{path.name} tests no module {package.name}/{path.name.removeprefix('test_')}"
        for path in sorted(tests.glob("test_*.py"))
        if path.name not in CROSS_CUTTING_TESTS
        and not (package / path.name.removeprefix("test_")).is_file()
    ]
    return folders + files


def test_the_tests_mirror_the_package() -> None:
    assert all((TESTS / name).is_dir() for name in OTHER_TEST_FOLDERS)
    assert all((TESTS / name).is_file() for name in CROSS_CUTTING_TESTS)
    found = misplaced_tests(TESTS, PACKAGE)
    assert not found, "move them to tests/<package folder>/:\n" + "\n".join(found)


def test_the_layout_check_sees_a_misplaced_test(tmp_path: Path) -> None:
    package, tests = tmp_path / "pkg", tmp_path / "tests"
    for folder in (package / "infra", tests / "infra", tests / "stray", tests / "__pycache__"):
        folder.mkdir(parents=True)
    for file in (package / "infra" / "__init__.py", package / "runner.py"):
        file.touch()
    for name in ("test_runner.py", "test_objectstore.py", "test_architecture.py"):
        (tests / name).touch()
    assert misplaced_tests(tests, package) == [
        "tests/stray/ names no folder of pkg/",
        "tests/test_objectstore.py tests no module pkg/objectstore.py",
    ]


if __name__ == "__main__":
    PACKAGE = Path(sys.argv[1])  # the package the parent process imports, whatever is installed
    print(json.dumps(_parse_package()))
