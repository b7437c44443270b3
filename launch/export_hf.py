"""Export a run's checkpoint to Hugging Face (transformers' SmolLM3 layout; with L or D layers
plus the export's own modeling code).

  python launch/export_hf.py --workdir=DIR [--step=N] --out=OUT [--tokenizer=PATH]

Writes OUT/config.json, OUT/model.safetensors and the tokenizer (hybrid_nope/export/hf.py says
how each part maps); load it with transformers.AutoModelForCausalLM.from_pretrained(OUT), adding
trust_remote_code=True for a pattern with L or D layers (OUT then holds modeling_hybrid_nope.py).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For configs/.

from absl import flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.errors import UserError  # noqa: E402
from hybrid_nope.export import hf  # noqa: E402
from hybrid_nope.run.reader import open_readonly  # noqa: E402

flags.DEFINE_string("workdir", None, "Run directory written by launch/train.py.")
flags.DEFINE_integer("step", None, "Checkpoint step to export; default the latest.")
flags.DEFINE_string("out", None, "New or empty local directory for the Hugging Face files.")
flags.DEFINE_string("tokenizer", None, "tokenizer.json (or its directory) for runs on "
                    "pre-tokenised data (data.source=mds); a run whose config names its "
                    "tokenizer (the byte one, or data.tokenizer) exports that one.")
flags.DEFINE_integer("max_position_embeddings", hf.UNCAPPED_POSITIONS,
                     "config.json's max_position_embeddings: by default no limit an evaluation "
                     "hits (the layers have none); the training length would make "
                     "lm-evaluation-harness score in windows of it.")
flags.mark_flags_as_required(["workdir", "out"])


def main(argv):
  del argv
  if flags.FLAGS.max_position_embeddings < 1:
    raise UserError(f"--max_position_embeddings={flags.FLAGS.max_position_embeddings} is "
                    "invalid: expected a positive number of positions")
  result = hf.export(open_readonly(flags.FLAGS.workdir), flags.FLAGS.out, step=flags.FLAGS.step,
                     tokenizer=flags.FLAGS.tokenizer,
                     max_position_embeddings=flags.FLAGS.max_position_embeddings)
  print(f"exported step {result['step']}: {result['tensors']} tensors, "
        f"{result['bytes'] / 2**20:.1f} MiB float32")
  for path in result["files"]:
    print(f"  wrote {path}")
  print(f"  {result['tokenizer']}")


if __name__ == "__main__":
  cli.run(main)
