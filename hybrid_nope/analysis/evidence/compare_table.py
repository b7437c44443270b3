"""The compare table's cells and rows (compare.md; results.md and the HTML report show the
same cells): a value with its ± where the row has one, "—" where it has none."""
from __future__ import annotations

from typing import Sequence


def cell(value, spec: str, se=None) -> str:
  if value is None:
    return "—"
  text = format(value, spec) if isinstance(value, float) else str(value)
  if se is None or not isinstance(value, float):
    return text
  return f"{text} ± {format(se, spec.lstrip('+'))}"


# (column header, row key, format); float cells show "value ± <key>_se" where the row has one.
COLUMNS = (
    ("run", "name", ""), ("train.seed", "seeds", ""), ("pattern", "pattern", ""),
    ("layers", "num_layers", ""), ("d_model", "d_model", ""), ("window", "window", ""),
    ("SWA pos", "swa_pos", ""), ("local recency scale (GLA 1/(1−α), delta 1/(1−α(1−β/H)))", "recency_scale", ".1f"),
    ("eval step", "eval_step", ""),
    ("final eval loss", "eval_loss", ".4f"), ("recency step", "step", ""),
    ("gap", "gap", ".4f"), ("floor", "floor", ".4f"), ("data gap", "data_gap", ".4f"),
    ("gap Welch t (init null)", "gap_null_t", "+.1f"),
    ("gap − gap at init", "gap_since_init", "+.4f"),
    ("gap, queries with far lag", "gap_matched", ".4f"),
    ("shuffled-token gap", "shuffled_gap", ".4f"),
    ("logit gap", "logit_gap", "+.4f"), ("logit gap random-M null", "logit_gap_null", ".3g"),
    ("logit gap Welch t (init null)", "logit_gap_null_t", "+.1f"),
    ("alignment", "alignment", "+.4f"),
    ("alignment null", "alignment_null", ".3g"),  # 1/(d_model sqrt(heads)): significant digits.
    ("alignment Welch t (init null)", "alignment_null_t", "+.1f"),
    ("logit-gap sign flips", "logit_gap_sign_flips", ".1f"),
)


def value_cell(row: dict, key: str, spec: str) -> str:
  value = row.get(key)
  if key == "seeds":
    return ", ".join(map(str, value))
  if key == "logit_gap_sign_flips" and row["n_seeds"] == 1:
    return cell(value, "")  # A count; a seed mean needs the decimal.
  return cell(value, spec, row.get(f"{key}_se"))


def table(rows: Sequence[dict]) -> str:
  factors = sorted({k for r in rows for k in r["ratio"]})
  header = [c[0] for c in COLUMNS] + ["extrap. step"] + [f"ratio {k}×" for k in factors]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in rows:
    cells = [value_cell(r, key, spec) for _, key, spec in COLUMNS]
    cells += [cell(r["extrapolation_step"], "")]
    cells += [cell(r["ratio"].get(k), ".4f", r["ratio_se"].get(k)) for k in factors]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
