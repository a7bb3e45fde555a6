// MPI's life in a process: initialised once, by the first MPI communicator, and finalised when
// the process exits normally (a static object's destructor).
#pragma once

namespace mixprec::dist {

// Calls MPI_Init_thread on the first call, asking for MPI_THREAD_MULTIPLE: the watchdog's
// thread calls MPI_Abort while the main thread waits in a collective. Throws mixprec::Error
// when MPI cannot give that level.
void init_mpi_once();

}  // namespace mixprec::dist
