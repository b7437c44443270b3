"""One self-contained HTML page of a run or a sweep: python launch/report.py DIR [DIR ...]
--out=report.html.

Reads only the runs' files (metrics.jsonl, recency.jsonl, recency_probe.json, config.json), so
it works on a run still training and on gs:// workdirs; several DIRs add compare.py's sweep
table (docs/analysis.md).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from hybrid_nope import cli  # noqa: E402
from hybrid_nope.analysis.present import html_report  # noqa: E402
from hybrid_nope.run.reader import open_readonly  # noqa: E402

flags.DEFINE_string("out", "report.html", "The HTML file to write (a local path or a URL).")


def main(argv):
  print(html_report.write([open_readonly(w) for w in argv[1:]], flags.FLAGS.out))


if __name__ == "__main__":
  cli.run(main, positional="workdirs")
