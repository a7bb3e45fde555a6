#include "layers/embedding.h"

#include "core/error.h"
#include "core/ops/ops.h"

namespace mixprec {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& init, Device device)
    : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  MIXPREC_CHECK(num_embeddings >= 1 && embedding_dim >= 1, "Embedding: num_embeddings (",
                num_embeddings, ") and embedding_dim (", embedding_dim, ") must be >= 1");
  weight_ = register_parameter("weight", Tensor::normal({num_embeddings, embedding_dim}, init, 0.f,
                                                        1.f, DType::F32, device));
}

Tensor Embedding::forward(const Tensor& ids) { return ops::embedding(weight_.working(), ids); }

std::string Embedding::describe() const {
  return detail::concat("Embedding(", num_embeddings_, ", ", embedding_dim_, ")");
}

}  // namespace mixprec
