// Embedding: a lookup table of row vectors, as torch.nn.Embedding.
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/generator.h"
#include "layers/module.h"

namespace mixprec {

class Embedding : public Module {
 public:
  // Parameter `weight` [num_embeddings, embedding_dim] drawn from N(0, 1), torch's default.
  // Throws for an extent < 1.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& init, Device device = kCPU);

  // ids I32 of any non-empty shape with values in [0, num_embeddings) -> [ids..., dim] in the
  // working dtype. Throws for other dtypes and for an id out of range (naming it and where).
  Tensor forward(const Tensor& ids) override;
  std::string describe() const override;

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }
  const Parameter& weight() const { return weight_; }

 private:
  int64_t num_embeddings_, embedding_dim_;
  Parameter weight_;
};

}  // namespace mixprec
