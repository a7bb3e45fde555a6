#include "apps/sample/sample_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "apps/checkpoint/checkpoint_dir.h"
#include "apps/data/char_text.h"
#include "apps/train/session.h"
#include "core/autograd/grad_mode.h"
#include "core/error.h"
#include "core/ops/ops.h"
#include "layers/gpt.h"

namespace mixprec {
namespace {

void check_options(const SampleOptions& o) {
  MIXPREC_CHECK(o.tokens >= 1, "--tokens must be >= 1, got ", o.tokens);
  MIXPREC_CHECK(std::isfinite(o.choice.temperature) && o.choice.temperature > 0.0,
                "--temperature must be a number > 0, got ", o.choice.temperature);
  MIXPREC_CHECK(o.choice.top_k >= 1, "--top-k must be >= 1 (a value above the vocabulary keeps "
                "every token), got ", o.choice.top_k);
  MIXPREC_CHECK(o.precision.empty() || o.precision == "fp32" || o.precision == "fp16" ||
                    o.precision == "bf16",
                "--precision must be fp32, fp16 or bf16, got '", o.precision, "'");
  MIXPREC_CHECK(o.device.empty() || o.device == "cpu" || o.device == "cuda" || o.device == "auto",
                "--device must be cpu, cuda or auto, got '", o.device, "'");
  MIXPREC_CHECK(!o.prompt.empty(), "--prompt is empty; give at least one character (the default "
                "is a newline)");
}

std::vector<std::string> session_overrides(const SampleOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (!o.precision.empty()) overrides.push_back("precision=" + o.precision);
  if (!o.device.empty()) overrides.push_back("device=" + o.device);
  return overrides;
}

// The GPT the checkpoint holds, loaded into the session's model: a CNN's checkpoint is said
// to be one rather than listed key by key.
GPT& load_gpt(Session& s, const SampleOptions& o) {
  MIXPREC_CHECK(s.config.model.type == ModelConfig::Type::Gpt, "mixprec sample generates text "
                "with a GPT, but ", o.config_path, " describes a CNN (model.type: cnn)");
  MIXPREC_CHECK(s.config.data.kind == DataConfig::Kind::CharText, o.config_path,
                ": data.kind must be text, whose characters are the GPT's vocabulary");
  const LoadedCheckpoint checkpoint = load_checkpoint(o.checkpoint);
  MIXPREC_CHECK(checkpoint.model.count("transformer.wte.weight") == 1, checkpoint.path,
                " holds no GPT (it has no transformer.wte.weight; a CNN's checkpoint?)");
  load_model_weights(s, checkpoint.model, checkpoint.path);
  s.model->eval();
  return static_cast<GPT&>(*s.model);
}

std::vector<int32_t> encode_prompt(const CharVocabulary& vocab, const SampleOptions& o,
                                   const std::string& data_path) {
  try {
    return vocab.encode(o.prompt);
  } catch (const Error& e) {
    std::string why = e.what();
    const std::string prefix = "CharVocabulary::encode: ";
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
    MIXPREC_FAIL("--prompt: ", why, " of ", data_path, " that the model was trained on");
  }
}

// Generates tokens one at a time; owns the cache and the context.
class TokenStream {
 public:
  TokenStream(GPT& gpt, std::vector<int32_t> context, bool use_cache, Device device)
      : gpt_(gpt), context_(std::move(context)), use_cache_(use_cache), device_(device) {}

  // The logits [vocab_size] that follow the context.
  std::vector<float> next_logits() {
    const int64_t block = gpt_.spec().block_size;
    const int64_t n = static_cast<int64_t>(context_.size());
    if (use_cache_ && n <= block) {
      const size_t start = static_cast<size_t>(cache_.length);  // n - 1 after the first call
      const std::vector<int32_t> fresh(context_.begin() + static_cast<std::ptrdiff_t>(start),
                                       context_.end());
      const Tensor ids = Tensor::from_ints(fresh, {1, static_cast<int64_t>(fresh.size())}, device_);
      return gpt_.forward_cached(ids, cache_).to(DType::F32).to_float_vector();
    }
    cache_.clear();
    const int64_t t = std::min(n, block);
    const std::vector<int32_t> window(context_.end() - t, context_.end());
    const Tensor logits = gpt_(Tensor::from_ints(window, {1, t}, device_));  // [1, t, V]
    return ops::reshape(ops::slice(logits, 1, t - 1, t), {-1}).to(DType::F32).to_float_vector();
  }

  void append(int32_t id) { context_.push_back(id); }

 private:
  GPT& gpt_;
  std::vector<int32_t> context_;
  bool use_cache_;
  Device device_;
  KvCache cache_;
};

}  // namespace

SampleResult run_sampling(const SampleOptions& options, std::ostream& out) {
  check_options(options);
  Session s = open_session(options.config_path, session_overrides(options));
  GPT& gpt = load_gpt(s, options);
  const CharVocabulary vocab = char_vocabulary_of(s.config.data.path);
  const std::vector<int32_t> prompt = encode_prompt(vocab, options, s.config.data.path);

  SampleResult result;
  result.device = s.device.str();
  result.precision = s.config.precision;
  result.text = options.prompt;
  NoGradGuard no_grad;
  TokenStream stream(gpt, prompt, options.use_cache, s.device);
  const auto start = std::chrono::steady_clock::now();
  out << options.prompt << std::flush;
  for (int64_t i = 0; i < options.tokens; ++i) {
    std::vector<float> logits = stream.next_logits();
    // A vocab_size above the data's characters leaves ids no character stands for.
    logits.resize(static_cast<size_t>(vocab.size()));
    const int32_t id =
        choose_token(logits, options.choice, token_uniform(options.seed, static_cast<uint64_t>(i)));
    stream.append(id);
    const std::string piece = vocab.decode({id});
    result.text += piece;
    out << piece << std::flush;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.tokens = options.tokens;
  return result;
}

}  // namespace mixprec
