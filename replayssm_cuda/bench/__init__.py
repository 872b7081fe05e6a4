"""Benchmarks of the compiled kernels on one GPU: `python -m replayssm_cuda bench ...` (cli.py).

timing.py holds the measured method (CUDA-graph replay, cold L2, medians, the GPU hold), results.py the
tables and the results file per GPU model, runner.py the override sets, repeats and baselines, registry.py
how a family plugs in (mamba2.py, gdn.py, kda.py: their dims, set-ups and byte models), copybw.py the
copy-bandwidth ceiling, compare.py two builds' rows side by side, plot.py the PNG plots.
"""
