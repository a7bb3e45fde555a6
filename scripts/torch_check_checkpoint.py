#!/usr/bin/env python3
"""Checks a mixprec checkpoint against PyTorch: same model, same numbers.

A mixprec checkpoint (checkpoints/step_N/model.safetensors) stores tensors under torch's names
and layouts. This script builds the equivalent torch.nn model (scripts/torch_models.py) from the
model description in a reference file, loads the checkpoint with load_state_dict(strict=True),
runs the reference's batch through it and compares what mixprec computed on that batch with the
same weights:

  loss               mean cross-entropy over every target (one per image, one per token)
  grad.<name>        d loss / d parameter, for every parameter (tied weights once)
  stepped.<name>     the parameter after one plain SGD step (no momentum) with the stored lr

The reference file is a safetensors file with the tensors above plus `inputs` (images F32
[N, C, H, W] or token ids I32 [N, T]) and `targets` (I32), and the metadata
  "model": JSON, {"type": "cnn", "in_channels", "input_size", "layers": [{"kind": "conv",
           "out", "kernel", "stride", "padding", "bias"}, {"kind": "batchnorm"}, {"kind":
           "maxpool", "kernel", "stride", "padding"}, {"kind": "linear", "out", "bias"},
           {"kind": "dropout", "p"}, {"kind": "relu"}, ...]}
           or {"type": "gpt", "vocab_size", "block_size", "n_layer", "n_head", "n_embd",
           "dropout", "bias", "tie_weights"}
  "mode":  "train" (dropout active, batch norm on batch statistics) or "eval"
  "lr":    the SGD learning rate, as a decimal string.

torch computes in float64 by default (--dtype float64: the model, the cross-entropy and
everything in between; the float32 checkpoint values convert exactly), so the differences
printed are mixprec's own float32 rounding. A tensor matches when
    max |torch - ref| <= rtol * max |ref|       (per tensor; max |ref| at least 1e-30)
with one exception: the gradient of the bias of a conv that feeds a batch norm in training
mode is zero in exact arithmetic (the normalisation subtracts the batch mean, bias included),
so both sides hold nothing but rounding noise and its own maximum is no scale to measure that
noise by; it is measured against the largest |gradient| of the same conv's weight instead.

Exit status: 0 when everything matches, 1 when some tensor differs, 2 on bad input (an
unreadable or malformed file, a model description that does not build, a checkpoint that
load_state_dict(strict=True) refuses, reference tensors that do not name the model's
parameters).

--time STEPS instead times torch training steps of the same model in float32 (forward,
cross-entropy, backward, AdamW step) on the reference batch, tiled to --batch-size examples,
after 3 untimed warm-up steps, with torch.set_num_threads(os.cpu_count()), and prints one
JSON line {"median_step_ms", "steps", "threads", "batch_size"}.

  python3 scripts/torch_check_checkpoint.py --checkpoint run/checkpoints/step_3 --reference ref.safetensors
  python3 scripts/torch_check_checkpoint.py --reference ref.safetensors --time 20 --batch-size 128
"""

import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from torch_models import BadInput, build_from_description

EXIT_MATCH, EXIT_DIFFER, EXIT_BAD_INPUT = 0, 1, 2
TINY = 1e-30


# ---------------------------------------------------------------------------------------------
# safetensors

_NUMPY_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "I32": np.dtype("<i4"),
                 "I64": np.dtype("<i8"), "BF16": np.dtype("<u2")}


def read_safetensors(path):
    """Returns ({name: torch tensor}, metadata dict) of a safetensors file; BadInput naming the
    path and the problem for anything malformed."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror}") from None
    if len(data) < 8:
        raise BadInput(f"{path}: {len(data)} bytes, shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > len(data) - 8:
        raise BadInput(f"{path}: header length {header_len} runs past the end of the "
                       f"{len(data)}-byte file")
    try:
        header = json.loads(data[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise BadInput(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict):
        raise BadInput(f"{path}: __metadata__ is not an object")
    body = memoryview(data)[8 + header_len:]
    tensors = {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise BadInput(f"{path}: tensor '{name}' lacks dtype, shape or data_offsets")
        dtype = entry["dtype"]
        if dtype not in _NUMPY_DTYPES:
            raise BadInput(f"{path}: tensor '{name}' has dtype {dtype}; "
                           f"read are {', '.join(sorted(_NUMPY_DTYPES))}")
        shape = entry["shape"]
        begin, end = entry["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise BadInput(f"{path}: tensor '{name}' has shape {shape!r}")
        itemsize = _NUMPY_DTYPES[dtype].itemsize
        count = math.prod(shape)
        if not (0 <= begin <= end <= len(body)) or end - begin != count * itemsize:
            raise BadInput(f"{path}: tensor '{name}' ({dtype} {shape}) has data_offsets "
                           f"[{begin}, {end}] for a {len(body)}-byte body")
        array = np.frombuffer(body[begin:end], dtype=_NUMPY_DTYPES[dtype]).copy()
        if dtype == "BF16":  # numpy has no bfloat16: widen the bits to float32 exactly
            t = torch.from_numpy((array.astype(np.uint32) << 16).view(np.float32))
            t = t.to(torch.bfloat16)
        else:
            t = torch.from_numpy(array)
        tensors[name] = t.reshape(shape)
    return tensors, metadata


# ---------------------------------------------------------------------------------------------
# models (scripts/torch_models.py)


def build_model(metadata):
    """(torch model, its description, {gradient that is zero in exact arithmetic in training
    mode: the parameter whose gradient scales its rounding noise})."""
    if "model" not in metadata:
        raise BadInput("reference: metadata has no 'model' description")
    try:
        desc = json.loads(metadata["model"])
    except json.JSONDecodeError as e:
        raise BadInput(f"reference: metadata 'model' is not JSON: {e}") from None
    if not isinstance(desc, dict):
        raise BadInput("reference: metadata 'model' is not a JSON object")
    kind = desc.get("type")
    if kind not in ("cnn", "gpt"):
        raise BadInput(f"reference: model type {kind!r}; expected 'cnn' or 'gpt'")
    model, zero_grads = build_from_description(desc)
    return model, desc, zero_grads


def load_checkpoint(model, checkpoint_dir, desc):
    path = os.path.join(checkpoint_dir, "model.safetensors")
    state, _ = read_safetensors(path)
    expected = model.state_dict()
    for name, value in state.items():
        # mixprec stores BatchNorm's num_batches_tracked as I32; torch keeps int64.
        if name in expected and not value.is_floating_point():
            state[name] = value.to(expected[name].dtype)
    if desc.get("tie_weights") and {"transformer.wte.weight", "lm_head.weight"} <= state.keys():
        if not torch.equal(state["transformer.wte.weight"], state["lm_head.weight"]):
            raise BadInput(f"{path}: tie_weights, but transformer.wte.weight and lm_head.weight "
                           "hold different values")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise BadInput(f"{path}: load_state_dict(strict=True) failed: {e}") from None


def model_inputs(tensors, desc, dtype):
    for key in ("inputs", "targets"):
        if key not in tensors:
            raise BadInput(f"reference: no '{key}' tensor")
    inputs, targets = tensors["inputs"], tensors["targets"]
    if desc["type"] == "gpt":
        if inputs.is_floating_point() or inputs.dim() != 2:
            raise BadInput(f"reference: gpt inputs must be integer ids [N, T], got "
                           f"{inputs.dtype} {list(inputs.shape)}")
        inputs = inputs.long()
    else:
        if not inputs.is_floating_point() or inputs.dim() != 4:
            raise BadInput(f"reference: cnn inputs must be images [N, C, H, W], got "
                           f"{inputs.dtype} {list(inputs.shape)}")
        inputs = inputs.to(dtype)
    if targets.is_floating_point():
        raise BadInput(f"reference: targets must be integer, got {targets.dtype}")
    return inputs, targets.long()


def batch_loss(model, inputs, targets):
    logits = model(inputs)
    logits = logits.reshape(-1, logits.size(-1))
    targets = targets.reshape(-1)
    if targets.numel() != logits.size(0):
        raise BadInput(f"reference: {targets.numel()} targets for {logits.size(0)} predictions")
    return F.cross_entropy(logits, targets)


# ---------------------------------------------------------------------------------------------
# check


def compare(name, got, ref, rtol, scale=None):
    got = got.detach().to(torch.float64).reshape(-1)
    ref = ref.to(torch.float64).reshape(-1)
    if got.numel() != ref.numel():
        raise BadInput(f"reference: '{name}' has {ref.numel()} elements, torch {got.numel()}")
    diff = (got - ref).abs().max().item() if ref.numel() else 0.0
    if scale is None:
        scale = ref.abs().max().item() if ref.numel() else 0.0
    scale = max(scale, TINY)
    if not math.isfinite(diff):
        diff = math.inf
    rel = diff / scale
    return name, diff, scale, rel, rel <= rtol


def run_check(args):
    tensors, metadata = read_safetensors(args.reference)
    model, desc, zero_grads = build_model(metadata)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    model.to(dtype)
    load_checkpoint(model, args.checkpoint, desc)
    mode = metadata.get("mode", "train")
    if mode not in ("train", "eval"):
        raise BadInput(f"reference: mode '{mode}'; expected 'train' or 'eval'")
    model.train(mode == "train")
    try:
        lr = float(metadata["lr"])
    except (KeyError, ValueError):
        raise BadInput(f"reference: metadata 'lr' is {metadata.get('lr')!r}, not a number") from None

    params = list(model.named_parameters())  # tied weights once, under the first name
    names = {n for n, _ in params}
    for key in tensors:
        prefix, _, rest = key.partition(".")
        if prefix in ("grad", "stepped") and rest not in names:
            raise BadInput(f"reference: '{key}' names no parameter of the model")
    for n in names:
        for key in (f"grad.{n}", f"stepped.{n}"):
            if key not in tensors:
                raise BadInput(f"reference: no '{key}' tensor")
    if "loss" not in tensors:
        raise BadInput("reference: no 'loss' tensor")

    inputs, targets = model_inputs(tensors, desc, dtype)
    loss = batch_loss(model, inputs, targets)
    model.zero_grad(set_to_none=True)
    loss.backward()

    rows = [compare("loss", loss, tensors["loss"], args.rtol)]
    noise_scaled = {}  # gradient -> the gradient its noise is measured against
    for n, p in params:
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        scale = None
        if mode == "train" and n in zero_grads:
            noise_scaled[n] = zero_grads[n]
            scale = tensors[f"grad.{zero_grads[n]}"].abs().max().item()
        rows.append(compare(f"grad.{n}", g, tensors[f"grad.{n}"], args.rtol, scale))
    torch.optim.SGD(model.parameters(), lr=lr).step()
    for n, p in params:
        rows.append(compare(f"stepped.{n}", p, tensors[f"stepped.{n}"], args.rtol))

    width = max(len(r[0]) for r in rows)
    print(f"torch {torch.__version__}, {args.dtype}, mode {mode}, lr {lr:g}, rtol {args.rtol:g}")
    print(f"{'tensor':<{width}}  {'max abs diff':>12}  {'scale':>10}  {'relative':>10}")
    for name, diff, scale, rel, ok in rows:
        note = "" if ok else "  DIFFERS"
        if name.startswith("grad.") and name[5:] in noise_scaled:
            note += f"  (zero in exact arithmetic; scale of grad.{noise_scaled[name[5:]]})"
        print(f"{name:<{width}}  {diff:12.3e}  {scale:10.3e}  {rel:10.3e}{note}")
    bad = [r[0] for r in rows if not r[4]]
    if bad:
        print(f"{len(bad)} of {len(rows)} tensors differ beyond rtol {args.rtol:g}: "
              + ", ".join(bad))
        return EXIT_DIFFER
    print(f"all {len(rows)} tensors match to rtol {args.rtol:g}")
    return EXIT_MATCH


# ---------------------------------------------------------------------------------------------
# timing


def run_time(args):
    tensors, metadata = read_safetensors(args.reference)
    model, desc, _ = build_model(metadata)
    if args.checkpoint:
        load_checkpoint(model, args.checkpoint, desc)
    model.train()
    inputs, targets = model_inputs(tensors, desc, torch.float32)
    n = args.batch_size or inputs.size(0)
    reps = -(-n // inputs.size(0))
    tile = lambda t: t.repeat(reps, *([1] * (t.dim() - 1)))[:n].contiguous()
    inputs, targets = tile(inputs), tile(targets)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad(set_to_none=True)
        batch_loss(model, inputs, targets).backward()
        optimizer.step()

    for _ in range(3):
        step()
    times = []
    for _ in range(args.time):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"median_step_ms": round(statistics.median(times), 3), "steps": args.time,
                      "threads": threads, "batch_size": n}))
    return EXIT_MATCH


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", help="a step_N folder holding model.safetensors")
    p.add_argument("--reference", required=True, help="the reference safetensors file")
    p.add_argument("--rtol", type=float, default=1e-4,
                   help="allowed max |difference| relative to max |reference| per tensor")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="what torch computes in for the check")
    p.add_argument("--time", type=int, metavar="STEPS",
                   help="time STEPS torch training steps instead of checking")
    p.add_argument("--batch-size", type=int, help="--time: tile the stored batch to N examples")
    args = p.parse_args(argv)
    if args.time is None and not args.checkpoint:
        p.error("--checkpoint is required unless --time is given")
    if args.time is not None and args.time < 1:
        p.error("--time must be at least 1")
    if args.batch_size is not None and args.batch_size < 1:
        p.error("--batch-size must be at least 1")
    if not args.rtol > 0:
        p.error("--rtol must be > 0")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        return run_time(args) if args.time is not None else run_check(args)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
