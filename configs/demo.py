"""Small hybrid trained on the embedded corpus (Python stdlib source, byte tokens): `make demo`.

  python launch/train.py --config=configs/demo.py --workdir=workdirs/demo

Four layers SGSG, d_model 128, window 64, seq_len 1024; a few minutes on 2 CPU cores
(docs/performance.md has the measured time).

Cost: 7.07 MFLOP/token × 1.47 M tokens (180 steps × 8 × 1024) = 1.0e13 FLOPs.
"""
from configs import base


def get_config():
  c = base.get_config()
  # loss_block 0: the full logits. At 258 ids they are the size of two residual streams, so
  # blocks save nothing and were no faster here (docs/scaling.md).
  c.model.update(dict(num_layers=4, d_model=128, num_heads=4, num_kv_heads=4, head_dim=32,
                      mlp_dim=384, window=64, vocab_size=258, tie_embeddings=True, loss_block=0))
  c.data.update(dict(source="stdlib", seq_len=1024, batch_size=8))
  c.eval.update(dict(batch_size=8, num_batches=4, every_steps=60, bucket_size=256))
  c.train.update(dict(steps=180, learning_rate=3e-3, warmup_steps=18, log_every_steps=10))
  c.checkpoint.update(dict(every_steps=60, keep=2))
  # The probe: 48 of the first 1024 eval rows, spanning 63 stdlib files (38 with pairs at the
  # far lag), so its standard errors rest on enough independent documents.
  c.metrics.update(dict(far_lag=512, query_positions=0, probe_batch_size=48,
                        probe_pool_rows=1024))
  c.mesh.data = 1
  return c
