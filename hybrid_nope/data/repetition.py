"""The data's own repetition profile, P(t_i = t_{i−d}) over lags d, and whether it is monotone.

It describes the data (DESIGN.md: not a baseline for cosines): read it before the recency gaps
of a corpus, since a corpus whose tokens repeat more at lag 8 than at lag 4 (verse structure,
tables, periodic spelling) plants recency of its own. Pure numpy, on token ids by document (a
pair (i, i−d) counts only inside one document; every id of the document counts, BOS and EOS
included, as the recency hook's data record counts the rows).

The monotonicity rule. p(d) is a ratio of sums over documents, so its error comes from the
documents (clusters), and two lags share them: for consecutive lags d_k < d_{k+1} the rise
D_k = p(d_{k+1}) − p(d_k) has the paired, per-document standard error
se_k = sqrt(J/(J−1) Σ_j r_j²), r_j = (m_j,k+1 − p(d_{k+1}) n_j,k+1) / N_k+1 − (m_j,k − p(d_k) n_j,k) / N_k
(m matches, n pairs of document j, N pairs in all; the delta method for a ratio). The profile is
monotone non-increasing unless some D_k > Z · se_k, Z = 3 (one-sided; over the 9 steps of the
standard lags a family-wise false alarm of at most 9 × 0.00135 ≈ 1.2% on a truly flat profile).
A lag with no pair (documents shorter than it) is left out of the rule.
"""
from __future__ import annotations

import numpy as np

LAGS = tuple(2**k for k in range(10))  # 1, 2, 4, ..., 512: the standard lags.
Z = 3.0


def repetition_counts(docs: list[np.ndarray], lags=LAGS) -> tuple[np.ndarray, np.ndarray]:
  """(matches [J, K], pairs [J, K]) int64: per document j and lag d_k, Σ [t_i = t_{i−d}] and
  the number of pairs (i, i−d) inside it."""
  lags = _checked_lags(lags)
  matches = np.zeros((len(docs), len(lags)), np.int64)
  pairs = np.zeros_like(matches)
  for j, doc in enumerate(docs):
    t = np.asarray(doc)
    if t.ndim != 1:
      raise ValueError(f"document {j}: expected a 1-D array of token ids, got shape {t.shape}")
    for k, d in enumerate(lags):
      if t.size > d:
        matches[j, k] = np.count_nonzero(t[d:] == t[:-d])
        pairs[j, k] = t.size - d
  return matches, pairs


def repetition_profile(docs: list[np.ndarray], lags=LAGS) -> np.ndarray:
  """float64 [len(lags)]: P(t_i = t_{i−d}) over the pairs inside documents; NaN at a lag with
  no pair."""
  matches, pairs = repetition_counts(docs, lags)
  total = pairs.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(total > 0, matches.sum(0) / np.maximum(total, 1), np.nan)


def rises(docs: list[np.ndarray], lags=LAGS) -> tuple[np.ndarray, np.ndarray]:
  """(D [K−1], se [K−1]): p(d_{k+1}) − p(d_k) and its paired per-document standard error
  (module docstring); NaN where either lag has no pair or fewer than 2 documents count."""
  return rises_of_counts(*repetition_counts(docs, lags))


def rises_of_counts(matches, pairs) -> tuple[np.ndarray, np.ndarray]:
  """`rises` from per-document counts (matches [J, K], pairs [J, K]): what the recency hook's
  data record keeps per probe document, so the results page applies the same rule."""
  matches, pairs = np.asarray(matches, np.float64), np.asarray(pairs, np.float64)
  total = pairs.sum(0).astype(np.float64)
  p = np.where(total > 0, matches.sum(0) / np.maximum(total, 1), np.nan)
  with np.errstate(invalid="ignore", divide="ignore"):
    resid_JK = (matches - p * pairs) / total  # Each document's share of p's error.
  diff = p[1:] - p[:-1]
  r_JK = resid_JK[:, 1:] - resid_JK[:, :-1]
  counted = np.count_nonzero(pairs[:, 1:] > 0, axis=0)  # Documents reaching the longer lag.
  j = matches.shape[0]
  with np.errstate(invalid="ignore", divide="ignore"):
    se = np.sqrt(j / max(j - 1, 1) * np.sum(r_JK**2, axis=0))
  se = np.where(counted >= 2, se, np.nan)
  return diff, se


def is_monotone(docs: list[np.ndarray], lags=LAGS, z: float = Z) -> bool:
  """Whether the profile is non-increasing within sampling noise: no rise D_k > z · se_k
  between consecutive lags that both have pairs (module docstring)."""
  return monotone_rises(*rises(docs, lags), z=z)


def monotone_rises(diff, se, z: float = Z) -> bool:
  """No rise beyond z of its standard errors (`rises` or `rises_of_counts` give them)."""
  diff, se = np.asarray(diff, np.float64), np.asarray(se, np.float64)
  seen = ~np.isnan(diff)
  return bool(np.all(diff[seen] <= z * np.nan_to_num(se[seen], nan=0.0)))


def report(docs: list[np.ndarray], lags=LAGS, z: float = Z) -> dict:
  """The profile as the results page shows it: {"lags", "profile", "pairs", "rises",
  "rises_stderr", "monotone", "rule"} (JSON values; NaN as None)."""
  lags = _checked_lags(lags)
  _, pairs = repetition_counts(docs, lags)
  diff, se = rises(docs, lags)

  def listed(x):
    return [None if np.isnan(v) else float(v) for v in x]
  return {"lags": list(lags), "profile": listed(repetition_profile(docs, lags)),
          "pairs": [int(n) for n in pairs.sum(0)], "rises": listed(diff),
          "rises_stderr": listed(se), "monotone": is_monotone(docs, lags, z),
          "rule": f"non-increasing unless p(d_k+1) - p(d_k) > {z:g} x its paired "
                  f"per-document standard error at some step"}


def prepared_profile(path: str, split: str = "eval", lags=LAGS) -> dict:
  """`report` of a prepared documents directory's split (hybrid_nope.data.sources.documents), e.g.
  the prose corpus's eval split: launch/prepare_prose.py prints it, the results page shows it."""
  from hybrid_nope.data.sources import documents  # pylint: disable=g-import-not-at-top
  return {"path": path, "split": split, **report(documents.documents(path, split), lags)}


def summary(profile: dict) -> str:
  """`prepared_profile`'s dict in lines, for a CLI to print."""
  lags, p = profile["lags"], profile["profile"]
  cells = "  ".join(f"{d}:{'-' if v is None else f'{v:.4f}'}" for d, v in zip(lags, p))
  verdict = "monotone non-increasing" if profile["monotone"] else "NOT monotone"
  steps = [(r / s if s else np.copysign(np.inf, r), lags[k + 1]) for k, (r, s) in enumerate(
      zip(profile["rises"], profile["rises_stderr"])) if r is not None and s is not None]
  worst = f"; largest step {max(steps)[0]:+.1f} se, into lag {max(steps)[1]}" if steps else ""
  return (f"repetition profile P(t_i = t_i-d) of the {profile['split']} split ({profile['path']}):"
          f"\n  {cells}\n  {verdict} ({profile['rule']}{worst})")


def _checked_lags(lags) -> tuple[int, ...]:
  lags = tuple(int(d) for d in lags)
  if not lags or any(d < 1 for d in lags) or any(b <= a for a, b in zip(lags, lags[1:])):
    raise ValueError(f"lags must be increasing positive ints, got {lags}")
  return lags
