#include "comm/mpi_comm.h"

#include <algorithm>
#include <cstring>

#include "comm/launch.h"
#include "core/buffer.h"

namespace engine {

namespace {

constexpr int64_t kMaxCount = int64_t{1} << 30;

MPI_Datatype mpi_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    default: RAISE(op, ": the MPI backend does not carry ", dtype_name(t), " tensors");
  }
}

void check_host(const Tensor& t, const char* op) {
  ENSURE(t.device == Device::CPU, op, ": the MPI backend takes host tensors, got a ", device_name(t.device), " tensor");
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  RAISE(call, " failed: ", std::string(msg, static_cast<size_t>(len)));
}

char* bytes(const Tensor& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + elem_offset * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

void MpiComm::all_reduce(const Tensor& t, ReduceOp op) {
  check_host(t, "all_reduce");
  const MPI_Datatype type = mpi_type(t.dtype, "all_reduce");
  for (int64_t off = 0; off < t.numel(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - off));
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, bytes(t, off), n, type, op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_),
              "MPI_Allreduce");
  }
}

void MpiComm::reduce(const Tensor& t, int root) {
  check_host(t, "reduce");
  ENSURE(root >= 0 && root < size_, "reduce: root ", root, " in a group of ", size_);
  const MPI_Datatype type = mpi_type(t.dtype, "reduce");
  for (int64_t off = 0; off < t.numel(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - off));
    void* at = bytes(t, off);
    check_mpi(MPI_Reduce(rank_ == root ? MPI_IN_PLACE : at, rank_ == root ? at : nullptr, n, type, MPI_SUM, root, comm_),
              "MPI_Reduce");
  }
}

void MpiComm::reduce_scatter(const Tensor& in, const Tensor& out) {
  check_host(in, "reduce_scatter");
  check_host(out, "reduce_scatter");
  ENSURE(in.dtype == out.dtype, "reduce_scatter: in is ", dtype_name(in.dtype), ", out is ", dtype_name(out.dtype));
  ENSURE_EQ(in.numel(), out.numel() * size_, "reduce_scatter: in must hold size x out elements");
  const MPI_Datatype type = mpi_type(in.dtype, "reduce_scatter");
  const int64_t n = out.numel();
  if (n <= kMaxCount) {
    check_mpi(MPI_Reduce_scatter_block(in.data, out.data, static_cast<int>(n), type, MPI_SUM, comm_),
              "MPI_Reduce_scatter_block");
    return;
  }
  // Large shards: one reduce per destination rank, in chunks (a rare, slow path).
  for (int r = 0; r < size_; ++r)
    for (int64_t off = 0; off < n; off += kMaxCount) {
      const int c = static_cast<int>(std::min(kMaxCount, n - off));
      check_mpi(MPI_Reduce(bytes(in, r * n + off), r == rank_ ? bytes(out, off) : nullptr, c, type, MPI_SUM, r, comm_),
                "MPI_Reduce");
    }
}

void MpiComm::all_gather(const Tensor& in, const Tensor& out) {
  check_host(in, "all_gather");
  check_host(out, "all_gather");
  ENSURE(in.dtype == out.dtype, "all_gather: in is ", dtype_name(in.dtype), ", out is ", dtype_name(out.dtype));
  ENSURE_EQ(out.numel(), in.numel() * size_, "all_gather: out must hold size x in elements");
  const MPI_Datatype type = mpi_type(in.dtype, "all_gather");
  const int64_t n = in.numel();
  const bool in_place = in.data == bytes(out, rank_ * n);  // `in` is this rank's slice of `out`
  if (n <= kMaxCount) {
    check_mpi(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data, static_cast<int>(n), type, out.data,
                            static_cast<int>(n), type, comm_),
              "MPI_Allgather");
    return;
  }
  if (!in_place) copy_bytes(bytes(out, rank_ * n), Device::CPU, in.data, Device::CPU, in.nbytes());
  for (int r = 0; r < size_; ++r)
    for (int64_t off = 0; off < n; off += kMaxCount) {
      const int c = static_cast<int>(std::min(kMaxCount, n - off));
      check_mpi(MPI_Bcast(bytes(out, r * n + off), c, type, r, comm_), "MPI_Bcast");
    }
}

void MpiComm::broadcast(const Tensor& t, int root) {
  check_host(t, "broadcast");
  const MPI_Datatype type = mpi_type(t.dtype, "broadcast");
  for (int64_t off = 0; off < t.numel(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - off));
    check_mpi(MPI_Bcast(bytes(t, off), n, type, root, comm_), "MPI_Bcast");
  }
}

namespace {
int checked_tag(int tag) {
  static const int upper = [] {
    int* v = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
    return flag && v ? *v : 32767;
  }();
  ENSURE(tag >= 0 && tag <= upper, "MPI tag ", tag, " outside [0, ", upper, "]");
  return tag;
}
}  // namespace

void MpiComm::send(const Tensor& t, int peer, int tag) {
  check_host(t, "send");
  const MPI_Datatype type = mpi_type(t.dtype, "send");
  for (int64_t off = 0; off < t.numel(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - off));
    check_mpi(MPI_Send(bytes(t, off), n, type, peer, checked_tag(tag), comm_), "MPI_Send");
  }
}

void MpiComm::send_async(const Tensor& t, int peer, int tag) {
  check_host(t, "send_async");
  const MPI_Datatype type = mpi_type(t.dtype, "send_async");
  for (int64_t off = 0; off < t.numel(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - off));
    MPI_Request r;
    check_mpi(MPI_Isend(bytes(t, off), n, type, peer, checked_tag(tag), comm_, &r), "MPI_Isend");
    pending_.push_back(r);
  }
}

void MpiComm::wait_sends() {
  if (pending_.empty()) return;
  check_mpi(MPI_Waitall(static_cast<int>(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  pending_.clear();
}

void MpiComm::recv(const Tensor& t, int peer, int tag) {
  check_host(t, "recv");
  const MPI_Datatype type = mpi_type(t.dtype, "recv");
  for (int64_t off = 0; off < t.numel(); off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, t.numel() - off));
    check_mpi(MPI_Recv(bytes(t, off), n, type, peer, checked_tag(tag), comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }
}

void MpiComm::barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

std::unique_ptr<Comm> MpiComm::split(int color, int key) const {
  MPI_Comm sub;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  return std::make_unique<MpiComm>(sub, true);
}

void SelfComm::reduce(const Tensor&, int root) { ENSURE(root == 0, "reduce to rank ", root, " in a group of one"); }
void SelfComm::reduce_scatter(const Tensor& in, const Tensor& out) {
  if (in.data != out.data) copy_tensor(out, in);
}
void SelfComm::all_gather(const Tensor& in, const Tensor& out) {
  if (in.data != out.data) copy_tensor(out, in);
}
void SelfComm::broadcast(const Tensor&, int root) { ENSURE(root == 0, "broadcast from rank ", root, " in a group of one"); }
void SelfComm::send(const Tensor&, int peer, int) { RAISE("send to rank ", peer, " in a group of one"); }
void SelfComm::recv(const Tensor&, int peer, int) { RAISE("recv from rank ", peer, " in a group of one"); }

double Comm::all_reduce_sum(double v) {
  Tensor t(&v, DType::F64, Device::CPU, {1});
  all_reduce(t, ReduceOp::Sum);
  return v;
}

int64_t Comm::all_reduce_sum(int64_t v) {
  Tensor t(&v, DType::I64, Device::CPU, {1});
  all_reduce(t, ReduceOp::Sum);
  return v;
}

double Comm::all_reduce_max(double v) {
  Tensor t(&v, DType::F64, Device::CPU, {1});
  all_reduce(t, ReduceOp::Max);
  return v;
}

std::vector<std::string> all_gather_strings(Comm& comm, const std::string& mine) {
  const int n = comm.size();
  const auto longest = static_cast<int64_t>(comm.all_reduce_max(static_cast<double>(mine.size())));
  const int64_t slot = 8 + longest;  // length, then the bytes
  std::vector<unsigned char> host(static_cast<size_t>(slot * n), 0);
  const auto len = static_cast<int64_t>(mine.size());
  std::memcpy(host.data(), &len, 8);
  std::memcpy(host.data() + 8, mine.data(), mine.size());
  const Device dev = std::string(comm.backend()) == "nccl" ? Device::CUDA : Device::CPU;
  Owned in = empty({slot}, DType::U8, dev), out = empty({slot * n}, DType::U8, dev);
  copy_bytes(in.t.data, dev, host.data(), Device::CPU, static_cast<size_t>(slot));
  comm.all_gather(in.t, out.t);
  copy_bytes(host.data(), Device::CPU, out.t.data, dev, host.size());
  std::vector<std::string> all(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const unsigned char* at = host.data() + r * slot;
    int64_t m = 0;
    std::memcpy(&m, at, 8);
    ENSURE(m >= 0 && m <= longest, "all_gather_strings: rank ", r, " sent ", m, " bytes");
    all[static_cast<size_t>(r)].assign(reinterpret_cast<const char*>(at + 8), static_cast<size_t>(m));
  }
  return all;
}

Comm& world() {
  static std::unique_ptr<Comm> w = [] {
    const LaunchInfo& info = launch_info();
    if (info.mpi) return std::unique_ptr<Comm>(std::make_unique<MpiComm>(MPI_COMM_WORLD, false));
    return std::unique_ptr<Comm>(std::make_unique<SelfComm>());
  }();
  return *w;
}

}  // namespace engine
