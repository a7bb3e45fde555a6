// make_communicator's choice of backend and its errors, in a process not started by mpirun.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/device.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "tests/error_message.h"
#include "tests/tensor_bytes.h"

using namespace mixprec;
using mixprec_test::error_message;

namespace {

// Sets an environment variable for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    had_ = std::getenv(name) != nullptr;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// None of the variables by which mpirun is recognised.
struct NotUnderMpirun {
  ScopedEnv size{"OMPI_COMM_WORLD_SIZE", nullptr};
  ScopedEnv rank{"OMPI_COMM_WORLD_RANK", nullptr};
  ScopedEnv pmix{"PMIX_RANK", nullptr};
};

}  // namespace

TEST_CASE("launched_by_mpirun reads Open MPI's and PMIx's variables", "[dist]") {
  NotUnderMpirun clean;
  CHECK_FALSE(dist::launched_by_mpirun());
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"}) {
    ScopedEnv set(name, "0");
    CHECK(dist::launched_by_mpirun());
  }
}

TEST_CASE("without mpirun none, auto and mpi are one rank whose collectives keep the input",
          "[dist]") {
  NotUnderMpirun clean;
  for (const char* backend : {"none", "auto", "mpi"}) {
    CAPTURE(backend);
#if !MIXPREC_WITH_MPI
    if (std::string(backend) == "mpi") continue;
#endif
    auto comm = dist::make_communicator(backend, 300.0, kCPU);
    CHECK(comm->backend() == "none");
    CHECK(comm->rank() == 0);
    CHECK(comm->size() == 1);
    Tensor sum = Tensor::from_vector({-0.0f, 1.5f, -2.0f}, {3});
    comm->sum_in_rank_order(sum);
    CHECK(mixprec_test::float_bits(sum) ==
          mixprec_test::float_bits(Tensor::from_vector({0.0f, 1.5f, -2.0f}, {3})));
    CHECK(comm->all_gather_int(7) == std::vector<int64_t>{7});
    CHECK(comm->broadcast_bytes({1, 2, 3}, 0) == std::vector<uint8_t>{1, 2, 3});
  }
}

TEST_CASE("make_communicator: one clear error for each backend it cannot give", "[dist]") {
  NotUnderMpirun clean;
  CHECK(error_message([] { dist::make_communicator("gloo", 300.0, kCPU); }) ==
        "distributed.backend: 'gloo' is not one of auto, none, mpi, nccl");
  CHECK(error_message([] { dist::make_communicator("nccl", 300.0, cuda_device(0)); }) ==
        "distributed.backend: nccl is not available in this build");
  CHECK(error_message([] { dist::make_communicator("nccl", 300.0, kCPU); }) ==
        "distributed.backend: nccl carries tensors on a GPU, and this run is on cpu; use "
        "backend mpi (or auto) for the CPU");
  CHECK(error_message([] { dist::make_communicator("mpi", 300.0, cuda_device(0)); }) ==
        "distributed.backend: mpi carries host tensors; a run on cuda:0 needs backend nccl");
  for (double bad : {0.0, -5.0, std::numeric_limits<double>::quiet_NaN()}) {
    CHECK_THROWS_WITH(dist::make_communicator("none", bad, kCPU),
                      Catch::StartsWith("distributed.timeout_s: must be a positive number"));
  }
  {
    // auto under mpirun asks for mpi, which carries no GPU tensors.
    ScopedEnv size("OMPI_COMM_WORLD_SIZE", "2");
    CHECK(error_message([] { dist::make_communicator("auto", 300.0, cuda_device(0)); }) ==
          "distributed.backend: mpi carries host tensors; a run on cuda:0 needs backend nccl");
  }
#if !MIXPREC_WITH_MPI
  const std::string no_mpi =
      "distributed.backend: mpi, but this build has no MPI (rebuild with Open MPI installed: "
      "scripts/setup.sh)";
  CHECK(error_message([] { dist::make_communicator("mpi", 300.0, kCPU); }) == no_mpi);
  ScopedEnv size("OMPI_COMM_WORLD_SIZE", "2");
  CHECK(error_message([] { dist::make_communicator("auto", 300.0, kCPU); }) == no_mpi);
#endif
}
