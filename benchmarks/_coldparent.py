"""A parent that imported torch and triton but never compiled, running one batch strategy.

``python -m benchmarks._coldparent JOBS CACHE_DIR CONFIGS_JSON`` runs the seed's fork mode
(one forked child per config, at most JOBS at once) and prints one JSON line:
``{"wall_s": ..., "failed": ..., "task_s": [...]}``. A separate interpreter is the only way to
have a parent that never compiled once the benchmark process itself has.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    jobs, cache_dir, configs = int(argv[0]), argv[1], json.loads(argv[2])
    import torch  # noqa: F401 - the autotuner's parent has torch loaded
    import triton  # noqa: F401

    from ._kernels import compile_config
    from ._seed import run_forked

    calls = [(compile_config, (tuple(cfg), cache_dir)) for cfg in configs]
    start = time.perf_counter()
    outcomes = run_forked(calls, jobs)
    wall = time.perf_counter() - start
    print(
        json.dumps(
            {
                "wall_s": wall,
                "failed": sum(not o.ok for o in outcomes),
                "task_s": [o.value["elapsed_s"] for o in outcomes if o.ok],
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
