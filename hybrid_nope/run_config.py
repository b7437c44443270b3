"""A run's config on disk: WORKDIR/config.json holds it as the run started and is never
rewritten; WORKDIR/config_history.jsonl holds the run's events (its start, each config change a
resume was allowed to make, rollbacks, skips), a change with the full config after it. Readers
(analysis, the sweep) take the config in force now from here."""
from __future__ import annotations

import json

from hybrid_nope import storage

CONFIG_FILE = "config.json"
HISTORY_FILE = "config_history.jsonl"


def history(workdir: str) -> list[dict]:
  path = storage.join(workdir, HISTORY_FILE)
  if not storage.exists(path):
    return []
  return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]


def current(workdir: str, started_with: dict) -> dict:
  """The config in force now: the last one config_history.jsonl records, else `started_with`
  (config.json's)."""
  configs = [event["config"] for event in history(workdir) if "config" in event]
  return configs[-1] if configs else started_with
