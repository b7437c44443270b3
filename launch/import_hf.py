"""Import a transformers checkpoint of the SmolLM3 layout (our export's) as a workdir.

  python launch/import_hf.py --hf=DIR --out=WORKDIR [--config.a.b=v ...]

Reads DIR/config.json and the safetensors weights (local; nothing is downloaded) and writes
WORKDIR/config.json, checkpoints/1/ and the tokenizer (hybrid_nope/export/hf_import.py maps the
model, import_workdir.py writes the workdir), which launch/analyze.py, score.py, generate.py and
export_hf.py read. --config.* sets the rest of the config (configs/base.py's defaults), e.g. the
analysis' data: --config.eval.path=, --config.data.seq_len=; model.* comes from DIR.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For configs/.

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from configs import base  # noqa: E402
from hybrid_nope import cli  # noqa: E402
from hybrid_nope.export import import_workdir  # noqa: E402

flags.DEFINE_string("hf", None, "Local directory of a transformers checkpoint (config.json, "
                    "model.safetensors or its shards, tokenizer.json).")
flags.DEFINE_string("out", None, "New or empty directory for the workdir.")
cli.define_config_dict("config", base.get_config(),
                       "The workdir's config beside model.*, e.g. --config.eval.path=.")
flags.mark_flags_as_required(["hf", "out"])


def main(argv):
  del argv
  overrides = config_flags.get_override_values(flags.FLAGS["config"])
  result = import_workdir.import_hf(flags.FLAGS.hf, flags.FLAGS.out, flags.FLAGS.config,
                                    list(overrides))
  print(import_workdir.summary(result))


if __name__ == "__main__":
  cli.run(main)
