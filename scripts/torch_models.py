"""The torch.nn equivalents of mixprec's models, built from a JSON-style description.

Shared by scripts/torch_check_checkpoint.py (loads a mixprec checkpoint into them) and
scripts/torch_bench.py (trains them from a mixprec config). The module trees, and so the
state_dict names and layouts, are those mixprec's checkpoints use:

  {"type": "cnn", "in_channels", "input_size", "layers": [{"kind": "conv", "out", "kernel",
   "stride", "padding", "bias"}, {"kind": "batchnorm"}, {"kind": "maxpool", "kernel",
   "stride", "padding"}, {"kind": "linear", "out", "bias"}, {"kind": "dropout", "p"},
   {"kind": "relu"}, {"kind": "gelu"}, {"kind": "avgpool", ...}, {"kind": "flatten"}]}
    -> nn.Sequential with one module per layer, at the same index as in mixprec's build_cnn.
  {"type": "gpt", "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout",
   "bias", "tie_weights"}
    -> nanoGPT's GPT (model.py): transformer.{wte, wpe, h.N.{ln_1, attn.c_attn, attn.c_proj,
       ln_2, mlp.c_fc, mlp.c_proj}, ln_f}, lm_head.

A description that does not build raises BadInput naming the field.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class BadInput(Exception):
    """A file or description that cannot be used (the scripts' exit status 2)."""


def field(desc, key, kind, where):
    """desc[key], checked to be of `kind` (int, float, bool, str or list)."""
    if key not in desc:
        raise BadInput(f"model description: {where} lacks '{key}'")
    value = desc[key]
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not an integer")
    if kind is float and not isinstance(value, (int, float)):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not a number")
    if kind is bool and not isinstance(value, bool):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not a boolean")
    if kind is str and not isinstance(value, str):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not a string")
    if kind is list and not isinstance(value, list):
        raise BadInput(f"model description: {where}.{key} is {value!r}, not a list")
    return value


# ---------------------------------------------------------------------------------------------
# cnn


def build_cnn(desc):
    """nn.Sequential with the same indices as mixprec's build_cnn; shapes inferred the same way.
    Also returns {bias name: weight name} for each conv bias that feeds a batch norm.

    torch's default initialisation (kaiming_uniform with a = sqrt(5): bound 1 / sqrt(fan_in)
    for weights and biases) is the one mixprec's Conv2d and Linear use."""
    channels = field(desc, "in_channels", int, "cnn")
    side = field(desc, "input_size", int, "cnn")
    features = None  # set after a flatten
    layers, zero_grads = [], {}
    for i, layer in enumerate(field(desc, "layers", list, "cnn")):
        where = f"layers[{i}]"
        if not isinstance(layer, dict):
            raise BadInput(f"model description: {where} is {layer!r}, not an object")
        kind = field(layer, "kind", str, where)
        if kind in ("conv", "maxpool", "avgpool") and features is not None:
            raise BadInput(f"model description: {where} ({kind}) follows a flatten")
        if kind == "conv":
            out, k = field(layer, "out", int, where), field(layer, "kernel", int, where)
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
            k = field(layer, "kernel", int, where)
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
            out = field(layer, "out", int, where)
            layers.append(nn.Linear(features, out, bias=layer.get("bias", True)))
            features = out
        elif kind == "dropout":
            layers.append(nn.Dropout(float(layer.get("p", 0.0))))
        else:
            raise BadInput(f"model description: {where} has unknown kind '{kind}'")
        if side < 1:
            raise BadInput(f"model description: {where} ({kind}) shrinks the image to {side}")
    return nn.Sequential(*layers), zero_grads


# ---------------------------------------------------------------------------------------------
# gpt


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
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        heads = lambda z: z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)  # [B, H, T, D]
        # Scores and softmax in float32 at least (float64 when the model is float64). Under
        # autocast the matmuls still run in the autocast dtype and softmax in float32, as
        # autocast's op lists say.
        wide = torch.promote_types(q.dtype, torch.float32)
        att = (q.to(wide) @ k.to(wide).transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        # Dropout on the float32 probabilities, as mixprec's attention (and nanoGPT's).
        att = self.attn_dropout(att)
        y = (att @ v.to(wide)).to(x.dtype)
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
        get = lambda key, kind: field(desc, key, kind, "gpt")
        vocab, block, n_layer = get("vocab_size", int), get("block_size", int), get("n_layer", int)
        n_head, n_embd = get("n_head", int), get("n_embd", int)
        dropout, bias = float(get("dropout", float)), get("bias", bool)
        if min(vocab, block, n_layer, n_head, n_embd) < 1 or n_embd % n_head:
            raise BadInput(f"model description: gpt sizes do not build a model: {desc}")
        self.block_size, self.n_layer = block, n_layer
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

    def init_weights(self):
        """nanoGPT's initialisation, which mixprec's GPT uses too: Linear and Embedding weights
        N(0, 0.02), Linear biases 0 (LayerNorm keeps ones and zeros), then the residual
        projections (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer))."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layer))
        return self

    def forward(self, ids):
        t = ids.size(1)
        if t > self.block_size:
            raise BadInput(f"inputs: {t} tokens per row, longer than block_size {self.block_size}")
        pos = torch.arange(0, t, dtype=torch.long, device=ids.device)
        x = self.transformer.drop(self.transformer.wte(ids) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def build_from_description(desc):
    """(torch model, {gradient that is zero in exact arithmetic in training mode: the parameter
    whose gradient scales its rounding noise}) for a cnn or gpt description. The weights are
    torch's defaults; call GPT.init_weights() for mixprec's GPT initialisation."""
    if not isinstance(desc, dict):
        raise BadInput("model description is not an object")
    kind = desc.get("type")
    if kind == "cnn":
        return build_cnn(desc)
    if kind == "gpt":
        return GPT(desc), {}
    raise BadInput(f"model description: type {kind!r}; expected 'cnn' or 'gpt'")
