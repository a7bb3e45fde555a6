// What each process of `mpirun -np N mixprec ...` prints. Rank 0 prints as one process does;
// the other ranks print only errors, each line prefixed "rank R: ". Until setup is done
// (config, data, model and the ranks joined) every rank meets the same errors, so only rank
// 0 reports those and the others exit with the same code in silence.
#pragma once

#include <string>

namespace mixprec {

// This process's rank as the launcher's environment gives it (Open MPI's
// OMPI_COMM_WORLD_RANK, or PMIx's PMIX_RANK); 0 without mpirun.
int launcher_rank();
// The job's rank count from the same environment (OMPI_COMM_WORLD_SIZE); 1 without mpirun.
int launcher_size();

// Called once the ranks have joined and set up; errors after it are this rank's own.
void mark_setup_done();
bool setup_done();

// Whether this process reports an error now, and the prefix of its lines ("" for rank 0).
bool reports_errors();
std::string error_prefix();

}  // namespace mixprec
