"""One of two processes training together through jax.distributed on localhost (CPU, gloo).

  JAX_COORDINATOR_ADDRESS=localhost:PORT JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=i \\
      python -m tests.scripts.two_process WORKDIR
"""
import faulthandler
import json
import os
import sys

import jax

from hybrid_nope.analysis.measure.hook import RecencyHook
from hybrid_nope.train import distributed, loop
from tests.helpers import tiny_config

# Samples at the last step too: greedy decoding with parameters sharded over both processes.
TWO_PROCESS = dict(mesh__data=-1, train__steps=3, checkpoint__every_steps=3, eval__every_steps=3,
                   eval__sample_every_steps=3, eval__sample_prompts=("def ", "import"),
                   eval__sample_max_new_tokens=4)


def main(workdir):
  # A hang shows where: every thread's stack goes to stderr before the test gives up.
  faulthandler.dump_traceback_later(float(os.environ.get("STACKS_AFTER_S", "480")), exit=True)
  distributed.initialize()
  assert jax.process_count() == 2, jax.process_count()
  summary = loop.train(tiny_config(**TWO_PROCESS), workdir, hooks=[RecencyHook.for_run])
  # Restore on both processes: checksums of the sharded state, each process's data position
  # and the data fingerprint are verified; nothing is left to train or redo.
  again = loop.train(tiny_config(**TWO_PROCESS), workdir, hooks=[RecencyHook.for_run])
  print("RESULT " + json.dumps({"process": jax.process_index(), "summary": summary,
                                "resumed_at": again["step"]}))


if __name__ == "__main__":
  main(sys.argv[1])
