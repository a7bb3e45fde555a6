// The two model builders. Both create parameters on `device` with PyTorch's default
// initialisation drawn from `init` (CNN: torch.nn defaults per layer; GPT: nanoGPT's normal(0,
// 0.02), zero biases, residual projections (attn.c_proj, mlp.c_proj) with std
// 0.02 / sqrt(2 * n_layer)), call assign_names() on the root, and leave the working dtype F32
// (PrecisionPolicy::apply switches it). Dropout layers draw their masks from `dropout_gen`,
// which the caller owns and checkpoints.
#pragma once

#include <memory>

#include "core/device.h"
#include "core/generator.h"
#include "layers/model_spec.h"
#include "layers/module.h"

namespace mixprec {

// A Sequential whose children are named "0", "1", ... like nn.Sequential. Shapes are
// inferred from in_channels and input_size; a layer that does not fit (a conv after flatten,
// a linear before flatten on a 4-D input, a pool larger than its input, a spatial size that
// reaches 0) throws naming the layer index, its kind and the incoming shape. Input: [N,
// in_channels, input_size, input_size]; output: whatever the last layer gives ([N, classes]
// for a classifier).
std::shared_ptr<Module> build_cnn(const CnnSpec& spec, Generator& init,
                                  std::shared_ptr<Generator> dropout_gen,
                                  Device device = kCPU);

// nanoGPT's GPT with its parameter names. Input: ids I32 [B, T] with T <= block_size, values
// in [0, vocab_size); output: logits [B, T, vocab_size] in the working dtype. Throws for
// vocab_size < 1, n_embd not divisible by n_head, or any extent < 1.
std::shared_ptr<Module> build_gpt(const GptSpec& spec, Generator& init,
                                  std::shared_ptr<Generator> dropout_gen,
                                  Device device = kCPU);

}  // namespace mixprec
