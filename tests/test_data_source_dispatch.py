"""`data.source` is dispatched in one module (issue 49): the source names are compared, and the
value of data.source is tested against them, only in hybrid_nope/data/sources/registry.py.
Read from the source (every comparison in the package), as test_layering reads the imports."""
import ast
import pathlib

from hybrid_nope.data.sources import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hybrid_nope"
DISPATCH = PACKAGE / "data" / "sources" / "registry.py"
NAMES = set(registry.NAMES)


def _is_source_value(node: ast.AST) -> bool:
  """`source`, `x.source` (config.data.source, d.source, report.source), or a read of the key
  "data.source" (value(config, "data.source"), config.data.get("source"))."""
  if isinstance(node, ast.Name):
    return node.id == "source"
  if isinstance(node, ast.Attribute):
    return node.attr == "source"
  if isinstance(node, ast.Call):
    return any(isinstance(a, ast.Constant) and a.value in ("data.source", "source")
               for a in node.args)
  return False


def _is_source_names(node: ast.AST) -> bool:
  """A source's name ("mds"), or a collection of them ("stdlib", "documents") or a table of them
  (a name ending in SOURCES)."""
  if isinstance(node, ast.Constant):
    return node.value in NAMES
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return any(_is_source_names(e) for e in node.elts)
  if isinstance(node, ast.Dict):
    return any(k is not None and _is_source_names(k) for k in node.keys)
  name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
  return name.endswith("SOURCES")


def _comparisons(path: pathlib.Path) -> list[str]:
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      if any(map(_is_source_value, sides)) and any(map(_is_source_names, sides)):
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    # A table keyed by source names, looked up with data.source ({"mds": ...}.get(source)).
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and _is_source_names(node.func.value) and any(map(_is_source_value, node.args))):
      found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
  return found


def test_the_reader_finds_a_comparison_it_should():
  # The reader could fail silently: a known comparison of each form is found.
  code = ('if config.data.source == "mds": pass\nif source in ("stdlib", "documents"): pass\n'
          'if value(config, "data.source") != "hf": pass\nx = {"mds": 1}.get(source)\n'
          'if d.source in TEXT_SOURCES: pass\nif source not in records[l]: pass\n')
  probe = ROOT / "tests" / "_source_dispatch_probe.py"
  probe.write_text(code)
  try:
    assert len(_comparisons(probe)) == 5  # The last compares a record key, not data.source.
  finally:
    probe.unlink()


def test_data_source_is_compared_only_in_the_registry():
  offenders = [c for p in sorted(PACKAGE.rglob("*.py")) if p != DISPATCH
               for c in _comparisons(p)]
  assert not offenders, ("data.source compared outside hybrid_nope/data/sources/registry.py "
                         "(ask the registry: registry.named(config) and its Source's fields):\n"
                         + "\n".join(offenders))


def test_every_source_has_one_entry_with_its_readers():
  assert tuple(registry.SOURCES) == registry.NAMES
  for name, source in registry.SOURCES.items():
    assert source.name == name
    assert all(callable(f) for f in (source.rows, source.fingerprint, source.tokenizer_files,
                                     source.check_keys))
    assert not (source.byte_tokens and source.text), name  # A text source's ids are its tokenizer's.
