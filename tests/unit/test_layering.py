"""The layering rules of ``docs/architecture.md``, checked on the source (an AST walk).

    core      imports nothing of ours but core
    format    core
    store     core, format
    ha        core, format
    client    core, format
    pipeline  core, format, store, client
    drill     core, format, client (the drills' history, workload, checker and backends)
    broker    core, format, store, ha, client
    master    core, format, store, ha, client, broker (never slave)
    slave     core, format, store, ha, client, broker (never master)
    cli       anything; only ``common/cli/bootstrap.py`` imports master/ and slave/

Every import counts, also one inside a function; and no two modules may import each other,
directly or round a longer loop, also through an import inside a function (a cycle hidden
there is a cycle all the same: it only waits until the call to show). Imports under
``if TYPE_CHECKING:`` are left out of that check: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "master", "slave", "pyspark_replog")
LOWER = {
    "core": {"core"},
    "format": {"core", "format"},
    "store": {"core", "format", "store"},
    "ha": {"core", "format", "ha"},
    "client": {"core", "format", "client"},
    "pipeline": {"core", "format", "store", "client", "pipeline"},
    "drill": {"core", "format", "client", "drill"},
    "proxy": {"core", "format", "client", "proxy"},
    "console": {"core", "format", "client", "console"},
    "broker": {"core", "format", "store", "ha", "client", "proxy", "broker"},
    "master": {"core", "format", "store", "ha", "client", "broker", "master"},
    "slave": {"core", "format", "store", "ha", "client", "broker", "slave"},
    "cli": {"core", "format", "store", "ha", "client", "pipeline", "broker", "drill", "proxy",
            "console", "cli"},
    "public": {"core"},  # common/errors.py: the public import path of common.core.errors
    "spark": {"pipeline"},  # pyspark_replog: Spark's entry point to the data source
}
BOOTSTRAP = "common.cli.bootstrap"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] in ("master", "slave"):
        return parts[0]
    if parts[0] == "pyspark_replog":
        return "spark"
    if parts[0] != "common":
        return None  # not ours
    if len(parts) == 1:
        return "public"
    if parts[1] == "errors":
        return "public"
    return parts[1]


def imports_of(module: str, source: str, is_package: bool) -> list[tuple[str, int, bool]]:
    """(imported module, line, run at all: outside TYPE_CHECKING) for each import of ours."""
    tree = ast.parse(source)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from common.ha import epochs`` imports common.ha.epochs
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            if layer_of(name) is not None or name.split(".")[0] in PACKAGES:
                found.append((name, node.lineno, id(node) not in guarded))
    return found


def check(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Every broken rule in ``sources`` (module -> (source text, is a package))."""
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in sources}
    for module, (source, is_package) in sources.items():
        mine = layer_of(module)
        assert mine is not None, module
        for target, line, runs in imports_of(module, source, is_package):
            theirs = layer_of(target)
            if theirs is None:
                continue
            if theirs in ("master", "slave") and mine == "cli":
                if module != BOOTSTRAP:
                    problems.append(f"{module}:{line} imports {target}: only {BOOTSTRAP} "
                                    "imports master/ and slave/")
                continue
            if theirs == "public" and mine != "public" and target.startswith("common.errors"):
                problems.append(f"{module}:{line} imports {target}: inside the project, import "
                                "common.core.errors")
                continue
            if theirs not in LOWER[mine] and not (theirs == "public" and target == "common"):
                problems.append(f"{module}:{line} imports {target}: {mine} may import only "
                                f"{', '.join(sorted(LOWER[mine]))}")
            if runs:
                # the module itself if it is one of ours, else the package it names a member of
                hit = target if target in sources else target.rpartition(".")[0]
                # (``from common.cli import admin`` in common.cli.main names its own package:
                # the sibling is the dependency, the package already exists then)
                if hit in sources and hit != module and not module.startswith(hit + "."):
                    graph[module].add(hit)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def repository_sources() -> dict[str, tuple[str, bool]]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            out[module_name(path)] = (path.read_text(), path.name == "__init__.py")
    return out


def test_the_repository_keeps_its_layers() -> None:
    problems = check(repository_sources())
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("common.store.index", "from common.ha.promotion import path_of\n",
         "store may import only core, format, store"),
        ("common.client.results", "from common.store import record\n",
         "client may import only"),
        ("common.ha.epochs", "def f():\n    from common.broker.server import RequestServer\n",
         "ha may import only"),
        ("common.cli.admin", "from master.role import MasterRole\n",
         "only common.cli.bootstrap imports master/ and slave/"),
        ("master.role", "import slave.role\n", "master may import only"),
        ("common.broker.server", "from common.errors import BrokerError\n",
         "import common.core.errors"),
        ("common.format.protocol", "from ..store import record\n", "format may import only"),
        ("common.drill.checker", "from common.cli.cluster import LocalCluster\n",
         "drill may import only"),
    ],
)
def test_a_broken_rule_is_reported(module: str, source: str, expected: str) -> None:
    sources = repository_sources()
    sources[module] = (sources.get(module, ("", False))[0] + source, False)
    problems = check(sources)
    assert any(expected in p and p.startswith(module) for p in problems), problems


def test_a_cycle_through_an_import_inside_a_function_is_reported() -> None:
    """client cluster <-> routes was one: routes.py imported cluster.py, whose ClientBase
    imported routes.py inside __init__ (broker <-> metrics and the store's services <->
    message_store were others)."""
    sources = repository_sources()
    sources["common.store.reput"] = (sources["common.store.reput"][0] + (
        "\n\ndef _late() -> None:\n    from common.store.message_store import MessageStore\n"),
        False)
    problems = check(sources)
    assert any(p.startswith("import cycle:") and "common.store.reput" in p
               and "common.store.message_store" in p for p in problems), problems


def test_an_import_cycle_is_reported() -> None:
    sources = {
        "common.store.a": ("from common.store import b\n", False),
        "common.store.b": ("import common.store.a\n", False),
        "common.store.c": (("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from common.store import a\n"), False),
    }
    problems = check(sources)
    assert problems == ["import cycle: common.store.a -> common.store.b -> common.store.a"]
