// The communicator of a run of one process.
#include "core/error.h"
#include "core/ops/ops.h"
#include "dist/communicator.h"

namespace mixprec::dist {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "none"; }
  // Collectives of one rank take tensors on any device.
  Device device() const override { return kCPU; }

  void sum_in_rank_order(Tensor& values) override {
    MIXPREC_CHECK(values.dtype() == DType::F32, "sum_in_rank_order: F32 values, got ",
                  describe(values));
    // +0 + x: a -0 becomes +0, as in the sum over several ranks (on any device).
    values.copy_(ops::add_scalar(values.detach(), 0.0));
  }
  void max(Tensor& values) override {
    MIXPREC_CHECK(values.dtype() == DType::F32 || values.dtype() == DType::I32,
                  "max: F32 or I32 values, got ", describe(values));
  }
  Tensor all_gather(const Tensor& mine) override { return mine.clone(); }
  void broadcast(Tensor&, int root) override { check_root(root); }
  std::vector<uint8_t> broadcast_bytes(const std::vector<uint8_t>& bytes, int root) override {
    check_root(root);
    return bytes;
  }
  std::vector<int64_t> all_gather_int(int64_t value) override { return {value}; }
  void barrier() override {}

 private:
  static void check_root(int root) {
    MIXPREC_CHECK(root == 0, "broadcast: root ", root, " is not a rank of a run of one process");
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process() { return std::make_unique<SingleProcess>(); }

}  // namespace mixprec::dist
