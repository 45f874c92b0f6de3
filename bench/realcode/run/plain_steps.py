"""Run a script as `python SCRIPT ARGS` would, stopping it after N optimizer steps (no probes).

The baseline for eval_run.py: `torchdoctor run --steps N` ends a script from inside its N-th
`optimizer.step()`; this does the same with one global optimizer hook, so the plain output and
the probed output cover the same steps and can be compared line by line.

    REALCODE_STEPS=N python plain_steps.py SCRIPT [ARGS...]     (N=0: no limit)
"""

from __future__ import annotations

import os
import runpy
import sys


class StepsReached(BaseException):
    """Raised inside the N-th optimizer step; a BaseException so `except Exception:` does not eat it."""


def main() -> int:
    script = sys.argv[1]
    limit = int(os.environ.get("REALCODE_STEPS", "0") or 0)
    if limit > 0:
        import torch.optim.optimizer as optimizer_module

        done = [0]

        def count(optimizer, args, kwargs) -> None:
            done[0] += 1
            if done[0] >= limit:
                raise StepsReached

        optimizer_module.register_optimizer_step_post_hook(count)
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(os.path.abspath(script), run_name="__main__")
    except StepsReached:
        sys.stdout.flush()
        sys.stderr.flush()
        # the script's own distributed teardown did not run: leave without waiting on peers
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
