// Process start-up and shutdown. Under mpirun (OpenMPI or any PMI launcher) MPI is initialised
// and rank, world size and local rank come from it; a plain `./train` is one process without
// MPI. Each rank's GPU is its local rank. fatal_error() ends every rank promptly: it prints the
// message once (from the rank that failed) and calls MPI_Abort, so no rank waits forever in a
// collective for a peer that died.
#pragma once
#include <string>

namespace engine {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  bool mpi = false;  // MPI initialised (launched by mpirun)
};

// Idempotent. Reads the launcher's environment; initialises MPI when launched by one, and
// selects the rank's GPU (local rank modulo the visible GPUs).
const LaunchInfo& launch_init(int* argc, char*** argv);
const LaunchInfo& launch_info();
// Normal shutdown (MPI_Finalize when MPI was initialised).
void launch_finalize();
// Prints "error: <message>" on stderr (prefixed by the rank in multi-rank runs) and ends every
// rank with exit code `code` (MPI_Abort); never returns.
[[noreturn]] void fatal_error(const std::string& message, int code = 1);

}  // namespace engine
