"""NCCL performance baselines: nccl-tests output parsing, runs, baselines and regression alerts."""
