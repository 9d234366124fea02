// Communication between the ranks of one process group, on tensors:
//   all_reduce      t = sum (or max) over ranks of t, in place
//   reduce          root's t = sum over ranks of t, in place; t on the other ranks is left
//                   unspecified (ZeRO: each gradient range summed only on the rank that owns it)
//   reduce_scatter  out (n) = rank's slice [rank*n, (rank+1)*n) of the sum over ranks of in (size*n)
//   all_gather      out (size*n) = concatenation of every rank's in (n), in rank order; `in` may
//                   be this rank's own slice of `out` (in place)
//   broadcast       t = root's t
//   send / recv     point to point, matched in program order (per tag); send_async + wait_sends
// Two backends behind one interface: MPI (host tensors; CPU runs and CI) and NCCL (device
// tensors, its own stream ordered after the compute stream). Groups for the dp, tp and pp
// dimensions of the mesh come from Comm::split. A group of one rank is valid and does nothing.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace engine {

enum class ReduceOp { Sum, Max };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;

  virtual void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // A sum all-reduce that may still run when it returns (device backends: on the comm stream,
  // overlapping the compute queued after it); wait_async() orders later compute after every
  // pending one. Host backends complete it at once.
  virtual void all_reduce_async(const Tensor& t) { all_reduce(t, ReduceOp::Sum); }
  virtual void wait_async() {}
  virtual void reduce(const Tensor& t, int root) = 0;
  // A sum reduce that may still run when it returns, as all_reduce_async (same wait_async()).
  virtual void reduce_async(const Tensor& t, int root) { reduce(t, root); }
  virtual void reduce_scatter(const Tensor& in, const Tensor& out) = 0;
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // reduce_scatter and all_gather that may still run when they return, as all_reduce_async
  // (tensor parallelism: paired with fence(), they run beside the GEMMs queued after them).
  virtual void reduce_scatter_async(const Tensor& in, const Tensor& out) { reduce_scatter(in, out); }
  virtual void all_gather_async(const Tensor& in, const Tensor& out) { all_gather(in, out); }
  virtual void broadcast(const Tensor& t, int root) = 0;
  // A broadcast that may still run when it returns, as all_reduce_async (same wait_async()).
  virtual void broadcast_async(const Tensor& t, int root) { broadcast(t, root); }
  // A marker after every operation issued so far: calling it orders the compute issued after
  // the call after those operations (one of them, unlike wait_async(), which waits for all that
  // are pending when it is called). Host backends complete operations when issued: none
  // (an empty function).
  virtual std::function<void()> fence() { return {}; }
  // `tag` tells messages between the same two ranks apart (MPI matches on it; NCCL ignores it:
  // its messages match in order).
  virtual void send(const Tensor& t, int peer, int tag = 0) = 0;
  virtual void recv(const Tensor& t, int peer, int tag = 0) = 0;
  // A send that returns at once; `t` must stay unchanged and alive until wait_sends(), and later
  // compute is not ordered after it (pipelines: a rank never waits for a peer to take its data).
  virtual void send_async(const Tensor& t, int peer, int tag = 0) { send(t, peer, tag); }
  virtual void wait_sends() {}
  virtual void barrier() = 0;

  // Ranks with equal `color` form a new group, ordered by `key` (MPI_Comm_split semantics).
  virtual std::unique_ptr<Comm> split(int color, int key) const = 0;

  // Scalar helpers on host values (device backends route them through their host group).
  virtual double all_reduce_sum(double v);
  virtual int64_t all_reduce_sum(int64_t v);
  virtual double all_reduce_max(double v);
};

// Every rank's bytes, in rank order (collective; strings of any lengths, staged in device memory
// for device backends): checkpoint tables, the ranks' agreement at start.
std::vector<std::string> all_gather_strings(Comm& comm, const std::string& mine);

// The group of every process (MPI_COMM_WORLD, or a single-process group without MPI).
Comm& world();

}  // namespace engine
