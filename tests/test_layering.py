"""The package's layering (docs/architecture.md): which module may import which, read from the
source (every import statement, at module level or inside a function)."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hybrid_nope"


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path) -> set[str]:
  """The hybrid_nope modules `path` imports (a `from package import name` counts as the
  submodule when one of that name exists, else as the package)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith("hybrid_nope")}
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
        "hybrid_nope"):
      for alias in node.names:
        sub = f"{node.module}.{alias.name}"
        is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or (
            ROOT / sub.replace(".", "/") / "__init__.py").exists()
        found.add(sub if is_module else node.module)
  return found


GRAPH = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _reachable(start: str, graph: dict = GRAPH) -> set[str]:
  seen, todo = set(), [start]
  while todo:
    for dep in graph.get(todo.pop(), ()):
      if dep not in seen:
        seen.add(dep)
        todo.append(dep)
  return seen


def test_the_graph_reads_the_imports_it_should():
  # The reader itself could fail silently; a known edge and a known non-edge pin it.
  assert "hybrid_nope.config_values" in GRAPH["hybrid_nope.data.pipeline.loader"]
  assert "hybrid_nope.analysis.measure.recency" in GRAPH["hybrid_nope.analysis.measure.hook"]
  assert "hybrid_nope.validate" in GRAPH["hybrid_nope.train.loop"]


def test_data_does_not_import_the_whole_config_check():
  offenders = sorted(m for m, deps in GRAPH.items()
                     if m.startswith("hybrid_nope.data") and "hybrid_nope.validate" in deps)
  assert not offenders, f"{offenders} import hybrid_nope.validate; read values through config_values"


def _package(module: str) -> str:
  """A module's top-level room: hybrid_nope.X for a subpackage X, else the root module itself."""
  parts = module.split(".")
  if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
    return ".".join(parts[:2])
  return module


def test_no_package_imports_itself_through_others():
  # Modules may be acyclic while their packages are not (train.sharding -> validate ->
  # train.lr_schedule): a package then cannot be read, tested or moved alone.
  packages = {}
  for module, deps in GRAPH.items():
    packages.setdefault(_package(module), set()).update(
        _package(d) for d in deps if _package(d) != _package(module))
  cycles = sorted(p for p in packages if p in _reachable(p, packages))
  assert not cycles, f"package circles through {cycles}"


def test_no_module_imports_itself_through_others():
  # Package __init__ files that only document are leaves; the contract aliases point one way.
  cycles = sorted(m for m in GRAPH if m in _reachable(m))
  assert not cycles, f"import circles through {cycles}"


@pytest.mark.parametrize("room", ["checkpoint", "evidence"])
def test_the_in_loop_measurement_needs_no_offline_room(room):
  # launch/train.py hands measure.hook to the loop: it may reach measure/ and present/'s plots,
  # never what reads checkpoints or compares runs.
  reached = _reachable("hybrid_nope.analysis.measure.hook")
  assert not {m for m in reached if m.startswith(f"hybrid_nope.analysis.{room}")}


def test_train_and_analysis_never_import_each_other():
  for a, b in (("train", "analysis"), ("analysis", "train")):
    offenders = sorted(m for m, deps in GRAPH.items() if m.startswith(f"hybrid_nope.{a}")
                       and any(d.startswith(f"hybrid_nope.{b}") for d in deps))
    assert not offenders, f"{offenders} import hybrid_nope.{b}"


def test_the_run_directory_layout_stands_on_storage_alone():
  # train and analysis both ask run_dir for paths: it must reach neither.
  assert GRAPH["hybrid_nope.run.run_dir"] <= {"hybrid_nope.run.storage"}


def test_the_run_package_imports_no_model_train_or_analysis():
  # Everything else reads a workdir through run/: run/ reaching back would make circles.
  offenders = sorted((m, d) for m, deps in GRAPH.items() if m.startswith("hybrid_nope.run")
                     for d in deps if d.startswith(("hybrid_nope.model", "hybrid_nope.train",
                                                    "hybrid_nope.analysis")))
  assert not offenders, f"run/ imports {offenders}"


def test_export_reads_a_run_through_run_not_analysis_or_train():
  offenders = sorted((m, d) for m, deps in GRAPH.items() if m.startswith("hybrid_nope.export")
                     for d in deps if d.startswith(("hybrid_nope.analysis", "hybrid_nope.train")))
  assert not offenders, f"export imports {offenders}"


def _is_private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def _private_uses(source: str, where: str) -> set[str]:
  """`where: name` for each _private name of another hybrid_nope module that `source` imports
  (`from hybrid_nope.x import _name`) or reads as an attribute of an imported name
  (`x._name`, `hybrid_nope.x._name`)."""
  tree = ast.parse(source)
  imported, found = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
        "hybrid_nope"):
      for alias in node.names:
        if _is_private(alias.name):
          found.add(f"{where}: {alias.name}")
        imported.add(alias.asname or alias.name)
    elif isinstance(node, ast.Import):
      imported |= {a.asname or a.name.split(".")[0] for a in node.names
                   if a.name.startswith("hybrid_nope")}
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and _is_private(node.attr):
      base = node.value
      while isinstance(base, ast.Attribute):
        base = base.value
      if isinstance(base, ast.Name) and base.id in imported:
        found.add(f"{where}: {node.attr}")
  return found


def test_the_private_name_reader_sees_imports_and_attributes():
  source = ("from hybrid_nope.kernels import linear_xla\n"
            "import hybrid_nope.run.storage as st\n"
            "import hybrid_nope.run_dir\n"
            "from hybrid_nope.data.formats.mds.index import _Shard\n"
            "linear_xla._levels(1)\nst._open\nhybrid_nope.run_dir._layout\n"
            "self._own = 1\nlinear_xla.__name__\n")
  assert _private_uses(source, "m.py") == {"m.py: _Shard", "m.py: _levels", "m.py: _open",
                                           "m.py: _layout"}


def test_no_module_imports_or_uses_another_modules_private_name():
  # A helper one module shares with another is part of its interface: a public name says so,
  # and a rename inside its module cannot break a reader the module does not know of.
  offenders = set().union(*(_private_uses(p.read_text(), p.relative_to(ROOT).as_posix())
                            for p in PACKAGE.rglob("*.py")))
  assert not offenders, (
      f"private names used across modules: {sorted(offenders)}; give "
      f"each a public name where it belongs, or move it to a module its users share")
