#include "dist/mpi_communicator.h"

#include <mpi.h>

#include <array>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/mpi_session.h"
#include "dist/reduction.h"
#include "dist/watchdog.h"

namespace mixprec::dist {
namespace {

// The collectives, as the agreement check names them.
enum class Op : int64_t {
  SumInRankOrder,
  Max,
  AllGather,
  Broadcast,
  BroadcastBytes,
  AllGatherInt,
  Barrier
};
constexpr std::array<const char*, 7> kOpNames = {
    "sum_in_rank_order", "max",    "all_gather", "broadcast", "broadcast_bytes",
    "all_gather_int",    "barrier"};
const char* op_name(int64_t op) {
  return op >= 0 && op < static_cast<int64_t>(kOpNames.size()) ? kOpNames[op] : "?";
}

// What every rank's call must agree on; kAny where the operation leaves it free.
constexpr int64_t kAny = -1;
struct Call {
  Op op;
  int64_t dtype = kAny;
  int64_t numel = kAny;
  int64_t root = kAny;
  int64_t device = kAny;
};
constexpr std::array<const char*, 5> kCallFields = {"operation", "dtype", "numel", "root",
                                                    "device"};

int64_t device_code(const Tensor& t) {
  return t.device().is_cpu() ? -2 : t.device().index;  // -2: not kAny
}

MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT32_T;
    case DType::F16:
    case DType::BF16:
      return MPI_UINT16_T;  // carried as bits, never computed on
  }
  return MPI_BYTE;
}

void check_mpi(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, text, &length);
  MIXPREC_FAIL("mpi: ", call, " failed: ", std::string(text, length));
}

// An MPI count: every buffer of one call must stay below INT_MAX elements.
int count_of(int64_t numel, const char* op, int ranks) {
  MIXPREC_CHECK(numel >= 0 && numel <= static_cast<int64_t>(INT_MAX) - ranks, op, ": ", numel,
                " elements are more than one MPI call carries (2^31 - 1 - ", ranks,
                "); split the tensor");
  return static_cast<int>(numel);
}

// MPI_User_function for the F32 maximum (reduction.h): inout = in max inout.
void max_f32(void* in, void* inout, int* length, MPI_Datatype*) {
  const float* a = static_cast<const float*>(in);
  float* b = static_cast<float*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = max_nan_wins(a[i], b[i]);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) {
    init_mpi_once();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    watchdog_ = std::make_unique<Watchdog>(rank_, timeout_s, [](const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    });
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    // Errors come back as status codes (thrown as mixprec::Error) instead of ending the run.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    check_mpi(MPI_Op_create(&max_f32, /*commute=*/1, &max_op_), "MPI_Op_create");
  }

  ~MpiCommunicator() override {
    watchdog_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Op_free(&max_op_);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  Device device() const override { return kCPU; }

  void sum_in_rank_order(Tensor& values) override {
    const auto watch = watchdog_->watch("sum_in_rank_order", step());
    agree(watch,
          {Op::SumInRankOrder, dtype_code(values), values.numel(), kAny, device_code(values)});
    check_host(values, "sum_in_rank_order");
    MIXPREC_CHECK(values.dtype() == DType::F32, "sum_in_rank_order: F32 values, got ",
                  describe(values));
    count_of(values.numel(), "sum_in_rank_order", size_);
    // Rank r adds up shard r of every rank's buffer, then every rank gathers every sum.
    const int64_t numel = values.numel();
    const Shard mine = shard_of(numel, size_, rank_);
    std::vector<int> send_counts(size_), send_displs(size_), recv_counts(size_), recv_displs(size_);
    for (int r = 0; r < size_; ++r) {
      const Shard shard = shard_of(numel, size_, r);
      send_counts[r] = static_cast<int>(shard.size);
      send_displs[r] = static_cast<int>(shard.begin);
      recv_counts[r] = static_cast<int>(mine.size);
      recv_displs[r] = static_cast<int>(r * mine.size);
    }
    std::vector<float> runs(static_cast<size_t>(size_ * mine.size));
    float* data = values.data_as<float>();
    check_mpi(MPI_Alltoallv(data, send_counts.data(), send_displs.data(), MPI_FLOAT, runs.data(),
                            recv_counts.data(), recv_displs.data(), MPI_FLOAT, comm_),
              "MPI_Alltoallv");
    add_in_rank_order(runs.data(), size_, mine.size, data + mine.begin);
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, send_counts.data(),
                             send_displs.data(), MPI_FLOAT, comm_),
              "MPI_Allgatherv");
    values.mark_modified();
  }

  void max(Tensor& values) override {
    const auto watch = watchdog_->watch("max", step());
    agree(watch, {Op::Max, dtype_code(values), values.numel(), kAny, device_code(values)});
    check_host(values, "max");
    const DType dtype = values.dtype();
    MIXPREC_CHECK(dtype == DType::F32 || dtype == DType::I32, "max: F32 or I32 values, got ",
                  describe(values));
    const int count = count_of(values.numel(), "max", size_);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), count, element_type(dtype),
                            dtype == DType::F32 ? max_op_ : MPI_MAX, comm_),
              "MPI_Allreduce");
    values.mark_modified();
  }

  Tensor all_gather(const Tensor& mine) override {
    const auto watch = watchdog_->watch("all_gather", step());
    agree(watch, {Op::AllGather, dtype_code(mine), kAny, kAny, device_code(mine)});
    check_host(mine, "all_gather");
    MIXPREC_CHECK(mine.dim() == 1, "all_gather: a 1-D tensor, got ", describe(mine));
    const std::vector<int64_t> numels = gather_int(mine.numel());
    std::vector<int> counts(size_), displs(size_);
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      counts[r] = count_of(numels[r], "all_gather", size_);
      displs[r] = count_of(total, "all_gather", size_);
      total += numels[r];
    }
    count_of(total, "all_gather", size_);
    Tensor all = Tensor::empty({total}, mine.dtype(), kCPU);
    const MPI_Datatype type = element_type(mine.dtype());
    check_mpi(MPI_Allgatherv(mine.data(), counts[rank_], type, all.data(), counts.data(),
                             displs.data(), type, comm_),
              "MPI_Allgatherv");
    return all;
  }

  void broadcast(Tensor& values, int root) override {
    const auto watch = watchdog_->watch("broadcast", step());
    agree(watch, {Op::Broadcast, dtype_code(values), values.numel(), root, device_code(values)});
    check_host(values, "broadcast");
    check_root(root, "broadcast");
    const int count = count_of(values.numel(), "broadcast", size_);
    check_mpi(MPI_Bcast(values.data(), count, element_type(values.dtype()), root, comm_),
              "MPI_Bcast");
    if (rank_ != root) values.mark_modified();
  }

  std::vector<uint8_t> broadcast_bytes(const std::vector<uint8_t>& bytes, int root) override {
    const auto watch = watchdog_->watch("broadcast_bytes", step());
    agree(watch, {Op::BroadcastBytes, kAny, kAny, root, kAny});
    check_root(root, "broadcast_bytes");
    int64_t length = static_cast<int64_t>(bytes.size());
    check_mpi(MPI_Bcast(&length, 1, MPI_INT64_T, root, comm_), "MPI_Bcast");
    std::vector<uint8_t> out = rank_ == root ? bytes : std::vector<uint8_t>(length);
    check_mpi(
        MPI_Bcast(out.data(), count_of(length, "broadcast_bytes", size_), MPI_BYTE, root, comm_),
        "MPI_Bcast");
    return out;
  }

  std::vector<int64_t> all_gather_int(int64_t value) override {
    const auto watch = watchdog_->watch("all_gather_int", step());
    agree(watch, {Op::AllGatherInt});
    return gather_int(value);
  }

  // The agreement check's all-reduce is the barrier: no rank leaves it before every rank
  // has entered it.
  void barrier() override {
    const auto watch = watchdog_->watch("barrier", step());
    agree(watch, {Op::Barrier});
  }

 private:
  static int64_t dtype_code(const Tensor& t) { return static_cast<int64_t>(t.dtype()); }

  static void check_host(const Tensor& t, const char* op) {
    MIXPREC_CHECK(t.device().is_cpu(), op, ": the mpi backend carries host tensors, got ",
                  describe(t));
  }

  void check_root(int root, const char* op) const {
    MIXPREC_CHECK(root >= 0 && root < size_, op, ": root ", root, " is not a rank of ", size_);
  }

  std::vector<int64_t> gather_int(int64_t value) {
    std::vector<int64_t> all(size_);
    check_mpi(MPI_Allgather(&value, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, comm_),
              "MPI_Allgather");
    return all;
  }

  // Every rank learns each field's maximum and (negated) minimum in one all-reduce, so every
  // rank sees a disagreement and throws the same error instead of waiting in a mismatched call.
  void agree(const Watchdog::Watch& watch, const Call& call) {
    const std::array<int64_t, 5> fields = {static_cast<int64_t>(call.op), call.dtype, call.numel,
                                           call.root, call.device};
    std::array<int64_t, 10> bounds;
    for (size_t i = 0; i < fields.size(); ++i) {
      bounds[i] = fields[i];
      bounds[fields.size() + i] = -fields[i];
    }
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, bounds.data(), static_cast<int>(bounds.size()),
                            MPI_INT64_T, MPI_MAX, comm_),
              "MPI_Allreduce");
    for (size_t i = 0; i < fields.size(); ++i) {
      const int64_t high = bounds[i];
      const int64_t low = -bounds[fields.size() + i];
      if (high == low) continue;
      if (i == 0) {
        MIXPREC_FAIL("mpi: collective #", watch.sequence(), " at step ", step(),
                     ": the ranks called different collectives (", op_name(low), " and ",
                     op_name(high), "); every rank must call the same ones in the same order");
      }
      MIXPREC_FAIL("mpi: ", op_name(fields[0]), " #", watch.sequence(), " at step ", step(),
                   ": the ranks disagree on ", kCallFields[i], " (", describe_field(i, low),
                   " and ", describe_field(i, high), "); every rank must pass the same");
    }
  }

  static std::string describe_field(size_t field, int64_t value) {
    if (field == 1) return std::string(dtype_name(static_cast<DType>(value)));
    if (field == 4) return value < 0 ? "cpu" : "cuda:" + std::to_string(value);
    return std::to_string(value);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op max_op_ = MPI_OP_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s) {
  return std::make_unique<MpiCommunicator>(timeout_s);
}

}  // namespace mixprec::dist
