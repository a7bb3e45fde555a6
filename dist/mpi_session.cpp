#include "dist/mpi_session.h"

#include <mpi.h>

#include "core/error.h"

namespace mixprec::dist {
namespace {

struct Session {
  Session() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) return;  // initialised by the program itself, which then finalises it
    int provided = MPI_THREAD_SINGLE;
    MIXPREC_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS,
                  "distributed.backend: mpi, but MPI_Init_thread failed");
    owned = true;
    MIXPREC_CHECK(provided == MPI_THREAD_MULTIPLE,
                  "distributed.backend: mpi needs an MPI library with MPI_THREAD_MULTIPLE (the "
                  "collective watchdog aborts from its own thread); this one gives level ",
                  provided);
  }
  ~Session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized) MPI_Finalize();
  }
  bool owned = false;
};

}  // namespace

void init_mpi_once() { static Session session; }

}  // namespace mixprec::dist
