// The MPI communicator: the ranks of MPI_COMM_WORLD (on a duplicate of it, so that two
// communicators never see each other's messages), collectives on host tensors.
//
// Every collective first checks, in one small all-reduce, that every rank called the same
// operation with the same dtype, numel (not for all_gather), root and device, and throws the
// same mixprec::Error on every rank when they differ; a rank that calls none at all is the
// watchdog's case. Counts travel as MPI ints: a tensor of more than 2^31 - 1 - size()
// elements throws. Only built with MIXPREC_WITH_MPI.
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace mixprec::dist {

// Initialises MPI on first use (dist/mpi_session.h). Called by every rank, like a collective.
std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s);

}  // namespace mixprec::dist
