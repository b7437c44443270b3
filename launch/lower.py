"""Lower the full train step for TPU or CUDA without the hardware (jax.export):

  python launch/lower.py --config=configs/swa256_350m.py --platform=tpu[,cuda] [--devices=8]
      [--config.model.num_layers=2 ...]

--devices simulates that many host devices for the config's mesh. For each platform, prints the
mesh, the size of the lowered module and the attention kernels it contains, then a RESULT json
line.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # For configs/.

from absl import flags  # noqa: E402
from hybrid_nope import xla_flags  # noqa: E402  (imports no jax)
from ml_collections import config_flags  # noqa: E402

config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_list("platform", None, "Platforms to lower for: tpu, cuda, cpu (comma-separated).")
flags.DEFINE_integer("devices", 1, "Host devices to simulate the config's mesh on.")
flags.mark_flags_as_required(["config", "platform"])


def main(argv):
  del argv
  from hybrid_nope.train import lowering  # pylint: disable=g-import-not-at-top
  for platform in flags.FLAGS.platform:
    result = lowering.describe(flags.FLAGS.config, platform)
    print(lowering.summary_text(result))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  # The device count must be set before jax initialises its backend.
  count = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--devices=")), "1")
  xla_flags.set_in_environ(xla_flags.HOST_DEVICE_COUNT, count)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from hybrid_nope import cli  # noqa: E402  pylint: disable=g-import-not-at-top
  cli.run(main)
