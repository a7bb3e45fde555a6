#!/usr/bin/env python3
"""Trains a mixprec config in PyTorch and writes the bench.json that `mixprec bench` writes.

The same config file gives the same experiment in both frameworks, so that
`mixprec bench CONFIG --compare DIR/bench.json` can put torch's rows next to mixprec's:

  model      the torch.nn equivalent of the config's cnn or gpt (scripts/torch_models.py; GPT
             with nanoGPT's initialisation, as mixprec's), same state_dict names;
  data       IDX images (gzip or raw) scaled to [0, 1], then (x - mean) / std with `normalize`,
             reshuffled every epoch, the last partial batch dropped; or character text with the
             sorted set of characters as vocabulary, the last `val_fraction` of the text as the
             validation split and random windows of block_size + 1 tokens for training;
  optimizer  torch.optim.SGD / Adam / AdamW with the config's settings; AdamW decays only
             tensors of 2 or more dimensions (two param groups), as mixprec's;
  schedule   constant, step (lr * gamma^(t // step_size)) or cosine (lr * (t + 1) / warmup
             for t < warmup, then cosine to min_lr at decay_steps, or at the run's steps when
             decay_steps is 0), with t the number of optimizer steps actually taken (a step
             that the GradScaler skipped does not advance it);
  train      batch_size, accumulation_steps (one optimizer step per accumulation_steps
             microbatches, each loss divided by accumulation_steps), clip_grad_norm (after
             unscaling), seed (torch.manual_seed, the data order and the weights).

Each precision (by default fp32, fp16 and bf16, as `mixprec bench`) trains a fresh model from
the same seed for `steps` optimizer steps (default the config's: train.steps, or train.epochs
* batches per epoch / accumulation_steps), then evaluates it on the test split (images: every
test example; text: eval_batches batches of windows spread evenly over the validation split):

  fp32          no autocast; TF32 off for matmuls and cuDNN, as mixprec's default;
  fp16          torch.autocast(float16) and a GradScaler with the config's loss_scale
                init_scale, growth_factor, backoff_factor and growth_interval;
  bf16          torch.autocast(bfloat16), no scaler;
  fp16-noscale  torch.autocast(float16), no scaler.

The loss (cross-entropy) is computed in float32 from the logits. A precision that the device's
autocast does not apply (torch 1.13's CPU autocast knows bfloat16 only) is reported as a row
{"framework": "torch", "precision": p, "skipped": reason} instead of failing.

The step time is wall clock from the batch being on the device to the optimizer step done
(torch.cuda.synchronize() before each reading of the clock on CUDA); the first --warmup steps
(default 5) are trained but left out of the median, min and max, unless there are no more
steps than that, when all are counted and the row's note says so. peak_mem_mb is
torch.cuda.max_memory_allocated() of that row on CUDA, and on the CPU the process's resident
high-water mark (ru_maxrss), which includes the data and every earlier row.

Writes DIR/bench.json (default runs/<name>-torch-bench-<date>-<time>) and prints a table, or
with --json the JSON object. Exit status: 0 on success, 2 on bad input (an unreadable or
invalid config, a value that has no torch equivalent, a missing or malformed data file), with
one line on stderr that names the file and the problem. A key this script does not know in a
section of the config is a warning (mixprec checks its own configs; a setting that does not
change the experiment here should not stop the comparison), in a layer an error.

  /usr/bin/python3 scripts/torch_bench.py configs/cnn_fashion.yaml --steps 40 --warmup 5
  /usr/bin/python3 scripts/torch_bench.py configs/gpt_shakespeare.yaml --precisions fp32,bf16 \\
      --set train.batch_size=16 --out runs/gpt-torch
"""

import argparse
import contextlib
import gzip
import json
import math
import os
import re
import resource
import statistics
import sys
import time
import warnings

import yaml

# torch (and torch_models, which imports it) load only once the config has been read: importing
# torch takes seconds on a small machine, and a bad config should fail at once.
torch = F = torch_models = None

EXIT_OK, EXIT_BAD_INPUT = 0, 2
PRECISIONS = ("fp32", "fp16", "bf16", "fp16-noscale")
LOSS_WINDOW = 50  # final_loss: mean train loss over the last min(50, steps) steps


class BadInput(Exception):
    """Input the benchmark cannot run (exit status 2); the message names the file."""


def load_torch():
    global torch, F, torch_models
    import torch
    import torch.nn.functional as F
    import torch_models


# ---------------------------------------------------------------------------------------------
# config (the schema and defaults of apps/config/train_config.h)

ROOT_KEYS = ("name", "model", "data", "precision", "loss_scale", "optimizer", "schedule",
             "train", "checkpoint", "device", "debug")
SECTION_KEYS = {
    "cnn": ("type", "in_channels", "input_size", "layers"),
    "gpt": ("type", "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias",
            "tie_weights"),
    "idx": ("kind", "train_images", "train_labels", "test_images", "test_labels", "num_classes",
            "normalize", "limit_train", "limit_test", "shuffle"),
    "text": ("kind", "path", "val_fraction", "eval_batches", "shuffle"),
    "loss_scale": ("policy", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                   "hysteresis", "min_scale", "max_scale", "floor_policy"),
    "optimizer": ("type", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps"),
    "schedule": ("type", "step_size", "gamma", "warmup_steps", "decay_steps", "min_lr"),
    "train": ("epochs", "steps", "batch_size", "accumulation_steps", "clip_grad_norm", "seed",
              "eval_every", "log_every", "max_consecutive_skips"),
}
LAYER_KINDS = ("conv", "batchnorm", "relu", "gelu", "maxpool", "avgpool", "flatten", "linear",
               "dropout")
LAYER_OPTIONS = {"conv": ("kernel", "padding", "stride", "bias"), "maxpool": ("stride", "padding"),
                 "avgpool": ("stride", "padding"), "linear": ("bias",), "dropout": ()}


class Config:
    """Reads values out of the YAML tree with mixprec's defaults; every problem is a BadInput
    that names the file and the key."""

    def __init__(self, path, root):
        self.path = path
        self.root = root

    def fail(self, message):
        raise BadInput(f"{self.path}: {message}")

    def section(self, key, parent=None, where=""):
        parent = self.root if parent is None else parent
        value = parent.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(f"{where}{key}: expected a map, got {value!r}")
        return value

    def check_keys(self, mapping, where, known, strict=False):
        """Keys outside `known`: an error when `strict` (a layer option changes the model), else
        a warning: mixprec validates its own configs, and a setting added to its schema that
        does not change the experiment here should not stop the comparison."""
        for key in mapping:
            if key in known:
                continue
            message = f"unknown key '{where}{key}' (known: {', '.join(known)})"
            if strict:
                self.fail(message)
            print(f"warning: {self.path}: {message}; ignored", file=sys.stderr)

    def get(self, mapping, key, where, kind, default, low=None, high=None):
        """mapping[key] as `kind` (int, float, bool, str), `default` when absent; numbers
        checked against [low, high]."""
        value = mapping.get(key)
        if value is None:
            return default
        name = f"{where}{key}"
        if kind is bool:
            if not isinstance(value, bool):
                self.fail(f"{name}: expected true or false, got {value!r}")
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(f"{name}: expected an integer, got {value!r}")
        elif kind is float:
            # PyYAML reads 1e-3 (no dot) as a string; yaml-cpp, as mixprec, as a number.
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    self.fail(f"{name}: expected a number, got {value!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(f"{name}: expected a number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):
                self.fail(f"{name}: expected a finite number, got {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                self.fail(f"{name}: expected a string, got {value!r}")
        if low is not None and value < low:
            self.fail(f"{name} must be >= {low}, got {value}")
        if high is not None and value > high:
            self.fail(f"{name} must be <= {high}, got {value}")
        return value

    def choice(self, mapping, key, where, choices, default):
        value = self.get(mapping, key, where, str, default)
        if value not in choices:
            self.fail(f"{where}{key}: '{value}' is none of {', '.join(choices)}")
        return value

    def data_path(self, mapping, key, where):
        """An existing file: absolute as given, relative against the config's folder first and
        then the working directory."""
        value = self.get(mapping, key, where, str, None)
        if not value:
            self.fail(f"{where}{key} is missing")
        if os.path.isabs(value):
            candidates = [value]
        else:
            candidates = [os.path.normpath(os.path.join(os.path.dirname(self.path), value)),
                          os.path.normpath(os.path.join(os.getcwd(), value))]
        for candidate in candidates:
            if os.path.isfile(candidate):
                return candidate
        self.fail(f"{where}{key}: file '{value}' not found (looked for "
                  + " and ".join(f"'{c}'" for c in candidates) + ")")


def apply_overrides(path, root, overrides):
    """mixprec's --set: "key.path=value" (value parsed as YAML, list items as key[index]) written
    into the tree before it is read. Setting train.steps drops the file's train.epochs and the
    other way round, unless both are set."""
    set_keys = set()
    for text in overrides:
        key_path, sep, value_text = text.partition("=")
        if not sep or not key_path:
            raise BadInput(f"{path}: --set '{text}': expected key.path=value")
        try:
            value = yaml.safe_load(value_text) if value_text.strip() else None
        except yaml.YAMLError as e:
            raise BadInput(f"{path}: --set '{text}': the value is not YAML: "
                           f"{str(e).splitlines()[0]}") from None
        steps = []
        for part in key_path.split("."):
            match = re.fullmatch(r"([^\[\]]+)((?:\[\d+\])*)", part)
            if not match:
                raise BadInput(f"{path}: --set '{text}': '{part}' is not key or key[index]")
            steps.append((match.group(1), [int(i) for i in re.findall(r"\d+", match.group(2))]))
        node = root
        for depth, (key, indices) in enumerate(steps):
            last = depth == len(steps) - 1
            if not isinstance(node, dict):
                raise BadInput(f"{path}: --set '{text}': '{key}' is under something not a map")
            if last and not indices:
                node[key] = value
                break
            if key not in node or node[key] is None:
                if indices:
                    raise BadInput(f"{path}: --set '{text}': '{key}' is not a list")
                node[key] = {}
            node = node[key]
            for n, index in enumerate(indices):
                if not isinstance(node, list) or index >= len(node):
                    raise BadInput(f"{path}: --set '{text}': no item {index} in '{key}'")
                if last and n == len(indices) - 1:
                    node[index] = value
                else:
                    node = node[index]
        set_keys.add(key_path)
    train = root.get("train")
    if isinstance(train, dict):
        if "train.steps" in set_keys and "train.epochs" not in set_keys:
            train.pop("epochs", None)
        if "train.epochs" in set_keys and "train.steps" not in set_keys:
            train.pop("steps", None)


def read_layer(cfg, item, where):
    if isinstance(item, str):
        if item not in LAYER_KINDS:
            cfg.fail(f"{where}: unknown layer '{item}'; the layers are {', '.join(LAYER_KINDS)}")
        if item in LAYER_OPTIONS:
            cfg.fail(f"{where}: layer '{item}' needs a value, as in {{{item}: ...}}")
        return {"kind": item}
    if not isinstance(item, dict) or not item:
        cfg.fail(f"{where}: expected a layer name or a map such as {{conv: 32}}, got {item!r}")
    kind, value = next(iter(item.items()))
    if kind not in LAYER_KINDS:
        cfg.fail(f"{where}: unknown layer '{kind}'; the layers are {', '.join(LAYER_KINDS)}")
    if kind not in LAYER_OPTIONS:
        if value is not None or len(item) != 1:
            cfg.fail(f"{where}: layer '{kind}' takes no value or options")
        return {"kind": kind}
    cfg.check_keys(item, f"{where}.", (kind,) + LAYER_OPTIONS[kind], strict=True)
    at = f"{where}."
    if kind == "conv":
        return {"kind": "conv", "out": cfg.get(item, "conv", at, int, None, 1),
                "kernel": cfg.get(item, "kernel", at, int, 3, 1),
                "stride": cfg.get(item, "stride", at, int, 1, 1),
                "padding": cfg.get(item, "padding", at, int, 0, 0),
                "bias": cfg.get(item, "bias", at, bool, True)}
    if kind in ("maxpool", "avgpool"):
        k = cfg.get(item, kind, at, int, None, 1)
        return {"kind": kind, "kernel": k, "stride": cfg.get(item, "stride", at, int, k, 1),
                "padding": cfg.get(item, "padding", at, int, 0, 0, k // 2)}
    if kind == "linear":
        return {"kind": "linear", "out": cfg.get(item, "linear", at, int, None, 1),
                "bias": cfg.get(item, "bias", at, bool, True)}
    return {"kind": "dropout", "p": cfg.get(item, "dropout", at, float, 0.0, 0.0, 1.0)}


def load_config(path, overrides):
    """The settings the benchmark needs, as a plain dict with mixprec's defaults filled in."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        root = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise BadInput(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if root is None:
        root = {}
    if not isinstance(root, dict):
        raise BadInput(f"{path}: expected a map of sections at the top, got {type(root).__name__}")
    apply_overrides(path, root, overrides)
    cfg = Config(path, root)
    cfg.check_keys(root, "", ROOT_KEYS)
    c = {"path": os.path.abspath(path)}
    c["name"] = cfg.get(root, "name", "", str, os.path.splitext(os.path.basename(path))[0])

    if "model" not in root:
        cfg.fail("the model section is missing (model: {type: cnn | gpt, ...})")
    model = cfg.section("model")
    mtype = cfg.choice(model, "type", "model.", ("cnn", "gpt"), "cnn")
    cfg.check_keys(model, "model.", SECTION_KEYS[mtype])
    if mtype == "cnn":
        layers = model.get("layers")
        if not isinstance(layers, list) or not layers:
            cfg.fail("model.layers: a cnn needs a non-empty list of layers")
        c["model"] = {"type": "cnn",
                      "in_channels": cfg.get(model, "in_channels", "model.", int, 1, 1),
                      "input_size": cfg.get(model, "input_size", "model.", int, 28, 1),
                      "layers": [read_layer(cfg, item, f"model.layers[{i}]")
                                 for i, item in enumerate(layers)]}
    else:
        g = {"type": "gpt"}
        for key, default, low in (("vocab_size", 0, 0), ("block_size", 128, 1), ("n_layer", 4, 1),
                                  ("n_head", 4, 1), ("n_embd", 128, 1)):
            g[key] = cfg.get(model, key, "model.", int, default, low)
        g["dropout"] = cfg.get(model, "dropout", "model.", float, 0.0, 0.0, 1.0)
        g["bias"] = cfg.get(model, "bias", "model.", bool, True)
        g["tie_weights"] = cfg.get(model, "tie_weights", "model.", bool, False)
        if g["n_embd"] % g["n_head"]:
            cfg.fail(f"model.n_embd ({g['n_embd']}) must be divisible by model.n_head "
                     f"({g['n_head']})")
        c["model"] = g

    if "data" not in root:
        cfg.fail("the data section is missing (data: {train_images: ...} or {path: ...})")
    data = cfg.section("data")
    default_kind = "idx" if "train_images" in data else "text" if "path" in data else None
    if default_kind is None and "kind" not in data:
        cfg.fail("data names no data: give train_images, train_labels, test_images and "
                 "test_labels (kind idx) or path (kind text)")
    kind = cfg.choice(data, "kind", "data.", ("idx", "text"), default_kind)
    cfg.check_keys(data, "data.", SECTION_KEYS[kind])
    d = {"kind": kind, "shuffle": cfg.get(data, "shuffle", "data.", bool, True)}
    if kind == "idx":
        for key in ("train_images", "train_labels", "test_images", "test_labels"):
            d[key] = cfg.data_path(data, key, "data.")
        d["num_classes"] = cfg.get(data, "num_classes", "data.", int, 10, 2)
        normalize = cfg.section("normalize", data, "data.")
        cfg.check_keys(normalize, "data.normalize.", ("mean", "std"))
        if normalize:
            for key in ("mean", "std"):
                if key not in normalize:
                    cfg.fail(f"data.normalize.{key} is missing: normalize needs both mean and std")
            d["mean"] = cfg.get(normalize, "mean", "data.normalize.", float, 0.0)
            d["std"] = cfg.get(normalize, "std", "data.normalize.", float, 1.0)
            if d["std"] <= 0:
                cfg.fail(f"data.normalize.std must be > 0, got {d['std']}")
        d["limit_train"] = cfg.get(data, "limit_train", "data.", int, 0, 0)
        d["limit_test"] = cfg.get(data, "limit_test", "data.", int, 0, 0)
    else:
        d["path"] = cfg.data_path(data, "path", "data.")
        d["val_fraction"] = cfg.get(data, "val_fraction", "data.", float, 0.1)
        if not 0.0 < d["val_fraction"] < 1.0:
            cfg.fail(f"data.val_fraction must be in (0, 1), got {d['val_fraction']}")
        d["eval_batches"] = cfg.get(data, "eval_batches", "data.", int, 20, 1)
    c["data"] = d
    if (mtype == "gpt") != (kind == "text"):
        cfg.fail(f"model.type {mtype} cannot train on data.kind {kind}")

    precision = cfg.choice(root, "precision", "", ("fp32", "fp16", "bf16"), "fp32")
    ls = cfg.section("loss_scale")
    cfg.check_keys(ls, "loss_scale.", SECTION_KEYS["loss_scale"])
    c["loss_scale"] = {
        "policy": cfg.choice(ls, "policy", "loss_scale.", ("auto", "dynamic", "static", "none"),
                             "auto"),
        "init_scale": cfg.get(ls, "init_scale", "loss_scale.", float, 65536.0),
        "growth_factor": cfg.get(ls, "growth_factor", "loss_scale.", float, 2.0),
        "backoff_factor": cfg.get(ls, "backoff_factor", "loss_scale.", float, 0.5),
        "growth_interval": cfg.get(ls, "growth_interval", "loss_scale.", int, 2000, 1),
    }
    if c["loss_scale"]["init_scale"] <= 0:
        cfg.fail(f"loss_scale.init_scale must be > 0, got {c['loss_scale']['init_scale']}")
    c["precision"] = precision

    opt = cfg.section("optimizer")
    cfg.check_keys(opt, "optimizer.", SECTION_KEYS["optimizer"])
    o = {"type": cfg.choice(opt, "type", "optimizer.", ("sgd", "adam", "adamw"), "sgd"),
         "lr": cfg.get(opt, "lr", "optimizer.", float, 0.01, 0.0),
         "momentum": cfg.get(opt, "momentum", "optimizer.", float, 0.0, 0.0),
         "nesterov": cfg.get(opt, "nesterov", "optimizer.", bool, False),
         "weight_decay": cfg.get(opt, "weight_decay", "optimizer.", float, 0.0, 0.0),
         "eps": cfg.get(opt, "eps", "optimizer.", float, 1e-8),
         "betas": (0.9, 0.999)}
    if "betas" in opt and opt["betas"] is not None:
        betas = opt["betas"]
        if not isinstance(betas, list) or len(betas) != 2:
            cfg.fail(f"optimizer.betas: expected a list of two numbers [beta1, beta2], "
                     f"got {betas!r}")
        pair = {"beta1": betas[0], "beta2": betas[1]}
        o["betas"] = (cfg.get(pair, "beta1", "optimizer.", float, 0.9, 0.0, 1.0),
                      cfg.get(pair, "beta2", "optimizer.", float, 0.999, 0.0, 1.0))
    if o["type"] == "sgd" and o["nesterov"] and o["momentum"] <= 0:
        cfg.fail(f"optimizer.nesterov: Nesterov momentum needs optimizer.momentum > 0, "
                 f"got {o['momentum']}")
    c["optimizer"] = o

    sch = cfg.section("schedule")
    cfg.check_keys(sch, "schedule.", SECTION_KEYS["schedule"])
    s = {"type": cfg.choice(sch, "type", "schedule.", ("constant", "step", "cosine"), "constant"),
         "step_size": cfg.get(sch, "step_size", "schedule.", int, 1000, 1),
         "gamma": cfg.get(sch, "gamma", "schedule.", float, 0.1, 0.0, 1.0),
         "warmup_steps": cfg.get(sch, "warmup_steps", "schedule.", int, 0, 0),
         "decay_steps": cfg.get(sch, "decay_steps", "schedule.", int, 0, 0),
         "min_lr": cfg.get(sch, "min_lr", "schedule.", float, 0.0, 0.0)}
    if s["type"] == "cosine":
        if 0 < s["decay_steps"] < s["warmup_steps"]:
            cfg.fail(f"schedule.decay_steps ({s['decay_steps']}) must be 0 (the whole run) or >= "
                     f"schedule.warmup_steps ({s['warmup_steps']})")
        if s["min_lr"] > o["lr"]:
            cfg.fail(f"schedule.min_lr ({s['min_lr']}) must be <= optimizer.lr ({o['lr']})")
    c["schedule"] = s

    tr = cfg.section("train")
    cfg.check_keys(tr, "train.", SECTION_KEYS["train"])
    t = {"epochs": cfg.get(tr, "epochs", "train.", int, 0, 0),
         "steps": cfg.get(tr, "steps", "train.", int, 0, 0),
         "batch_size": cfg.get(tr, "batch_size", "train.", int, 128, 1),
         "accumulation_steps": cfg.get(tr, "accumulation_steps", "train.", int, 1, 1),
         "clip_grad_norm": cfg.get(tr, "clip_grad_norm", "train.", float, 0.0, 0.0),
         "seed": cfg.get(tr, "seed", "train.", int, 0, 0)}
    if tr.get("epochs") is None and tr.get("steps") is None:
        t["epochs"] = 1
    if (t["epochs"] > 0) == (t["steps"] > 0):
        cfg.fail(f"exactly one of train.epochs and train.steps must be > 0, got epochs "
                 f"{t['epochs']} and steps {t['steps']}")
    c["train"] = t
    c["device"] = cfg.choice(root, "device", "", ("cpu", "cuda", "auto"), "cpu")
    return c


# ---------------------------------------------------------------------------------------------
# data


def read_idx(path, want_dims):
    """(uint8 tensor of the IDX file's shape). Gzip or raw, magic 0x0000080N (unsigned bytes,
    N dims)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except OSError as e:
        raise BadInput(f"{path}: cannot read: {e.strerror or e}") from None
    except (EOFError, gzip.BadGzipFile, ValueError) as e:
        raise BadInput(f"{path}: corrupt gzip stream: {e}") from None
    if len(raw) < 4:
        raise BadInput(f"{path}: {len(raw)} bytes, too short for an IDX header")
    magic = int.from_bytes(raw[:4], "big")
    if magic != 0x800 + want_dims:
        raise BadInput(f"{path}: magic 0x{magic:08x}, expected 0x{0x800 + want_dims:08x} "
                       f"(unsigned bytes, {want_dims} dimensions)")
    header = 4 + 4 * want_dims
    if len(raw) < header:
        raise BadInput(f"{path}: {len(raw)} bytes, too short for the IDX dimensions")
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(want_dims)]
    count = math.prod(dims)
    if len(raw) - header != count:
        raise BadInput(f"{path}: dimensions {dims} need {count} bytes of data, the file has "
                       f"{len(raw) - header}")
    return torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8).reshape(dims)


def philox_like_seed(seed, counter):
    """A 63-bit generator seed from (seed, counter): batches are a pure function of both."""
    x = (seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB)
    x &= (1 << 64) - 1
    x ^= x >> 31
    return x & ((1 << 63) - 1)


class ImageData:
    """IDX images: the bytes stay uint8 on the device and a batch maps them through a 256-entry
    table of scaled, normalised float32 values."""

    unit, classification, tokens_per_example = "samples/s", True, 1

    def __init__(self, c, device):
        d, t = c["data"], c["train"]
        self.batch_size, self.seed, self.shuffle = t["batch_size"], t["seed"], d["shuffle"]
        splits = {}
        for split, limit in (("train", d["limit_train"]), ("test", d["limit_test"])):
            images = read_idx(d[f"{split}_images"], 3)
            labels = read_idx(d[f"{split}_labels"], 1)
            if images.size(0) != labels.size(0):
                raise BadInput(f"{d[f'{split}_images']}: {images.size(0)} images, but "
                               f"{d[f'{split}_labels']} holds {labels.size(0)} labels")
            bad = (labels >= d["num_classes"]).nonzero()
            if bad.numel():
                i = bad[0].item()
                raise BadInput(f"{d[f'{split}_labels']}: label {labels[i].item()} at index {i} "
                               f"is out of range [0, {d['num_classes']})")
            if limit > 0:
                images, labels = images[:limit], labels[:limit]
            splits[split] = (images, labels)
        side = c["model"]["input_size"]
        for split, (images, _) in splits.items():
            if c["model"]["in_channels"] != 1 or images.shape[1:] != (side, side):
                raise BadInput(f"{d[f'{split}_images']}: {images.size(1)}x{images.size(2)} "
                               f"single-channel images, the model takes {side}x{side} with "
                               f"{c['model']['in_channels']} channel(s)")
        self.train_count = splits["train"][0].size(0)
        if self.batch_size > self.train_count:
            raise BadInput(f"{d['train_images']}: train.batch_size {self.batch_size} is larger "
                           f"than the {self.train_count} training examples")
        mean, std = d.get("mean"), d.get("std")
        table = torch.arange(256, dtype=torch.float32) / 255.0
        if mean is not None:
            table = (table - mean) / std
        self.table = table.to(device)
        self.train_images = splits["train"][0].to(device)
        self.train_labels = splits["train"][1].long().to(device)
        self.test_images = splits["test"][0].to(device)
        self.test_labels = splits["test"][1].long().to(device)
        self.num_classes = d["num_classes"]
        self.batches_per_epoch = self.train_count // self.batch_size
        self.device = device
        self._order = (-1, None)

    def _images(self, pixels):
        return self.table[pixels.long()].unsqueeze(1)  # [N, 1, H, W]

    def train_batch(self, number):
        epoch, slot = divmod(number, self.batches_per_epoch)
        if self._order[0] != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(philox_like_seed(self.seed, epoch))
                order = torch.randperm(self.train_count, generator=g)
            else:
                order = torch.arange(self.train_count)
            self._order = (epoch, order.to(self.device))
        idx = self._order[1][slot * self.batch_size:(slot + 1) * self.batch_size]
        return self._images(self.train_images[idx]), self.train_labels[idx]

    def eval_batches(self):
        n = self.test_images.size(0)
        for begin in range(0, n, self.batch_size):
            yield (self._images(self.test_images[begin:begin + self.batch_size]),
                   self.test_labels[begin:begin + self.batch_size])


class CharTextData:
    """Character text: vocabulary = sorted distinct characters, the first int(n * (1 -
    val_fraction)) tokens train, the rest validate."""

    unit, classification = "tokens/s", False

    def __init__(self, c, device):
        d, t = c["data"], c["train"]
        path = d["path"]
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise BadInput(f"{path}: cannot read: {e.strerror or e}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadInput(f"{path}: invalid UTF-8 at byte {e.start}") from None
        if not text:
            raise BadInput(f"{path}: the file is empty")
        chars = sorted(set(text))
        lookup = {ch: i for i, ch in enumerate(chars)}
        ids = torch.tensor([lookup[ch] for ch in text], dtype=torch.long)
        self.block = self.tokens_per_example = c["model"]["block_size"]
        self.batch_size, self.seed, self.shuffle = t["batch_size"], t["seed"], d["shuffle"]
        n_train = int(len(ids) * (1.0 - d["val_fraction"]))
        for split, count in (("training", n_train), ("validation", len(ids) - n_train)):
            if count < self.block + 1:
                raise BadInput(f"{path}: {split} split has {count} tokens, block_size + 1 = "
                               f"{self.block + 1} needed")
        self.train_ids = ids[:n_train].to(device)
        self.val_ids = ids[n_train:].to(device)
        self.num_classes = len(chars)
        self.batches_per_epoch = max(1, n_train // (self.batch_size * self.block))
        self.eval_count = d["eval_batches"]
        self.offsets = torch.arange(self.block + 1, device=device)
        self.device = device

    def _windows(self, ids, starts):
        rows = ids[starts.to(self.device).unsqueeze(1) + self.offsets]  # [N, block + 1]
        return rows[:, :-1], rows[:, 1:]

    def train_batch(self, number):
        n_train = self.train_ids.numel()
        if self.shuffle:
            g = torch.Generator().manual_seed(philox_like_seed(self.seed, number))
            starts = torch.randint(0, n_train - self.block, (self.batch_size,), generator=g)
        else:
            w = number * self.batch_size + torch.arange(self.batch_size)
            starts = (w * self.block) % (n_train - self.block)
        return self._windows(self.train_ids, starts)

    def eval_batches(self):
        windows = self.eval_count * self.batch_size
        span = self.val_ids.numel() - self.block
        for m in range(self.eval_count):
            j = torch.arange(m * self.batch_size, (m + 1) * self.batch_size)
            yield self._windows(self.val_ids, (j * span) // windows)


def load_data(c, device):
    data = (ImageData if c["data"]["kind"] == "idx" else CharTextData)(c, device)
    if c["model"]["type"] == "gpt":
        vocab = c["model"]["vocab_size"]
        if vocab == 0:
            c["model"]["vocab_size"] = data.num_classes
        elif vocab < data.num_classes:
            raise BadInput(f"{c['path']}: model.vocab_size is {vocab} but {c['data']['path']} has "
                           f"{data.num_classes} distinct characters; raise it or leave it out")
    return data


# ---------------------------------------------------------------------------------------------
# training


def lr_at(c, taken, total_steps):
    """The learning rate of the update after `taken` applied updates (optim/lr_schedule.h)."""
    s, lr = c["schedule"], c["optimizer"]["lr"]
    if s["type"] == "constant":
        return lr
    if s["type"] == "step":
        return lr * s["gamma"] ** (taken // s["step_size"])
    warmup = s["warmup_steps"]
    decay = s["decay_steps"] if s["decay_steps"] > 0 else max(total_steps, warmup)
    if taken < warmup:
        return lr * (taken + 1) / warmup
    if taken > decay:
        return s["min_lr"]
    ratio = 1.0 if decay == warmup else (taken - warmup) / (decay - warmup)
    return s["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - s["min_lr"])


def make_optimizer(c, model):
    o = c["optimizer"]
    params = list(model.parameters())
    if o["type"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"],
                               weight_decay=o["weight_decay"], nesterov=o["nesterov"])
    if o["type"] == "adam":
        return torch.optim.Adam(params, lr=o["lr"], betas=o["betas"], eps=o["eps"],
                                weight_decay=o["weight_decay"])
    # mixprec's AdamW decays only matrices (Linear, Conv2d, Embedding weights), nanoGPT's rule.
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=o["lr"], betas=o["betas"],
                             eps=o["eps"])


def make_scaler(c, device):
    ls = c["loss_scale"]
    options = dict(init_scale=ls["init_scale"], growth_factor=ls["growth_factor"],
                   backoff_factor=ls["backoff_factor"], growth_interval=ls["growth_interval"])
    amp_scaler = getattr(torch.amp, "GradScaler", None)  # PyTorch >= 2.3
    if amp_scaler is not None:
        return amp_scaler(device.type, **options)
    if device.type == "cuda":
        return torch.cuda.amp.GradScaler(**options)
    return None


def autocast_applies(device, dtype):
    """Whether torch.autocast(device, dtype) really computes a matmul in `dtype` here: an
    unsupported dtype only warns and runs in float32, which would be timed as mixed precision."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x = torch.ones(2, 2, device=device)
            with torch.autocast(device_type=device.type, dtype=dtype):
                y = x @ x
        return y.dtype == dtype
    except RuntimeError:
        return False


def skip_reason(precision, device):
    """Why `precision` cannot run on `device`, or None."""
    if precision == "fp32":
        return None
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    if not autocast_applies(device, dtype):
        return (f"torch {torch.__version__}: autocast on {device.type} does not apply "
                f"{str(dtype).replace('torch.', '')}"
                + (" (its CPU autocast supports bfloat16 only)"
                   if device.type == "cpu" and dtype == torch.float16 else ""))
    if (precision == "fp16" and device.type != "cuda"
            and getattr(torch.amp, "GradScaler", None) is None):
        return f"torch {torch.__version__} has no GradScaler for {device.type}"
    return None


def build_model(c, device):
    try:
        model, _ = torch_models.build_from_description(c["model"])
    except torch_models.BadInput as e:
        raise BadInput(f"{c['path']}: {e}") from None
    if isinstance(model, torch_models.GPT):
        model.init_weights()
    return model.to(device)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def logits_loss(model, x, y, autocast, reduction="mean"):
    with autocast():
        logits = model(x)
    # The loss in float32 from the logits, as mixprec computes it.
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1),
                           reduction=reduction), logits


def evaluate(model, data, autocast):
    model.eval()
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in data.eval_batches():
            loss, logits = logits_loss(model, x, y, autocast, reduction="sum")
            total += loss.item()
            count += y.numel()
            if data.classification:
                correct += (logits.argmax(dim=-1) == y).sum().item()
    model.train()
    return total / count, (correct / count if data.classification else None)


def train_precision(c, data, precision, device, steps, warmup):
    """One row: trains a fresh model for `steps` optimizer steps, then evaluates it."""
    seed = c["train"]["seed"]
    torch.manual_seed(seed)
    model = build_model(c, device)
    model.train()
    params = list(model.parameters())
    optimizer = make_optimizer(c, model)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16,
             "fp16-noscale": torch.float16}.get(precision)
    if dtype is None:
        autocast = contextlib.nullcontext
    else:
        autocast = lambda: torch.autocast(device_type=device.type, dtype=dtype)
    scaler = make_scaler(c, device) if precision == "fp16" else None
    accum = c["train"]["accumulation_steps"]
    clip = c["train"]["clip_grad_norm"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    times, losses = [], []
    taken, skipped = 0, 0
    scale = scaler.get_scale() if scaler else 1.0
    for step in range(steps):
        batches = [data.train_batch(step * accum + k) for k in range(accum)]
        lr = lr_at(c, taken, steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        sync(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        step_loss = None
        for x, y in batches:
            loss, _ = logits_loss(model, x, y, autocast)
            part = loss / accum
            (scaler.scale(part) if scaler else part).backward()
            step_loss = part.detach() if step_loss is None else step_loss + part.detach()
        if scaler:
            if clip > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
        # Read after the clock: these host reads are not part of the timed step.
        losses.append(step_loss.item())
        if scaler:
            new_scale = scaler.get_scale()
            if new_scale < scale:
                skipped += 1  # the GradScaler found a non-finite gradient and skipped the step
            else:
                taken += 1
            scale = new_scale
        else:
            taken += 1
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    val_loss, val_accuracy = evaluate(model, data, autocast)

    timed = times[warmup:] if steps > warmup else times
    median = statistics.median(timed)
    per_step = c["train"]["batch_size"] * accum * data.tokens_per_example
    tail = losses[-min(LOSS_WINDOW, len(losses)):]
    return {
        "framework": "torch",
        "precision": precision,
        "median_step_ms": median,
        "min_step_ms": min(timed),
        "max_step_ms": max(timed),
        "throughput": per_step / (median / 1e3),
        "throughput_unit": data.unit,
        "peak_mem_mb": peak / 2 ** 20,
        "final_loss": sum(tail) / len(tail),
        "val_loss": val_loss,
        "val_accuracy": val_accuracy,
        "skipped_steps": skipped,
        "final_scale": float(scale),
        "host_syncs_per_step": None,
        "speedup_vs_fp32": None,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
    }


# ---------------------------------------------------------------------------------------------
# output


def round_row(row):
    """The row as written: times and rates rounded, and non-finite numbers (the loss of a run
    that diverged) as null, since JSON has no NaN or Infinity."""
    out = dict(row)
    for key, digits in (("median_step_ms", 3), ("min_step_ms", 3), ("max_step_ms", 3),
                        ("throughput", 1), ("peak_mem_mb", 1), ("speedup_vs_fp32", 3)):
        if out.get(key) is not None:
            out[key] = round(out[key], digits)
    for key, value in out.items():
        if isinstance(value, float) and not math.isfinite(value):
            out[key] = None
    return out


def fmt(value, spec):
    """`value` formatted by `spec`, or "-" as wide as the spec's width for None."""
    width = int(re.match(r"\d*", spec).group() or 0)
    return "-".rjust(width) if value is None else format(value, spec)


def print_table(result):
    print(f"torch {torch.__version__} on {result['device']}: {result['name']} "
          f"({result['config']}), {result['steps']} steps, timed after the first "
          f"{result['warmup']}")
    header = (f"{'precision':<13} {'median ms':>10} {'min ms':>9} {'max ms':>9} "
              f"{'throughput':>18} {'peak MB':>9} {'loss':>7} {'val loss':>8} {'val acc':>7} "
              f"{'skips':>5} {'scale':>8} {'speedup':>7}")
    print(header)
    for row in result["rows"]:
        if "skipped" in row:
            print(f"{row['precision']:<13} skipped: {row['skipped']}")
            continue
        unit = row["throughput_unit"].replace("samples", "smp").replace("tokens", "tok")
        speedup = "-" if row["speedup_vs_fp32"] is None else f"{row['speedup_vs_fp32']:.2f}x"
        print(f"{row['precision']:<13} {row['median_step_ms']:10.2f} {row['min_step_ms']:9.2f} "
              f"{row['max_step_ms']:9.2f} {row['throughput']:12.0f} {unit:>5} "
              f"{row['peak_mem_mb']:9.0f} {fmt(row['final_loss'], '7.4f')} "
              f"{fmt(row['val_loss'], '8.4f')} {fmt(row['val_accuracy'], '7.4f')} "
              f"{row['skipped_steps']:5d} "
              f"{row['final_scale']:8g} {speedup:>7}")
    notes = sorted({row["note"] for row in result["rows"] if row.get("note")})
    for note in notes:
        print(f"note: {note}")


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a mixprec YAML config")
    p.add_argument("--precisions", default="fp32,fp16,bf16",
                   help="comma-separated, from " + ", ".join(PRECISIONS)
                        + " (default fp32,fp16,bf16, as mixprec bench)")
    p.add_argument("--steps", type=int,
                   help="optimizer steps per precision (default: the config's, train.steps or "
                        "train.epochs * batches per epoch / accumulation_steps)")
    p.add_argument("--warmup", type=int, default=5,
                   help="first steps left out of the timing statistics (default 5; all steps "
                        "are timed when there are no more, and the row's note says so)")
    p.add_argument("--out", help="folder for bench.json (default "
                                 "runs/<name>-torch-bench-<date>-<time>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="change a config setting, as mixprec's --set (repeatable)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default os.cpu_count())")
    p.add_argument("--json", action="store_true", help="print the JSON object, not the table")
    args = p.parse_args(argv)
    args.precisions = [x for x in args.precisions.split(",") if x]
    unknown = [x for x in args.precisions if x not in PRECISIONS]
    if unknown or not args.precisions:
        p.error(f"--precisions: unknown {', '.join(unknown) or '(none given)'}; choose from "
                + ", ".join(PRECISIONS))
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must not be negative")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    return args


def run(args):
    c = load_config(args.config, args.overrides)
    load_torch()
    wanted = c["device"]
    if wanted == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"{args.config}: device: cuda, but this torch sees no CUDA device "
                       f"(torch.cuda.is_available() is false)")
    device = torch.device("cuda" if wanted != "cpu" and torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True

    data = load_data(c, device)
    build_model(c, torch.device("cpu"))  # a model that does not build fails before any training
    t = c["train"]
    if args.steps is not None:
        steps = args.steps
    elif t["steps"] > 0:
        steps = t["steps"]
    else:
        steps = max(1, t["epochs"] * data.batches_per_epoch // t["accumulation_steps"])
    warmup = args.warmup

    if device.type == "cuda":
        note = ("peak_mem_mb: torch.cuda.max_memory_allocated of this row; TF32 off, "
                "cudnn.benchmark on")
    else:
        note = ("peak_mem_mb: ru_maxrss, the process's resident high-water mark (data, torch "
                "and every earlier row included)")
    rows = []
    for precision in args.precisions:
        reason = skip_reason(precision, device)
        if reason:
            rows.append({"framework": "torch", "precision": precision, "skipped": reason})
            continue
        row = train_precision(c, data, precision, device, steps, warmup)
        row["note"] = note
        if steps <= warmup:
            row["note"] += f"; all {steps} steps timed (no more than the warmup of {warmup})"
        if precision == "fp16" and c["loss_scale"]["policy"] in ("static", "none"):
            row["note"] += (f"; loss_scale.policy {c['loss_scale']['policy']}: torch's "
                            f"GradScaler is dynamic, from init_scale")
        rows.append(row)
    base = next((r for r in rows if r["precision"] == "fp32" and "skipped" not in r), None)
    for row in rows:
        if base is not None and "skipped" not in row:
            row["speedup_vs_fp32"] = base["median_step_ms"] / row["median_step_ms"]

    name = c["name"]
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    result = {"config": c["path"], "name": name, "device": device.type,
              "device_name": device_name, "steps": steps, "warmup": warmup,
              "rows": [round_row(r) for r in rows]}
    out = args.out or os.path.join("runs", f"{name}-torch-bench-"
                                   + time.strftime("%Y%m%d-%H%M%S"))
    try:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "bench.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(path + ".tmp", path)
    except OSError as e:
        raise BadInput(f"{out}: cannot write bench.json: {e.strerror or e}") from None
    if args.json:
        print(json.dumps(result, indent=2, allow_nan=False))
    else:
        print_table(result)
        print(f"wrote {path}")
    return EXIT_OK


def main(argv):
    args = parse_args(argv)
    try:
        return run(args)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
