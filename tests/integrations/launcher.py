"""A Python launcher as ms-swift's `swift sft` is one: runs the trainer as a child and exits with
its status (a child killed by SIGKILL: sys.exit(-9), exit status 247)."""

import subprocess
import sys

sys.exit(subprocess.run(sys.argv[1:]).returncode)
