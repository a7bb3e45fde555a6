#!/usr/bin/env python3
"""Checks a mixprec checkpoint against PyTorch: same model, same numbers.

A mixprec checkpoint (checkpoints/step_N/model.safetensors) stores tensors under torch's names
and layouts. This script builds the equivalent torch.nn model from the model description in a
reference file, loads the checkpoint with load_state_dict(strict=True), runs the reference's
batch through it and compares what mixprec computed on that batch with the same weights:

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
import torch.nn as nn
import torch.nn.functional as F

EXIT_MATCH, EXIT_DIFFER, EXIT_BAD_INPUT = 0, 1, 2
TINY = 1e-30


class BadInput(Exception):
    """A file or description that cannot be checked (exit status 2)."""


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
# models


def _field(desc, key, kind, where):
    if key not in desc:
        raise BadInput(f"model description: {where} lacks '{key}'")
    value = desc[key]
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not an integer")
    if kind is float and not isinstance(value, (int, float)):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not a number")
    if kind is bool and not isinstance(value, bool):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not a boolean")
    return value


def build_cnn(desc):
    """nn.Sequential with the same indices as mixprec's build_cnn; shapes inferred the same way.
    Also returns {bias name: weight name} for each conv bias that feeds a batch norm."""
    channels = _field(desc, "in_channels", int, "cnn")
    side = _field(desc, "input_size", int, "cnn")
    features = None  # set after a flatten
    layers, zero_grads = [], {}
    for i, layer in enumerate(_field(desc, "layers", list, "cnn")):
        where = f"layers[{i}]"
        kind = _field(layer, "kind", str, where)
        if kind in ("conv", "maxpool", "avgpool") and features is not None:
            raise BadInput(f"model description: {where} ({kind}) follows a flatten")
        if kind == "conv":
            out, k = _field(layer, "out", int, where), _field(layer, "kernel", int, where)
            stride, pad = layer.get("stride", 1), layer.get("padding", 0)
            layers.append(nn.Conv2d(channels, out, k, stride=stride, padding=pad,
                                    bias=layer.get("bias", True)))
            channels, side = out, (side + 2 * pad - k) // stride + 1
        elif kind == "batchnorm":
            if layers and isinstance(layers[-1], nn.Conv2d) and layers[-1].bias is not None:
                zero_grads[f"{i - 1}.bias"] = f"{i - 1}.weight"
            layers.append(nn.BatchNorm2d(channels))  # eps 1e-5, momentum 0.1, as mixprec
        elif kind == "relu":
            layers.append(nn.ReLU())
        elif kind == "gelu":
            layers.append(nn.GELU(approximate="tanh"))
        elif kind in ("maxpool", "avgpool"):
            k = _field(layer, "kernel", int, where)
            stride = layer.get("stride", 0) or k
            pad = layer.get("padding", 0)
            pool = nn.MaxPool2d if kind == "maxpool" else nn.AvgPool2d  # count_include_pad=True
            layers.append(pool(k, stride=stride, padding=pad))
            side = (side + 2 * pad - k) // stride + 1
        elif kind == "flatten":
            layers.append(nn.Flatten())
            features = channels * side * side
        elif kind == "linear":
            if features is None:
                raise BadInput(f"model description: {where} (linear) before a flatten")
            out = _field(layer, "out", int, where)
            layers.append(nn.Linear(features, out, bias=layer.get("bias", True)))
            features = out
        elif kind == "dropout":
            layers.append(nn.Dropout(float(layer.get("p", 0.0))))
        else:
            raise BadInput(f"model description: {where} has unknown kind '{kind}'")
        if side < 1:
            raise BadInput(f"model description: {where} ({kind}) shrinks the image to {side}")
    return nn.Sequential(*layers), zero_grads


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm: torch 1.13's nn.LayerNorm cannot drop the bias."""

    def __init__(self, dim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, bias, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        heads = lambda z: z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)  # [B, H, T, D]
        # Scores and softmax in float32 at least (float64 when the model is float64).
        wide = torch.promote_types(q.dtype, torch.float32)
        att = (q.to(wide) @ k.to(wide).transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v.to(wide)).to(x.dtype)  # compared with dropout 0: no attention dropout
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class Mlp(nn.Module):
    def __init__(self, n_embd, bias, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, bias, dropout):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, bias, dropout)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = Mlp(n_embd, bias, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT (model.py): the same module tree, so the same state_dict names."""

    def __init__(self, desc):
        super().__init__()
        get = lambda key, kind: _field(desc, key, kind, "gpt")
        vocab, block, n_layer = get("vocab_size", int), get("block_size", int), get("n_layer", int)
        n_head, n_embd = get("n_head", int), get("n_embd", int)
        dropout, bias = float(get("dropout", float)), get("bias", bool)
        if min(vocab, block, n_layer, n_head, n_embd) < 1 or n_embd % n_head:
            raise BadInput(f"model description: gpt sizes do not build a model: {desc}")
        self.block_size = block
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd),
            wpe=nn.Embedding(block, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, bias, dropout) for _ in range(n_layer)]),
            ln_f=LayerNorm(n_embd, bias),
        ))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        if desc.get("tie_weights", False):
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, ids):
        t = ids.size(1)
        if t > self.block_size:
            raise BadInput(f"inputs: {t} tokens per row, longer than block_size {self.block_size}")
        pos = torch.arange(0, t, dtype=torch.long, device=ids.device)
        x = self.transformer.drop(self.transformer.wte(ids) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


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
    if kind == "cnn":
        model, zero_grads = build_cnn(desc)
        return model, desc, zero_grads
    if kind == "gpt":
        return GPT(desc), desc, {}
    raise BadInput(f"reference: model type {kind!r}; expected 'cnn' or 'gpt'")


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
