#!/usr/bin/env python3
"""Stand-in for scripts/torch_gemm.py in tests/gpu_check/dry_run.sh: its result lines, with
made-up figures."""
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, default=4096)
n = parser.parse_args().n
print(f"torch_gemm fp16 {n} 700.0")
print(f"torch_gemm bf16 {n} 720.0")
