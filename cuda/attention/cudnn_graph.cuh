// cuDNN's backend API as the attention backend uses it (cudnn_sdpa.cu builds its graphs with
// it): status checks that name what was being built, one handle per device on the compute
// stream, and Graph, which owns the descriptors of one operation graph, finalizes it with the
// first engine configuration of the heuristics that builds, and executes it with a variant pack.
// Included only where ENGINE_CUDNN is defined.
#pragma once
#include <cudnn_graph.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"

namespace engine::cuda::cudnn {

using Dims = std::array<int64_t, 4>;
using Descriptor = cudnnBackendDescriptor_t;

// Raises engine::Error with the status string, cuDNN's last error message, context and what.
void check(cudnnStatus_t s, const std::string& context, const char* what);
// The loaded library's version, "major.minor.patch".
std::string version_string();
// One cuDNN handle per device, created on first use, set to the compute stream on every call.
cudnnHandle_t handle();

// Virtual tensors and by-value constants get ids from here on; the caller's bound tensors take
// fixed ids below it.
constexpr int64_t kFirstFreeUid = 100;

struct ByValue {
  int64_t uid;
  alignas(8) unsigned char bytes[8];
};

class Graph {
 public:
  explicit Graph(std::string context) : context_(std::move(context)) {}
  ~Graph() {
    if (plan_) cudnnBackendDestroyDescriptor(plan_);
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Descriptor make(cudnnBackendDescriptorType_t type, const char* what) {
    Descriptor d = nullptr;
    check(cudnnBackendCreateDescriptor(type, &d), context_, what);
    owned_.push_back(d);
    return d;
  }
  void set(Descriptor d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* value, const char* what) {
    check(cudnnBackendSetAttribute(d, name, type, count, value), context_, what);
  }
  void finalize(Descriptor d, const char* what) { check(cudnnBackendFinalize(d), context_, what); }

  // A tensor of 4 dims; uid < 0: virtual with a fresh id.
  Descriptor tensor(cudnnDataType_t dtype, const Dims& dims, const Dims& strides, int64_t uid = -1,
                    Descriptor ragged = nullptr, bool by_value = false) {
    const bool is_virtual = uid < 0 && !by_value;
    if (uid < 0) uid = next_uid_++;
    Descriptor t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    const int64_t alignment = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype, "tensor data type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dimensions");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
    if (is_virtual) {
      const bool yes = true;
      set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes, "virtual tensor");
    }
    if (by_value) {
      const bool yes = true;
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes, "by-value tensor");
    }
    if (ragged)
      set(t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ragged,
          "ragged offset of a tensor");
    finalize(t, "tensor descriptor");
    return t;
  }
  Descriptor virt(cudnnDataType_t dtype, const Dims& dims, const Dims& strides, Descriptor ragged = nullptr) {
    return tensor(dtype, dims, strides, -1, ragged);
  }
  template <typename T>
  Descriptor constant(T value, cudnnDataType_t dtype) {
    static_assert(sizeof(T) <= 8);
    ByValue& v = values_.emplace_back();
    v.uid = next_uid_++;
    std::memcpy(v.bytes, &value, sizeof(T));
    return tensor(dtype, {1, 1, 1, 1}, {1, 1, 1, 1}, v.uid, nullptr, true);
  }

  // y = mode(x[, b][, t]) with the given compute type (gen_index: axis).
  void pointwise(cudnnPointwiseMode_t mode, Descriptor x, Descriptor b, Descriptor t, Descriptor y,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Descriptor pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, "pointwise precision");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finalize(pw, "pointwise descriptor");
    Descriptor op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw,
        "pointwise operation");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
    finalize(op, "pointwise operation");
    ops_.push_back(op);
  }
  // c = a @ b, f32 accumulation; the overrides bound m, n, k per batch (the sequence lengths).
  void matmul(Descriptor a, Descriptor b, Descriptor c, Descriptor m_override, Descriptor n_override,
              Descriptor k_override) {
    Descriptor mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul precision");
    finalize(mm, "matmul descriptor");
    Descriptor op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul descriptor");
    if (m_override)
      set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
          &m_override, "matmul m override");
    if (n_override)
      set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
          &n_override, "matmul n override");
    if (k_override)
      set(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
          &k_override, "matmul k override");
    finalize(op, "matmul operation");
    ops_.push_back(op);
  }
  void reduction(cudnnReduceTensorOp_t mode, Descriptor x, Descriptor y) {
    Descriptor r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode");
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction precision");
    finalize(r, "reduction descriptor");
    Descriptor op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, "reduction descriptor");
    finalize(op, "reduction operation");
    ops_.push_back(op);
  }
  void reshape(Descriptor x, Descriptor y) {
    Descriptor op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
    finalize(op, "reshape operation");
    ops_.push_back(op);
  }

  // The operation graph, the heuristics' engine configurations and the first of them that
  // finalizes into an execution plan.
  void build(cudnnHandle_t h) {
    Descriptor graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    // CUDNN_ATTR_OPERATIONGRAPH_HANDLE (deprecated name, still read by cuDNN 9).
    set(graph, static_cast<cudnnBackendAttributeName_t>(800), CUDNN_TYPE_HANDLE, 1, &h, "graph handle");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops_.size()), ops_.data(), "graph operations");
    finalize(graph, "operation graph");
    Descriptor heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph,
        "heuristics graph");
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    finalize(heur, "engine heuristics (no engine takes this graph)");
    int64_t count = 0;
    check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                   &count, nullptr),
          context_, "heuristics result count");
    ENSURE(count > 0, "cuDNN attention (model.attention_backend = \"cudnn\"): ", context_,
           ": the heuristics offer no engine for this graph (cuDNN ", version_string(), ")");
    std::vector<Descriptor> configs;
    for (int64_t i = 0; i < count; ++i) configs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
    int64_t got = 0;
    check(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &got, configs.data()),
          context_, "heuristics results");
    std::string failures;
    for (int64_t i = 0; i < got; ++i) {
      Descriptor plan = nullptr;
      check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan), context_,
            "execution plan");
      cudnnStatus_t s = cudnnBackendSetAttribute(plan, static_cast<cudnnBackendAttributeName_t>(400),
                                                 CUDNN_TYPE_HANDLE, 1, &h);  // EXECUTION_PLAN_HANDLE
      if (s == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]);
      if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(plan);
      if (s == CUDNN_STATUS_SUCCESS) {
        plan_ = plan;
        check(cudnnBackendGetAttribute(plan_, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                       &got, &workspace_),
              context_, "plan workspace size");
        return;
      }
      char last[512] = {0};
      cudnnGetLastErrorString(last, sizeof last);
      failures += str_cat("; config ", i, ": ", cudnnGetErrorString(s), last[0] ? " " : "", last);
      cudnnBackendDestroyDescriptor(plan);
    }
    RAISE("cuDNN attention (model.attention_backend = \"cudnn\"): ", context_, ": none of the ", got,
          " engine configs finalizes (cuDNN ", version_string(), ")", failures);
  }

  // Runs the plan: `bound` maps the caller's tensor ids to device pointers.
  void execute(cudnnHandle_t h, const std::vector<std::pair<int64_t, void*>>& bound, void* workspace) {
    std::vector<int64_t> uids;
    std::vector<void*> ptrs;
    for (const auto& [uid, ptr] : bound) uids.push_back(uid), ptrs.push_back(ptr);
    for (ByValue& v : values_) uids.push_back(v.uid), ptrs.push_back(v.bytes);
    Descriptor pack = nullptr;
    check(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), context_, "variant pack");
    struct Destroy {
      Descriptor d;
      ~Destroy() { cudnnBackendDestroyDescriptor(d); }
    } destroy{pack};
    const int64_t n = static_cast<int64_t>(uids.size());
    check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data()),
          context_, "variant pack ids");
    check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                                   ptrs.data()),
          context_, "variant pack pointers");
    check(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace),
          context_, "variant pack workspace");
    check(cudnnBackendFinalize(pack), context_, "variant pack");
    check(cudnnBackendExecute(h, plan_, pack), context_, "execute");
  }

  int64_t workspace() const { return workspace_; }

 private:
  std::string context_;
  std::vector<Descriptor> owned_;
  std::vector<Descriptor> ops_;
  std::deque<ByValue> values_;  // stable addresses for the variant pack
  int64_t next_uid_ = kFirstFreeUid;
  Descriptor plan_ = nullptr;
  int64_t workspace_ = 0;
};

}  // namespace engine::cuda::cudnn
