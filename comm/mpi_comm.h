// MPI backend of Comm: host (CPU) tensors of f32, f64, i32, i64 or u8; used by CPU runs and CI.
// Counts above 2^30 elements are sent in chunks (MPI counts are int).
#pragma once
#include <mpi.h>

#include <vector>

#include "comm/comm.h"

namespace engine {

class MpiComm final : public Comm {
 public:
  explicit MpiComm(MPI_Comm comm, bool owned);
  ~MpiComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  void all_reduce(const Tensor& t, ReduceOp op) override;
  void reduce(const Tensor& t, int root) override;
  void reduce_scatter(const Tensor& in, const Tensor& out) override;
  void all_gather(const Tensor& in, const Tensor& out) override;
  void broadcast(const Tensor& t, int root) override;
  void send(const Tensor& t, int peer, int tag = 0) override;
  void recv(const Tensor& t, int peer, int tag = 0) override;
  void send_async(const Tensor& t, int peer, int tag = 0) override;
  void wait_sends() override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) const override;

 private:
  MPI_Comm comm_;
  std::vector<MPI_Request> pending_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

// A group of one process (no MPI): collectives are copies or no-ops.
class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "self"; }
  void all_reduce(const Tensor&, ReduceOp) override {}
  void reduce(const Tensor&, int root) override;
  void reduce_scatter(const Tensor& in, const Tensor& out) override;
  void all_gather(const Tensor& in, const Tensor& out) override;
  void broadcast(const Tensor&, int root) override;
  void send(const Tensor&, int peer, int tag = 0) override;
  void recv(const Tensor&, int peer, int tag = 0) override;
  void barrier() override {}
  std::unique_ptr<Comm> split(int, int) const override { return std::make_unique<SelfComm>(); }
};

}  // namespace engine
