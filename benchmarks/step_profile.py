"""Where one train step's time goes on XLA:CPU: thunk times from the profiler, by source line.

  python benchmarks/step_profile.py --size=120m --seq_len=8192 --pattern=SG

Runs the trainer's sharded step (as benchmarks/train_step.py) once to compile and warm up, then
once under jax.profiler with XLA:CPU's per-thunk trace annotations on. Each thunk is an HLO
instruction; its metadata names the Python line that emitted it, so the tables say which line
of the model, loss or optimizer the time is spent on. Times are exclusive: a loop's own thunk
(a while, which holds the attention kernel's tiles or the remat scan) is not counted on top of
the thunks it runs. Thunks on parallel threads add up, so shares are of the summed thunk time.
"""
import argparse
import collections
import glob
import os
import re
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hybrid_nope import xla_flags  # noqa: E402  (imports no jax)

# Read at backend start-up, so before jax is imported.
xla_flags.set_in_environ("--xla_cpu_enable_xprof_traceme", "true")

import jax  # noqa: E402

from benchmarks.train_step import config_for, step_and_batch  # noqa: E402
from hybrid_nope.train import sharding  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION_ROW = re.compile(r'^\s*(\d+) (?:"(.*)"|\{(.*)\})\s*$')


def _frame_tables(hlo_text: str) -> dict[str, dict[int, object]]:
  """The FileNames, FunctionNames, FileLocations and StackFrames sections of an HLO module's
  text (where newer XLA keeps source locations), as {section: {id: value}}."""
  tables, section = {}, None
  for line in hlo_text.splitlines():
    if line.strip() in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
      section = tables.setdefault(line.strip(), {})
      continue
    row = SECTION_ROW.match(line) if section is not None else None
    if row is None:
      section = None
      continue
    fields = dict(kv.split("=") for kv in row.group(3).split()) if row.group(3) else None
    section[int(row.group(1))] = row.group(2) if fields is None else fields
  return tables


def _short(path: str) -> str:
  """Repository files relative to it; installed packages from their package name."""
  if "site-packages/" in path:
    return path.split("site-packages/", 1)[1]
  return os.path.relpath(path, REPO) if path.startswith(REPO) else path


def instruction_sources(hlo_text: str) -> tuple[dict[str, str], set[str]]:
  """(instruction name -> 'file:line function' of the Python that emitted it, names of
  loop/call instructions whose thunks contain others)."""
  tables = _frame_tables(hlo_text)
  files, functions = tables.get("FileNames", {}), tables.get("FunctionNames", {})
  locations, frames = tables.get("FileLocations", {}), tables.get("StackFrames", {})
  sources, containers = {}, set()
  for line in hlo_text.splitlines():
    match = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = ", line)
    if not match:
      continue
    name = match.group(1)
    if re.search(r"\s(while|conditional|call)\(", line):
      containers.add(name)
    frame = re.search(r"stack_frame_id=(\d+)", line)
    legacy = re.search(r'source_file="([^"]*)" source_line=(\d+)', line)
    if frame and int(frame.group(1)) in frames:
      loc = locations[int(frames[int(frame.group(1))]["file_location_id"])]
      sources[name] = (f"{_short(files[int(loc['file_name_id'])])}:{loc['line']} "
                       f"{functions[int(loc['function_name_id'])]}")
    elif legacy:
      sources[name] = f"{_short(legacy.group(1))}:{legacy.group(2)}"
  return sources, containers


def thunk_seconds(trace_dir: str) -> dict[str, float]:
  """Total seconds per event name on the host plane of the XSpace jax.profiler wrote (read
  directly: the perfetto conversion kept only the start of a long step)."""
  (path,) = glob.glob(os.path.join(trace_dir, "plugins/profile/*/*.xplane.pb"))
  totals = collections.defaultdict(float)
  for plane in jax.profiler.ProfileData.from_file(path).planes:
    for line in plane.lines:
      for event in line.events:
        totals[event.name] += event.duration_ns / 1e9
  return totals


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--size", default="120m")
  p.add_argument("--pattern", default="SG")
  p.add_argument("--seq_len", type=int, default=8192)
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--remat", action="store_true")
  p.add_argument("--layers", type=int, default=0, help="override the size's layer count")
  p.add_argument("--top", type=int, default=25)
  args = p.parse_args()
  config = config_for(args.size, args.pattern, args.seq_len, args.vocab, args.remat, tensor=1)
  if args.layers:
    config.model.num_layers = args.layers
  step, state, batch, mesh = step_and_batch(config, batch_size=1)
  with sharding.activation_rules(mesh):
    compiled = step.lower(state, batch).compile()
    sources, containers = instruction_sources(compiled.as_text())
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
      per_thunk = thunk_seconds(trace_dir)

  by_line, by_file = collections.Counter(), collections.Counter()
  for name, seconds in per_thunk.items():
    if name in sources and name not in containers:
      by_line[sources[name]] += seconds
      by_file[sources[name].split(":", 1)[0]] += seconds
  total = sum(by_line.values())
  print(f"jax {jax.__version__}; {args.size} {args.pattern} seq_len {args.seq_len} "
        f"layers {config.model.num_layers} vocab {config.model.vocab_size} remat {args.remat}: "
        f"step {wall:.2f} s wall under the profiler, {total:.2f} s of thunk time, "
        f"{after.ru_minflt - before.ru_minflt} minor page faults, "
        f"{after.ru_stime - before.ru_stime:.2f} s system CPU time\n")
  for title, counter, top in (("file", by_file, None), ("line", by_line, args.top)):
    print(f"| {title} | seconds | share |\n|---|---|---|")
    for key, seconds in counter.most_common(top):
      print(f"| {key} | {seconds:.2f} | {100 * seconds / total:.1f}% |")
    print()


if __name__ == "__main__":
  main()
