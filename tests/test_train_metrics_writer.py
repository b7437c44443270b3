import json

from hybrid_nope.train.metrics_writer import MetricsWriter


def test_records_and_truncation_on_resume(tmp_path):
  writer = MetricsWriter(str(tmp_path))
  for step in range(1, 6):
    writer.write(step, {"loss": 1.0 / step})
  writer.close()
  # A run restored from step 3 drops what the lost run wrote after it.
  writer = MetricsWriter(str(tmp_path), resume_step=3)
  writer.write(4, {"loss": 0.5})
  writer.close()
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.5)]
