import sys

from dlperf.cli import entry

sys.exit(entry())
