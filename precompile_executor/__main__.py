"""``python -m precompile_executor``: the ``precompile-executor`` command."""

import sys

from precompile_executor.cli import main

if __name__ == "__main__":
    sys.exit(main())
