// A run whose last rank never reaches a collective, for watchdog_abort.sh: under
// `mpirun -np 2` rank 0 waits in barrier #3 at step 7 while rank 1 sleeps for a minute, so the
// watchdog (2 s) must end both. Each rank first writes its pid into the folder argv[1], so that
// the script can check that no rank outlives mpirun.
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "dist/communicator.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto comm = mixprec::dist::make_communicator("mpi", 2.0, mixprec::kCPU);
  std::ofstream(std::string(argv[1]) + "/rank" + std::to_string(comm->rank()) + ".pid")
      << getpid() << "\n";
  comm->barrier();          // #1
  comm->all_gather_int(1);  // #2
  comm->set_step(7);
  if (comm->rank() == comm->size() - 1) std::this_thread::sleep_for(std::chrono::seconds(60));
  comm->barrier();  // #3
  return 0;
}
