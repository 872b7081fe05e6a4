"""`python -m replayssm_cuda.bench ...`, the same as `python -m replayssm_cuda bench ...`."""

from .cli import main

raise SystemExit(main(prog="python -m replayssm_cuda.bench"))
