"""A layer kind is one spec (hybrid_nope/model/kind_specs.py): no other module compares a
pattern letter or keys a table by one, so a new kind is one spec entry, not a hunt through
`if letter == ...` branches. Read from the source (every module of the package and launch/)."""
import ast
import pathlib

from hybrid_nope.model.kind_specs import KINDS

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEC = "hybrid_nope/model/kind_specs.py"
# The Hugging Face remote code runs where hybrid_nope is not installed: it reads
# config.layer_kinds and keeps its own table of the mixers SmolLM3 lacks.
STANDALONE = {"hybrid_nope/export/modeling_hybrid_nope.py"}
LETTERS = set(KINDS)


def _letters(node) -> bool:
  """A string of kind letters ("G", "LD"), or a tuple, list or set holding one."""
  if isinstance(node, ast.Constant):
    return isinstance(node.value, str) and bool(node.value) and set(node.value) <= LETTERS
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return any(_letters(e) for e in node.elts)
  return False


def letter_comparisons(source: str) -> list[tuple[int, str]]:
  """(line, code) of each comparison with, `in` test on, match case of or table keyed by
  layer letters in `source`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare) and any(map(_letters, [node.left, *node.comparators])):
      found.append((node.lineno, ast.unparse(node)))
    elif isinstance(node, ast.MatchValue) and _letters(node.value):
      found.append((node.lineno, f"case {ast.unparse(node.value)}"))
    elif isinstance(node, ast.Dict) and any(k is not None and _letters(k) for k in node.keys):
      found.append((node.lineno, ast.unparse(node)[:80]))
  return found


def test_the_reader_finds_each_form_of_comparison():
  source = ('a = kind == "S"\nb = kind in "LD"\nc = "G" not in kinds\nd = k in ("L", "D")\n'
            'e = {"S": 1}\nmatch kind:\n  case "D":\n    pass\n'
            'f = name == "Sx"\ng = kinds[0] == layer\n')
  assert [line for line, _ in letter_comparisons(source)] == [1, 2, 3, 4, 5, 7]


def test_only_the_spec_module_compares_layer_letters():
  files = sorted([*(ROOT / "hybrid_nope").rglob("*.py"), *(ROOT / "launch").rglob("*.py")])
  where = {str(p.relative_to(ROOT)): letter_comparisons(p.read_text()) for p in files}
  offenders = {path: found for path, found in where.items()
               if found and path not in {SPEC} | STANDALONE}
  assert not offenders, ("layer letters compared outside the spec; ask KINDS[letter] instead: "
                         f"{offenders}")
