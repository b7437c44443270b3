"""The primary family: claims registered in a committed file before the runs that decide them.

docs/results/primary.toml lists, per corpus, at most MAX_CLAIMS claims, each with one named
statistic (`primary_statistics.STATISTICS`), its direction, null, absolute margin and configs,
and the seeds and init draws every claim gets. `load` reads and checks it (a bad entry fails
naming the claim and key); `decide` turns one corpus's packs into one `verdict_rules.Verdict` per
claim, Holm-adjusted inside the family alone; `registration` compares the file's last commit
with the commits that added the packs, so the page can say when the claims were changed after
the runs that decide them. Every other row of the page is exploratory: `adjust_exploratory`
gives it Benjamini–Hochberg q-values (scipy's `false_discovery_control`) in place of Holm.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import tomllib
from typing import Sequence

import scipy.stats

from hybrid_nope.analysis.evidence import primary_statistics, verdict_rules
from hybrid_nope.analysis.evidence.verdict_rules import Verdict

DEFAULT_PATH = "docs/results/primary.toml"
MAX_CLAIMS = 12   # Per corpus: a family small enough for Holm to leave it power.
MIN_SEEDS = 8     # Trained claims.
MIN_INIT_DRAWS = 30
CLAIM_KEYS = ("id", "claim", "statistic", "configs", "direction", "null", "margin", "unit",
              "level")
CORPUS_KEYS = ("title", "config_file", "records_dir")


@dataclasses.dataclass(frozen=True)
class Claim:
  id: str
  claim: str
  statistic: str
  configs: tuple[str, ...]
  direction: int
  null: str
  margin: float
  unit: str
  level: str


@dataclasses.dataclass(frozen=True)
class Corpus:
  name: str
  title: str
  config_file: str
  records_dir: str


@dataclasses.dataclass(frozen=True)
class Registry:
  path: str
  alpha: float
  seeds: tuple[int, ...]
  init_draws: int
  corpora: dict[str, Corpus]
  claims: tuple[Claim, ...]

  @property
  def configs(self) -> list[str]:
    """Every config a claim names, in the order first named."""
    return list(dict.fromkeys(c for claim in self.claims for c in claim.configs))


class RegistryError(ValueError):
  pass


def _require(table: dict, keys: Sequence[str], where: str) -> None:
  missing = [k for k in keys if k not in table]
  unknown = sorted(set(table) - set(keys))
  if missing or unknown:
    raise RegistryError(f"{where}: " + "; ".join(
        ([f"missing {', '.join(missing)}"] if missing else [])
        + ([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])))


def _claim(table: dict, where: str) -> Claim:
  _require(table, CLAIM_KEYS, where)
  where = f"{where} ({table['id']!r})"
  if table["statistic"] not in primary_statistics.STATISTICS:
    raise RegistryError(f"{where}: statistic {table['statistic']!r} is not one of "
                        f"{sorted(primary_statistics.STATISTICS)}")
  configs = tuple(table["configs"])
  expected = primary_statistics.STATISTICS[table["statistic"]].configs
  if len(configs) != expected:
    raise RegistryError(f"{where}: statistic {table['statistic']!r} takes {expected} config(s), "
                        f"configs lists {len(configs)}")
  if table["direction"] not in (1, -1):
    raise RegistryError(f"{where}: direction must be 1 or -1, got {table['direction']!r}")
  margin = table["margin"]
  if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
    raise RegistryError(f"{where}: margin must be a positive number, got {margin!r}")
  return Claim(table["id"], table["claim"], table["statistic"], configs, table["direction"],
               table["null"], float(margin), table["unit"], table["level"])


def load(path: str = DEFAULT_PATH) -> Registry:
  """The registry at `path`, checked: ids unique, at most MAX_CLAIMS, every statistic known,
  at least MIN_SEEDS seeds and MIN_INIT_DRAWS init draws."""
  try:
    with open(path, "rb") as f:
      raw = tomllib.load(f)
  except (OSError, tomllib.TOMLDecodeError) as e:
    raise RegistryError(f"{path}: cannot read the primary family: {e}") from e
  _require(raw, ("version", "alpha", "seeds", "init_draws", "corpora", "claims"), path)
  if raw["version"] != 1:
    raise RegistryError(f"{path}: version {raw['version']!r}; this code reads version 1")
  seeds = tuple(raw["seeds"])
  if len(set(seeds)) != len(seeds) or len(seeds) < MIN_SEEDS:
    raise RegistryError(f"{path}: seeds {list(seeds)}: need at least {MIN_SEEDS} distinct seeds")
  if raw["init_draws"] < MIN_INIT_DRAWS:
    raise RegistryError(f"{path}: init_draws {raw['init_draws']} < {MIN_INIT_DRAWS}")
  if not 0 < raw["alpha"] < 1:
    raise RegistryError(f"{path}: alpha {raw['alpha']!r} is not in (0, 1)")
  corpora = {}
  for name, table in raw["corpora"].items():
    _require(table, CORPUS_KEYS, f"{path}: corpora.{name}")
    corpora[name] = Corpus(name, table["title"], table["config_file"], table["records_dir"])
  claims = tuple(_claim(t, f"{path}: claims[{i}]") for i, t in enumerate(raw["claims"]))
  ids = [c.id for c in claims]
  if len(set(ids)) != len(ids):
    raise RegistryError(f"{path}: claim ids repeat: {sorted(i for i in ids if ids.count(i) > 1)}")
  if len(claims) > MAX_CLAIMS:
    raise RegistryError(f"{path}: {len(claims)} claims; a primary family holds at most "
                        f"{MAX_CLAIMS} per corpus")
  return Registry(path, float(raw["alpha"]), seeds, int(raw["init_draws"]), corpora, claims)


def required(registry: Registry, claim: Claim) -> int:
  """How many values the claim is registered to be decided on: its init draws or its seeds."""
  per_draw = primary_statistics.STATISTICS[claim.statistic].per_draw
  return registry.init_draws if per_draw else len(registry.seeds)


def pending(registry: Registry, verdicts: Sequence[Verdict]) -> list[bool]:
  """Per claim: fewer values than registered. A pending claim is shown, never decided: reading
  a verdict off the first seeds and stopping when it looks good would be optional stopping."""
  return [v.n < required(registry, c) for c, v in zip(registry.claims, verdicts)]


def decide(registry: Registry, evidence: primary_statistics.Evidence) -> list[Verdict]:
  """One Verdict per claim (its values empty where the corpus's packs cannot compute it yet),
  Holm-adjusted inside the family: differences as one family, equivalences as the second. The
  family's size is the registered one: a pending claim counts with p = 1 (it has not rejected),
  and its own adjusted p stays None."""
  out = []
  for claim in registry.claims:
    v = primary_statistics.STATISTICS[claim.statistic](evidence, claim.configs)
    out.append(dataclasses.replace(
        v, finding=claim.claim, null=claim.null, sign=claim.direction, margin=claim.margin,
        margin_rule=f"{claim.margin:g} {claim.unit} (registered)"))
  waiting = pending(registry, out)
  decided = [v for v, w in zip(out, waiting) if not w]
  stand_ins = [Verdict("", "", "", [], p_exact=1.0) for w in waiting if w]
  verdict_rules.adjust(decided + stand_ins)
  for v, w in zip(out, waiting):
    if w:
      v.p_adjusted = v.p_tost_adjusted = None
  return out


def adjust_exploratory(verdicts: Sequence[Verdict]) -> None:
  """Benjamini–Hochberg q-values over the exploratory rows, for the difference tests and for
  the equivalence tests; each verdict then reads its q where a decided row reads Holm's p."""
  for raw, field in (([v.p for v in verdicts], "p_adjusted"),
                     ([v.p_tost for v in verdicts], "p_tost_adjusted")):
    known = [i for i, p in enumerate(raw) if p is not None]
    q = scipy.stats.false_discovery_control([raw[i] for i in known]) if known else []
    for v in verdicts:
      setattr(v, field, None)
    for i, qi in zip(known, q):
      setattr(verdicts[i], field, float(qi))


def _git(args: Sequence[str], cwd: str) -> str:
  result = subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd)
  return result.stdout.strip() if result.returncode == 0 else ""


def _claim_tables(text: str) -> dict[str, dict]:
  try:
    return {c.get("id"): c for c in tomllib.loads(text).get("claims", [])}
  except (tomllib.TOMLDecodeError, AttributeError):
    return {}


def amended_since(path: str, before: int) -> tuple[str | None, list[str]]:
  """The file's last commit at or before time `before` (the version the earliest runs were
  registered under) and the ids of the claims that differ from it now, in the file's order
  (a claim added since counts; a comment does not)."""
  repo = os.path.dirname(os.path.abspath(path))
  history = [line.split() for line in _git(
      ["log", "--format=%H %ct", "--", os.path.abspath(path)], repo).splitlines()]
  old = next((h for h, t in history if int(t) <= before), None)
  if old is None:
    return None, []
  rel = _git(["ls-files", "--full-name", os.path.abspath(path)], repo)
  then = _claim_tables(_git(["show", f"{old}:{rel}"], repo))
  with open(path, "rb") as f:
    now = _claim_tables(f.read().decode())
  return old[:7], [i for i, c in now.items() if then.get(i) != c]


def registration(path: str, packs: Sequence[str]) -> dict:
  """The file's last commit against the commits that first added each pack: `changed_after`
  lists the packs added before the file's last change (the claims were edited after those runs
  were in), `uncommitted` the packs not yet committed (they are newer than any commit); where
  some are, `amended` names the claims that differ from the version the earliest of them was
  registered under (`registered_at`, `amended_since`)."""
  repo = os.path.dirname(os.path.abspath(path))
  last = _git(["log", "-1", "--format=%H %ct", "--", os.path.abspath(path)], repo).split()
  out = {"file": path, "commit": last[0][:7] if last else None,
         "time": int(last[1]) if last else None, "changed_after": [], "uncommitted": [],
         "packs": len(packs)}
  added_before = []  # When each pack added before the file's last change was first committed.
  for pack in packs:
    added = _git(["log", "--diff-filter=A", "--format=%ct", "--", os.path.abspath(pack)],
                 os.path.dirname(os.path.abspath(pack))).split()
    if not added:
      out["uncommitted"].append(pack)
    elif out["time"] is None or int(added[-1]) < out["time"]:
      out["changed_after"].append(pack)
      added_before.append(int(added[-1]))
  out["registered_at"], out["amended"] = None, []
  if added_before:
    out["registered_at"], out["amended"] = amended_since(path, min(added_before))
  return out


def registration_line(reg: dict) -> str:
  if reg["commit"] is None:
    return (f"The primary family's file `{reg['file']}` is not committed: these claims are not "
            "registered.")
  line = (f"Registered in `{reg['file']}` at commit {reg['commit']}; {reg['packs']} run pack(s) "
          "decide it.")
  if not reg["packs"]:
    line += " No run pack is in yet."
  elif reg["changed_after"]:
    line += (f" **The file was changed after {len(reg['changed_after'])} of these runs were "
             "committed** (" + ", ".join(f"`{p}`" for p in reg["changed_after"][:4])
             + (", …" if len(reg["changed_after"]) > 4 else "") + ")")
    if reg.get("registered_at") is None:
      line += ": their claims were not registered before them."
    elif reg["amended"]:
      line += (f". Against the version those runs were registered under (commit "
               f"{reg['registered_at']}), the claim(s) {', '.join(reg['amended'])} were amended "
               "after them (the file says why); every other claim is as registered.")
    else:
      line += (f"; no claim differs from the version those runs were registered under (commit "
               f"{reg['registered_at']}).")
  else:
    line += " Every pack was committed after the file's last change."
  if reg["uncommitted"]:
    line += f" {len(reg['uncommitted'])} pack(s) are not yet committed."
  return line
