"""Cloud TPU jobs: python launch/tpu.py {create,setup,run,status,logs,fetch,relaunch,delete}
--name=N --zone=Z ...

  python launch/tpu.py create --dry-run --config=configs/swa256_350m.py --tpu-type=v5p-64 \\
      --zone=us-east5-a --workdir=gs://BUCKET/swa256_350m -- \\
      --config.data.path=/mnt/prolong --config.eval.path=/mnt/textbooks

`create` with --config also copies the repo, installs it and starts training on every worker.
`relaunch` keeps a spot or queued TPU training (re-create, re-install, resume) until the run
finishes; `fetch --dest=DIR` copies the run's records and figures back. Arguments after `--`
are passed to launch/train.py. See docs/scaling.md.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hybrid_nope.cloud import tpu_cli  # noqa: E402

if __name__ == "__main__":
  tpu_cli.main(sys.argv[1:], description=__doc__)
