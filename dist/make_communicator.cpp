// launched_by_mpirun() and make_communicator(): which communicator a run gets.
//
// Without mpirun, "mpi" gives the one-process communicator (backend() "none"): Open MPI could
// run the process as a singleton rank, but only by starting a daemon, for nothing a run of
// one rank needs.
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "dist/communicator.h"
#if MIXPREC_WITH_MPI
#include <mpi.h>

#include "dist/mpi_communicator.h"
#endif

namespace mixprec::dist {
namespace {

std::unique_ptr<Communicator> make_mpi(double timeout_s, Device device) {
  MIXPREC_CHECK(device.is_cpu(), "distributed.backend: mpi carries host tensors; a run on ",
                device.str(), " needs backend nccl");
#if MIXPREC_WITH_MPI
  if (!launched_by_mpirun()) return make_single_process();
  return make_mpi_communicator(timeout_s);
#else
  (void)timeout_s;
  MIXPREC_FAIL(
      "distributed.backend: mpi, but this build has no MPI (rebuild with Open MPI "
      "installed: scripts/setup.sh)");
#endif
}

// NCCL's communicator (tensors on the GPU, MPI for the ranks' start-up) belongs here, built
// with the CUDA backend; this build has none.
std::unique_ptr<Communicator> make_nccl(double, Device device) {
  MIXPREC_CHECK(!device.is_cpu(), "distributed.backend: nccl carries tensors on a GPU, and this "
                "run is on ", device.str(), "; use backend mpi (or auto) for the CPU");
  MIXPREC_FAIL("distributed.backend: nccl is not available in this build");
}

}  // namespace

bool launched_by_mpirun() {
  // Open MPI's mpirun sets OMPI_COMM_WORLD_*; PMIx launchers (also Open MPI's) set PMIX_RANK.
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
         std::getenv("OMPI_COMM_WORLD_RANK") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

void end_every_rank(int code) {
#if MIXPREC_WITH_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, double timeout_s,
                                                Device device) {
  MIXPREC_CHECK(std::isfinite(timeout_s) && timeout_s > 0,
                "distributed.timeout_s: must be a positive number of seconds, got ", timeout_s);
  if (backend == "none") return make_single_process();
  if (backend == "mpi") return make_mpi(timeout_s, device);
  if (backend == "nccl") return make_nccl(timeout_s, device);
  MIXPREC_CHECK(backend == "auto", "distributed.backend: '", backend,
                "' is not one of auto, none, mpi, nccl");
  // auto: mpi under mpirun (which says why when this build or the device cannot have it), as
  // N separate runs of one rank each would silently train N copies of the model.
  if (launched_by_mpirun()) return make_mpi(timeout_s, device);
  return make_single_process();
}

}  // namespace mixprec::dist
