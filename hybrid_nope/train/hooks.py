"""What the loop hands to the hooks it is given (nanodo's `for h in hooks: h(step, ...)`).

A hook factory takes the run's `RunContext` once, after the model and eval data exist, and
returns `hook(step, params) -> None`. The loop calls every hook at step 0 of a fresh run and
every `metrics.every_steps` (and at the last step), times each and logs `<name>_seconds`; what a
hook measures or writes is its own business, so the trainer imports no analysis code. A hook
may set `every_steps` (its own period instead of metrics.every_steps) and `at_start = False`
(not at step 0); each hook is one entry of the loop's schedule (train/schedule.py), beside eval,
samples and checkpoints, with their rules: skipped on a preempted step, cut short by a signal.

A run resumed at a step whose hook did not finish (`<name>_seconds` is not on record, e.g. a
preemption save skips the hooks) runs that hook again at that step, after removing the step's
records from the files the hook lists in its optional `record_files`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

Hook = Callable[[int, Any], None]


@dataclasses.dataclass(frozen=True)
class RunContext:
  config: Any                         # the run's ConfigDict (validated)
  model_def: Any                      # hybrid_nope.model.definition.ModelDef
  eval_batches: Sequence[dict]        # every process's whole eval set, host numpy, in order
  probe_rows: dict                    # the recency probe's pool (data.pipeline.probe_pool)
  writer: Any                         # hybrid_nope.run.metrics_writer.MetricsWriter
  replicate: Callable[[Any], Any]     # host tree -> the same tree replicated on the mesh


HookFactory = Callable[[RunContext], Hook]


def hook_name(hook: Hook) -> str:
  """`hook.name` if it has one, else its class or function name."""
  return getattr(hook, "name", None) or getattr(hook, "__name__", type(hook).__name__)
