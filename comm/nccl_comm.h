// NCCL backend of Comm: device (CUDA) tensors of f32, bf16, f64, i32, i64 or u8, on a
// communication stream of its own. Each collective first waits for the work queued so far on the
// compute stream (an event), and the compute stream then waits for the collective (the *_async
// ones: only once a fence() or wait_async() says so), so kernels before and after see consistent
// data; host-side scalar helpers go through the MPI group the NCCL communicator was built from.
// The unique id is made by the group's rank 0 and broadcast over MPI.
#pragma once
#include <memory>

#include "comm/comm.h"

namespace engine {

// A device communicator over the ranks of `host_group` (an MPI group; every rank calls this).
// Returns nullptr in builds without CUDA.
std::unique_ptr<Comm> make_nccl_comm(const Comm& host_group);

}  // namespace engine
