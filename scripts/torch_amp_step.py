#!/usr/bin/env python3
"""PyTorch eager reference for mixprec's training-step benchmarks.

Times one training step (forward, loss, backward, optimizer step) of a small MLP or CNN in
three modes on the same model, batch and device:

  fp32       full FP32 (TF32 off for matmuls and cuDNN), the baseline;
  amp_fp16   torch.autocast(float16) with a GradScaler (unscale, inf check, scale update);
  amp_bf16   torch.autocast(bfloat16), no scaler (BF16 has FP32's exponent range).

Prints each mode's median step time (with the 10th and 90th percentiles) and, last, one line
"summary: ..." and one line "json: {...}" for scripts (scripts/gpu_check.sh reads the first).
Step times are wall clock around a synchronised step, launch overhead included, since that is
what a training loop pays and what `mixprec bench` reports.

Runs on CUDA when available (or with --device cuda), else on the CPU, where autocast to FP16
may be unsupported by the installed PyTorch: such a mode is reported and skipped.

  python3 scripts/torch_amp_step.py --model mlp --batch 512 --width 2048 --depth 4
  python3 scripts/torch_amp_step.py --model cnn --batch 512 --width 64
"""

import argparse
import json
import statistics
import sys
import time

MODES = ("fp32", "amp_fp16", "amp_bf16")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--batch", type=int, default=512, help="examples per step")
    p.add_argument("--width", type=int, default=1024,
                   help="hidden features (mlp) or channels of the first conv block (cnn)")
    p.add_argument("--depth", type=int, default=3,
                   help="hidden layers (mlp) or conv blocks (cnn)")
    p.add_argument("--inputs", type=int, default=784, help="input features of the mlp")
    p.add_argument("--image", type=int, default=32, help="side of the square cnn input")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--steps", type=int, default=50, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per mode")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated subset of " + ", ".join(MODES))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for name in ("batch", "width", "depth", "steps", "classes"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    return args


def build_model(torch, args):
    nn = torch.nn
    if args.model == "mlp":
        layers, features = [], args.inputs
        for _ in range(args.depth):
            layers += [nn.Linear(features, args.width), nn.ReLU()]
            features = args.width
        layers.append(nn.Linear(features, args.classes))
        return nn.Sequential(*layers)
    # Conv blocks halve the image and double the channels, as a small classification CNN does.
    layers, channels, side = [], 3, args.image
    for block in range(args.depth):
        out = args.width * 2 ** block
        layers += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out),
                   nn.ReLU()]
        if side >= 2:
            layers.append(nn.MaxPool2d(2))
            side //= 2
        channels = out
    layers += [nn.Flatten(), nn.Linear(channels * side * side, args.classes)]
    return nn.Sequential(*layers)


def make_scaler(torch, device_type):
    # torch.amp.GradScaler(device) since PyTorch 2.3; torch.cuda.amp.GradScaler before.
    amp_scaler = getattr(torch.amp, "GradScaler", None)
    if amp_scaler is not None:
        return amp_scaler(device_type)
    if device_type == "cuda":
        return torch.cuda.amp.GradScaler()
    raise RuntimeError("this PyTorch has no GradScaler for " + device_type)


def time_mode(torch, args, device, mode):
    """Median, 10th and 90th percentile step time in milliseconds for one mode."""
    torch.manual_seed(args.seed)
    model = build_model(torch, args).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    if args.model == "mlp":
        x = torch.randn(args.batch, args.inputs, device=device)
    else:
        x = torch.randn(args.batch, 3, args.image, args.image, device=device)
    y = torch.randint(0, args.classes, (args.batch,), device=device)
    device_type = device.type
    dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(mode)
    scaler = make_scaler(torch, device_type) if mode == "amp_fp16" else None

    def step():
        optimizer.zero_grad(set_to_none=True)
        if dtype is None:
            loss = loss_fn(model(x), y)
        else:
            with torch.autocast(device_type=device_type, dtype=dtype):
                logits = model(x)
                loss = loss_fn(logits, y)
            # Autocast to a dtype the device does not support only warns and runs in FP32,
            # which would be timed as if it were mixed precision.
            if logits.dtype != dtype:
                raise RuntimeError(f"autocast to {dtype} is not applied on {device_type}")
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    def sync():
        if device_type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()

    def quantile(q):
        return times[min(len(times) - 1, int(q * len(times)))]

    return statistics.median(times), quantile(0.1), quantile(0.9)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: PyTorch is not installed (pip install torch)", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda:0" if use_cuda else "cpu")
    # The FP32 baseline is full FP32, as mixprec's FP32 runs with TF32 off.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True

    where = torch.cuda.get_device_name(device) if use_cuda else "CPU"
    print(f"torch {torch.__version__} on {where}: {args.model}, batch {args.batch}, "
          f"width {args.width}, depth {args.depth}, {args.steps} timed steps after {args.warmup}")
    results = {}
    for mode in args.modes:
        try:
            median, p10, p90 = time_mode(torch, args, device, mode)
        except (RuntimeError, NotImplementedError) as e:
            print(f"{mode:<9} unsupported here: {str(e).splitlines()[0]}")
            continue
        results[mode] = median
        print(f"{mode:<9} median {median:9.3f} ms  (p10 {p10:.3f}, p90 {p90:.3f})")

    parts = [f"{m} {results[m]:.3f} ms" for m in MODES if m in results]
    if "fp32" in results and "amp_fp16" in results:
        parts.append(f"fp32/amp_fp16 {results['fp32'] / results['amp_fp16']:.2f}x")
    print("summary: " + (", ".join(parts) if parts else "no mode ran"))
    print("json: " + json.dumps({
        "device": where, "torch": torch.__version__, "model": args.model,
        "batch": args.batch, "width": args.width, "depth": args.depth,
        "median_ms": results}))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
