#!/usr/bin/env python3
"""PyTorch's own GEMM (torch.mm) at the shape of mixprec's GEMM benchmark, for comparison.

Times C = A @ B for n x n x n (default 4096) on cuda in FP16, BF16 and FP32 with TF32 off, the
inputs uniform in [-1, 1) as in BM_CudaGemm (apps/bench_kernels/bench_cuda.cpp) and the output
preallocated (torch.mm(a, b, out=c)), so that the figure is the matmul kernel's alone; split-K
partial sums stay in FP32 for FP16 and BF16, as in mixprec's GEMM. Each
call is timed on the device with a pair of CUDA events, after --warmup untimed calls; the
rate is 2 n^3 over the median of --calls timed calls (at least 20).

Prints one line per dtype, `torch_gemm <dtype> <n> <TFLOP/s>` (dtype fp16, bf16 or fp32), for
scripts (scripts/gpu_check.sh reads them), preceded by a line naming torch and the device.
Without PyTorch or without a CUDA device, prints one line "skipped: <reason>" and exits 0, so
that a machine without them does not fail the run; a dtype that fails on the device prints
"torch_gemm <dtype> <n> error: <message>" and makes the exit status 1.

  python3 scripts/torch_gemm.py
  python3 scripts/torch_gemm.py --n 8192 --dtypes fp16,bf16 --calls 50
"""

import argparse
import statistics
import sys

DTYPES = ("fp16", "bf16", "fp32")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096, help="m = n = k of the GEMM")
    p.add_argument("--dtypes", default=",".join(DTYPES),
                   help="comma-separated subset of " + ", ".join(DTYPES))
    p.add_argument("--calls", type=int, default=30, help="timed calls per dtype (at least 20)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls per dtype")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be at least 1")
    if args.calls < 20:
        p.error("--calls must be at least 20")
    if args.warmup < 1:
        p.error("--warmup must be at least 1")
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in args.dtypes if d not in DTYPES]
    if unknown or not args.dtypes:
        p.error(f"unknown or no dtype(s) {', '.join(unknown)}; choose from {', '.join(DTYPES)}")
    return args


def time_gemm(torch, args, dtype):
    """TFLOP/s of torch.mm at n^3 in `dtype`, from the median of per-call event times."""
    n = args.n
    device = torch.device("cuda:0")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    # Uniform in [-1, 1), drawn in FP32 and rounded once to the dtype, as BM_CudaGemm's inputs.
    a = (torch.rand(n, n, device=device, generator=gen) * 2 - 1).to(dtype)
    b = (torch.rand(n, n, device=device, generator=gen) * 2 - 1).to(dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(args.warmup):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.calls)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(args.calls)]
    for start, stop in zip(starts, stops):
        start.record()
        torch.mm(a, b, out=c)
        stop.record()
    torch.cuda.synchronize(device)
    ms = statistics.median(start.elapsed_time(stop) for start, stop in zip(starts, stops))
    return 2.0 * n * n * n / (ms * 1e-3) / 1e12


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: torch.cuda.is_available() is False (no CUDA device or driver)")
        return 0
    # The numerics of mixprec's GEMM: FP32 is full FP32 (TF32 off, mixprec's default), and FP16
    # and BF16 keep split-K partial sums in FP32 (mixprec excludes the reductions in the
    # output type), so that both sides pick among the same algorithms.
    matmul = torch.backends.cuda.matmul
    matmul.allow_tf32 = False
    for switch in ("allow_fp16_reduced_precision_reduction",
                   "allow_bf16_reduced_precision_reduction"):
        if hasattr(matmul, switch):
            setattr(matmul, switch, False)
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: torch.mm "
          f"{args.n}^3, median of {args.calls} calls after {args.warmup}")
    status = 0
    for name in args.dtypes:
        try:
            tflops = time_gemm(torch, args, dtypes[name])
        except RuntimeError as e:
            print(f"torch_gemm {name} {args.n} error: {str(e).splitlines()[0]}")
            status = 1
            continue
        print(f"torch_gemm {name} {args.n} {tflops:.1f}")
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
