#include "comm/launch.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "core/check.h"
#include "core/device.h"
#include "core/log.h"

namespace engine {

namespace {
LaunchInfo g_info;
bool g_initialised = false;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Launched by mpirun / a PMI launcher (OpenMPI, MPICH, Slurm)?
bool under_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}
}  // namespace

const LaunchInfo& launch_init(int* argc, char*** argv) {
  if (g_initialised) return g_info;
  g_initialised = true;
  if (!under_launcher()) return g_info;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  g_info.mpi = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_info.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_info.world_size);
  g_info.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", env_int("SLURM_LOCALID", -1)));
  if (g_info.local_rank < 0) {  // ask MPI: ranks sharing this node's memory
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_info.rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_info.local_rank);
    MPI_Comm_free(&node);
  }
  // Errors come back as codes and become engine::Error (then fatal_error), never a silent abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  // Each rank's GPU is its local rank (before anything touches a GPU: NCCL needs one per rank).
  if (const int gpus = device::count(); gpus > 0) device::select(g_info.local_rank % gpus);
  log_set_rank(g_info.rank, g_info.world_size);
  return g_info;
}

const LaunchInfo& launch_info() { return g_info; }

void launch_finalize() {
  int finalized = 0;
  if (g_info.mpi) {
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void fatal_error(const std::string& message, int code) {
  if (g_info.world_size > 1)
    std::fprintf(stderr, "error: [rank %d] %s\n", g_info.rank, message.c_str());
  else
    std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (g_info.mpi && g_info.world_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  launch_finalize();
  std::exit(code);
}

}  // namespace engine
