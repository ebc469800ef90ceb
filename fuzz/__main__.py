"""python -m fuzz {run,replay,explain,list}: see fuzz/cli.py."""

import sys

from fuzz.cli import main

if __name__ == "__main__":
    sys.exit(main())
