#include "layers/gpt.h"

#include <cmath>
#include <functional>
#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/ops/ops.h"
#include "layers/model_builder.h"
#include "layers/transformer_block.h"

namespace mixprec {
namespace {

// nanoGPT's `transformer` nn.ModuleDict: a named holder of the embeddings, the blocks and the
// final norm. It only exists for the names; GPT::forward calls its children itself.
class ModuleDict : public Module {
 public:
  using Module::register_module;
  Tensor forward(const Tensor&) override {
    MIXPREC_FAIL("GPT: transformer is a container of layers and has no forward; call the GPT");
  }
  std::string describe() const override { return "ModuleDict"; }
};

void check_spec(const GptSpec& spec) {
  MIXPREC_CHECK(spec.vocab_size >= 1, "GPT: vocab_size must be >= 1, got ", spec.vocab_size,
                " (0 means 'from the data' and must be filled in before the model is built)");
  MIXPREC_CHECK(spec.block_size >= 1, "GPT: block_size must be >= 1, got ", spec.block_size);
  MIXPREC_CHECK(spec.n_layer >= 1, "GPT: n_layer must be >= 1, got ", spec.n_layer);
  MIXPREC_CHECK(spec.n_head >= 1, "GPT: n_head must be >= 1, got ", spec.n_head);
  MIXPREC_CHECK(spec.n_embd >= 1, "GPT: n_embd must be >= 1, got ", spec.n_embd);
  MIXPREC_CHECK(spec.n_embd % spec.n_head == 0, "GPT: n_embd (", spec.n_embd,
                ") must be divisible by n_head (", spec.n_head, ")");
  MIXPREC_CHECK(spec.dropout >= 0.0 && spec.dropout < 1.0, "GPT: dropout must be in [0, 1), got ",
                spec.dropout);
}

// Overwrites a freshly built parameter's value (the working dtype is still F32 here, but the
// refresh keeps this right whatever it is).
void refill(Parameter param, const Tensor& value) {
  param.master().copy_(value);
  param.refresh_working();
}

// torch's Module.apply: children first, then the module itself.
void apply(Module& module, const std::function<void(Module&)>& fn) {
  for (auto& [name, child] : module.named_children()) apply(*child, fn);
  fn(module);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

GPT::GPT(const GptSpec& spec, Generator& init, std::shared_ptr<Generator> dropout_gen,
         Device device)
    : spec_(spec) {
  check_spec(spec);
  const int64_t c = spec.n_embd;
  auto transformer = register_module("transformer", std::make_shared<ModuleDict>());
  wte_ = transformer->register_module(
      "wte", std::make_shared<Embedding>(spec.vocab_size, c, init, device));
  wpe_ = transformer->register_module(
      "wpe", std::make_shared<Embedding>(spec.block_size, c, init, device));
  drop_ =
      transformer->register_module("drop", std::make_shared<Dropout>(spec.dropout, dropout_gen));
  h_ = transformer->register_module("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < spec.n_layer; ++i)
    h_->append(std::make_shared<Block>(c, spec.n_head, spec.bias, spec.dropout, dropout_gen, init,
                                       device, spec.fuse_linear_gelu));
  ln_f_ = transformer->register_module("ln_f", std::make_shared<LayerNorm>(c, spec.bias, device));
  if (spec.tie_weights) {
    // nanoGPT assigns lm_head.weight to wte.weight; the first name registered is the one that
    // parameters() reports, transformer.wte.weight, as in torch.
    lm_head_ = register_module("lm_head", std::make_shared<Linear>(wte_->weight()));
  } else {
    lm_head_ = register_module(
        "lm_head", std::make_shared<Linear>(c, spec.vocab_size, /*bias=*/false, init, device));
  }

  // nanoGPT's self.apply(self._init_weights) (LayerNorm keeps its ones and zeros) ...
  apply(*this, [&](Module& m) {
    if (auto* linear = dynamic_cast<Linear*>(&m)) {
      refill(linear->weight(),
             Tensor::normal(linear->weight().shape(), init, 0.f, 0.02f, DType::F32, device));
      if (linear->bias().defined())
        refill(linear->bias(), Tensor::zeros(linear->bias().shape(), DType::F32, device));
    } else if (auto* embedding = dynamic_cast<Embedding*>(&m)) {
      refill(embedding->weight(),
             Tensor::normal(embedding->weight().shape(), init, 0.f, 0.02f, DType::F32, device));
    }
  });
  // ... then the scaled init of the residual projections (GPT-2: each block adds two
  // residual branches, so their outputs are scaled by 1 / sqrt(2 n_layer)).
  const float proj_std =
      static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(spec.n_layer)));
  for (auto& [name, param] : named_parameters())
    if (ends_with(name, "c_proj.weight"))
      refill(param, Tensor::normal(param.shape(), init, 0.f, proj_std, DType::F32, device));
}

void GPT::check_ids(const Tensor& ids, int64_t start) const {
  MIXPREC_CHECK(ids.defined() && ids.dtype() == DType::I32 && ids.dim() == 2,
                "GPT: expects token ids I32 [B, T], got ",
                ids.defined() ? mixprec::describe(ids) : std::string("an undefined tensor"));
  const int64_t t = ids.size(1);
  MIXPREC_CHECK(ids.size(0) >= 1 && t >= 1, "GPT: token ids ", mixprec::describe(ids),
                " are empty");
  MIXPREC_CHECK(start + t <= spec_.block_size, "GPT: a sequence of ", start + t,
                " tokens is longer than block_size = ", spec_.block_size,
                " (the position embedding has block_size rows); crop the input to the last ",
                spec_.block_size, " tokens");
  MIXPREC_CHECK(ids.device() == wte_->weight().device(), "GPT: token ids ", mixprec::describe(ids),
                " are on ", ids.device(), " but the model is on ", wte_->weight().device());
}

Tensor GPT::token_embedding(const Tensor& ids) {
  try {  // the embedding op finds an id out of range; say what the range means here
    return (*wte_)(ids);  // [B, T, C]
  } catch (const Error& e) {
    MIXPREC_FAIL("GPT: token ids must be in [0, vocab_size = ", spec_.vocab_size, "): ", e.what());
  }
}

Tensor GPT::forward(const Tensor& ids) {
  check_ids(ids, 0);
  const int64_t t = ids.size(1);
  const Tensor tok_emb = token_embedding(ids);
  if (!positions_.defined() || positions_.size(0) != t || positions_.device() != ids.device()) {
    std::vector<int32_t> pos(static_cast<size_t>(t));
    std::iota(pos.begin(), pos.end(), 0);
    positions_ = Tensor::from_ints(pos, {t}, ids.device());
  }
  const Tensor pos_emb = (*wpe_)(positions_);  // [T, C], broadcast over B
  Tensor x = (*drop_)(tok_emb + pos_emb);
  x = (*h_)(x);
  return (*lm_head_)((*ln_f_)(x));
}

Tensor GPT::forward_cached(const Tensor& ids, KvCache& cache) {
  check_ids(ids, cache.length);
  const int64_t b = ids.size(0), t = ids.size(1);
  const auto blocks = h_->named_children();
  if (cache.layers.empty()) cache.layers.resize(blocks.size());
  MIXPREC_CHECK(cache.layers.size() == blocks.size(), "GPT: the cache has ", cache.layers.size(),
                " layers, the model ", blocks.size());

  std::vector<int32_t> pos(static_cast<size_t>(t));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(cache.length));
  const Tensor pos_emb = (*wpe_)(Tensor::from_ints(pos, {t}, ids.device()));
  Tensor x = token_embedding(ids) + pos_emb;
  for (size_t i = 0; i < blocks.size(); ++i)
    x = static_cast<Block&>(*blocks[i].second).forward_cached(x, cache.layers[i]);
  cache.length += t;
  const Tensor last = ops::slice(x, 1, t - 1, t);  // [B, 1, C]
  return ops::reshape((*lm_head_)((*ln_f_)(last)), {b, spec_.vocab_size});
}

std::string GPT::describe() const {
  return detail::concat("GPT(vocab_size=", spec_.vocab_size, ", block_size=", spec_.block_size,
                        ", n_layer=", spec_.n_layer, ", n_head=", spec_.n_head,
                        ", n_embd=", spec_.n_embd, ", dropout=", spec_.dropout,
                        ", bias=", spec_.bias ? "true" : "false",
                        ", tie_weights=", spec_.tie_weights ? "true" : "false", ")");
}

std::shared_ptr<Module> build_gpt(const GptSpec& spec, Generator& init,
                                  std::shared_ptr<Generator> dropout_gen, Device device) {
  auto model = std::make_shared<GPT>(spec, init, std::move(dropout_gen), device);
  model->assign_names();
  return model;
}

}  // namespace mixprec
