#!/usr/bin/env python3
"""Stand-in for scripts/torch_bench.py in tests/gpu_check/dry_run.sh: writes OUT/bench.json
with one torch row per precision asked for, with made-up step times, in the format
`mixprec bench --compare` reads."""
import argparse
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("config")
parser.add_argument("--out", required=True)
parser.add_argument("--precisions", default="fp32,fp16,bf16")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--set", dest="overrides", action="append", default=[])
args = parser.parse_args()
rows = []
for i, precision in enumerate(args.precisions.split(",")):
    rows.append({"framework": "torch", "precision": precision,
                 "median_step_ms": 4.0 / (i + 1), "note": "stand-in"})
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, "bench.json"), "w") as f:
    json.dump({"config": args.config, "steps": args.steps, "warmup": args.warmup,
               "overrides": args.overrides, "rows": rows}, f, indent=2)
print(f"torch_bench stand-in: {len(rows)} rows in {args.out}/bench.json")
