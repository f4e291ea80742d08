"""``python -m benchmarks SUITE``: see :mod:`benchmarks.suites`."""

import sys

from .suites import main

sys.exit(main())
