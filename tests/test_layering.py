"""The import layering of docs/contributing.md, checked on the source: every import statement of every module,
function-local ones included, and `importlib.import_module` calls with a constant name.

- `mbrl/core/` imports nothing of the project outside `mbrl.core`;
- `agents/`, `world_models/`, `envs/` import nothing from `mbrl` except `mbrl.core`;
- `agents/` never imports `world_models` (rollouts reach agents as data);
- `mbrl/datasets/` imports nothing of the project but `mbrl.core` (and itself).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("mbrl", "scripts", "tests")
# The folders installed under the one `mbrl` namespace (pyproject.toml's package-dir).
INSTALLED_AS = {"agents": "mbrl.agents", "envs": "mbrl.envs", "world_models": "mbrl.world_models"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in INSTALLED_AS:
        parts[0:1] = INSTALLED_AS[parts[0]].split(".")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted target) of every import in `path`."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_in(text: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted target) of every import in the source `text` of `module`; `from a import b` gives `a.b`
    (b may be a name, not a module)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's package
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def of_project(target: str) -> bool:
    return target.split(".")[0] in PROJECT


# (folder, what it may import of the project, why)
RULES = [
    ("mbrl/core", ("mbrl.core",), "mbrl.core is the ground floor: it imports nothing of the project above it"),
    ("mbrl/datasets", ("mbrl.core", "mbrl.datasets"), "mbrl.datasets imports only mbrl.core"),
    ("agents", ("mbrl.core", "mbrl.agents"),
     "mbrl.agents import only mbrl.core (never mbrl.world_models: rollouts reach them as data)"),
    ("world_models", ("mbrl.core", "mbrl.world_models"), "mbrl.world_models import only mbrl.core"),
    ("envs", ("mbrl.core", "mbrl.envs"), "mbrl.envs import only mbrl.core"),
]


@pytest.mark.parametrize("folder, allowed, why", RULES, ids=[r[0] for r in RULES])
def test_layer_imports_only_what_it_may(folder, allowed, why):
    sources = sorted((ROOT / folder).rglob("*.py"))
    assert sources, f"no modules under {folder}"
    violations = [
        f"{source.relative_to(ROOT)}:{line}: {target}"
        for source in sources
        for line, target in imports(source)
        if of_project(target) and not any(within(target, a) for a in allowed)
    ]
    assert not violations, f"{why}:\n" + "\n".join(violations)


def test_the_import_walk_sees_local_relative_and_dynamic_imports():
    text = (
        "from .sac_n import SACN\n"
        "def f():\n"
        "    from mbrl.world_models import rollout\n"
        "    import importlib\n"
        "    return importlib.import_module('mbrl.train')\n"
    )
    found = sorted(target for _, target in imports_in(text, "mbrl.agents.probe"))
    assert found == ["importlib", "mbrl.agents.sac_n.SACN", "mbrl.train", "mbrl.world_models.rollout"]
    assert [t for _, t in imports_in("from . import types\n", "mbrl.core", is_package=True)] == ["mbrl.core.types"]
    assert [t for _, t in imports_in("from .. import core\n", "mbrl.datasets.d4rl")] == ["mbrl.core"]


def algorithm_names_in(text: str, names: set[str]) -> list[tuple[int, str]]:
    """Where `text` names one of `names`: a string, a variable, an attribute or a keyword argument."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in names:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.keyword) and node.arg in names:
            found.append((node.lineno, f"{node.arg}="))
    return found


def algorithm_names() -> set[str]:
    """The algorithms' names (`mopo-ppo` also as `mopo_ppo`) and their config sections' (`sac`, `ppo`)."""
    from mbrl.agents import registry

    return set(registry.ALGORITHMS) | {name.replace("-", "_") for name in registry.ALGORITHMS} | set(registry.SECTIONS)


def test_no_algorithm_is_named_in_mbrl():
    """An algorithm is one registry entry: the training program, the config, imagination and the commands reach
    it through `mbrl.agents.registry`, never by its name or its section's (`config.neubay`, `algo == "mopo"`,
    `hypers["sac"]`)."""
    names = algorithm_names()
    found = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in sorted((ROOT / "mbrl").rglob("*.py"))
             for line, what in algorithm_names_in(path.read_text(), names)]
    assert not found, "\n".join(found)
    # The walk sees each way of naming one.
    probe = 'if config.algo == "mopo": x = config.neubay.utd; f(mopo_ppo=1); neubay = 2; h = hypers["sac"]'
    assert sorted(what for _, what in algorithm_names_in(probe, names)) == ["'mopo'", "'sac'", ".neubay", "mopo_ppo=",
                                                                             "neubay"]


# What `mbrl/` may import of `mbrl.agents`: the interface, the registry and the shared network helpers.
AGENT_INTERFACE = ("mbrl.agents.base", "mbrl.agents.registry", "mbrl.agents.networks")


def test_mbrl_imports_no_algorithm_module():
    """`mbrl/` asks an agent for capabilities (`mbrl.agents.base`), it never imports an algorithm's module."""
    found = [f"{path.relative_to(ROOT)}:{line}: {target}" for path in sorted((ROOT / "mbrl").rglob("*.py"))
             for line, target in imports(path)
             if within(target, "mbrl.agents") and target not in ("mbrl.agents", "mbrl.agents.registry")
             and not any(within(target, allowed) for allowed in AGENT_INTERFACE)]
    assert not found, "\n".join(found)


def agent_classes() -> set[str]:
    return {node.name for path in (ROOT / "agents").rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)}


def isinstance_checks_in(text: str, classes: set[str]) -> list[tuple[int, str]]:
    """Where `text` calls isinstance/issubclass with one of `classes` (alone or in a tuple)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            found += [(node.lineno, k.attr if isinstance(k, ast.Attribute) else k.id) for k in kinds
                      if isinstance(k, (ast.Name, ast.Attribute)) and (k.attr if isinstance(k, ast.Attribute) else k.id) in classes]
    return found


def test_mbrl_checks_no_agent_class():
    classes = agent_classes() - {"ObsScale"}  # a value type of the networks, not an agent
    assert {"SACNAgent", "BC", "Neubay", "AlgorithmEntry"} <= classes
    found = [f"{path.relative_to(ROOT)}:{line}: isinstance(..., {name})" for path in sorted((ROOT / "mbrl").rglob("*.py"))
             for line, name in isinstance_checks_in(path.read_text(), classes)]
    assert not found, "\n".join(found)
    assert isinstance_checks_in("isinstance(a, (int, agents.SACNAgent))", classes) == [(1, "SACNAgent")]


# -------------------------------------------------------------------------------------------------
# A world-model kind is one registry entry (`mbrl.world_models.registry`)


def model_kind_names() -> set[str]:
    from mbrl.world_models import registry as model_registry

    return set(model_registry.KINDS) | {"mlp", "rwm"}


def _names_a_kind(node: ast.AST, names: set[str]) -> bool:
    """`node` is a string constant that names a kind, or a tuple / list / set / dict literal holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e, names) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(k is not None and _names_a_kind(k, names) for k in node.keys)
    return False


def _is_kind_table(node: ast.Dict, names: set[str]) -> bool:
    """Every key of the dict literal names a kind, and some kind's value is not itself a dict: a table to look a kind
    up in. A record that happens to hold a key spelt like a kind (`{"scratch": False, "steps": 10}`) is not one."""
    keys = [(k, v) for k, v in zip(node.keys, node.values) if k is not None]
    return bool(keys) and all(_names_a_kind(k, names) for k, _ in keys) and any(not isinstance(v, ast.Dict)
                                                                               for _, v in keys)


def model_kind_dispatch_in(text: str, names: set[str]) -> list[tuple[int, str]]:
    """Where `text` dispatches on a kind's name. Refused: a comparison (`==`, `!=`, `in`, `not in`, `is`, `is not`)
    with a kind's name or a literal holding one on either side (`kind == "rwm"`, `kind in ("mlp", "rwm")`); a
    subscript by a kind's name (`SECTIONS["mlp"]`); a dict literal keyed by kinds' names only, with a value that is not
    itself a dict (a table to look a kind up in, `{"mlp": ("ensemble", "fit")}`). Allowed: declaring it (a keyword argument,
    `model_kind="mlp"`), a preset's overrides keyed by a section that bears the kind's name (`{"rwm": {...}}`), and
    the name inside messages and docstrings."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare) and any(_names_a_kind(n, names) for n in (node.left, *node.comparators)):
            found.append((node.lineno, "compared"))
        elif isinstance(node, ast.Subscript) and _names_a_kind(node.slice, names):
            found.append((node.lineno, "subscript"))
        elif isinstance(node, ast.Dict) and _is_kind_table(node, names):
            found.append((node.lineno, "dict key"))
    return found


def test_no_model_kind_is_compared_outside_world_models():
    """`mbrl/`, `agents/` and `envs/` reach a world-model kind through `mbrl.world_models.registry` (its entry's
    sections, fit, load, `is_recurrent`), never by testing its name (`model_kind_dispatch_in` says what is allowed)."""
    names = model_kind_names()
    found = [f"{path.relative_to(ROOT)}:{line}: {what}" for folder in ("mbrl", "agents", "envs")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for line, what in model_kind_dispatch_in(path.read_text(), names)]
    assert not found, "\n".join(found)
    # The walk sees each way of dispatching on a name, and lets a declaration and a preset's section through.
    probe = ('a = kind == "rwm"; b = k not in ("mlp", "rwm"); c = T["mlp"]; d = {"rwm": ("rwm", "rwm_fit")}\n'
             'e = Entry(model_kind="mlp"); f = {"rwm": {"history": 16}}; g = f"{kind} is not \'rwm\'"\n'
             'h = {"rwm": False, "steps": 10}')
    assert model_kind_dispatch_in(probe, names) == [(1, "compared"), (1, "compared"), (1, "subscript"), (1, "dict key")]
