// Private: a small C++ layer over cuDNN's backend (graph) API, enough to describe an operation
// graph of tensors, matmuls, pointwise ops, reductions and reshapes, let cuDNN's heuristics pick
// an engine, and run the resulting execution plan. Used by attention_cudnn.cpp.
//
//   Graph g;
//   auto* a = g.tensor(kA, CUDNN_DATA_BFLOAT16, {b, m, k}, {m * k, k, 1});   // bound at run time
//   auto* c = g.virtual_tensor(CUDNN_DATA_FLOAT, {b, m, n}, {m * n, n, 1});  // stays inside
//   g.matmul(a, bt, c);
//   ExecutionPlan plan = g.build(handle);      // throws if no engine supports the graph
//   plan.execute(handle, {{kA, ptr_a}, ...}, workspace);
//
// Descriptors are RAII (Descriptor); a Graph owns every descriptor it made and an ExecutionPlan
// takes them over, so the plan stays valid on its own. Not thread-safe: one thread builds a graph;
// a finished plan may be executed from any thread (one execution at a time per handle).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace quintet::nn::cudnn_backend {

// One cuDNN backend descriptor, destroyed with this object. Move-only.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  // cudnnBackendSetAttribute; throws Cuda on failure.
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  std::int64_t count, const void* values);
  Descriptor& set_int64(cudnnBackendAttributeName_t name, std::int64_t value);
  Descriptor& set_int64s(cudnnBackendAttributeName_t name, const std::vector<std::int64_t>& v);
  Descriptor& set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t value);
  Descriptor& set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value);
  // cudnnBackendFinalize; throws Cuda on failure.
  void finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A finalized execution plan with everything it was built from.
class ExecutionPlan {
 public:
  ExecutionPlan(std::vector<Descriptor> owned, std::int64_t workspace_bytes)
      : owned_(std::move(owned)), workspace_bytes_(workspace_bytes) {}
  // Device memory the plan needs besides its tensors, in bytes.
  std::int64_t workspace_bytes() const { return workspace_bytes_; }
  // Runs the plan on handle's stream: uid_ptrs binds every non-virtual tensor's unique id to its
  // device memory (or, for a by-value tensor, to host memory holding the value); workspace has
  // workspace_bytes(). Queued, not waited for.
  void execute(cudnnHandle_t handle, const std::vector<std::pair<std::int64_t, void*>>& uid_ptrs,
               void* workspace) const;

 private:
  std::vector<Descriptor> owned_;  // tensors, ops, the graph, the engine config; the plan last
  std::int64_t workspace_bytes_;
};

// An operation graph being described. Tensors are [n-d] with explicit strides, in elements.
class Graph {
 public:
  using Tensor = cudnnBackendDescriptor_t;  // owned by the Graph

  // A tensor bound at execution time by uid (by_value: a scalar [1,...] read from host memory).
  Tensor tensor(std::int64_t uid, cudnnDataType_t dtype, const std::vector<std::int64_t>& dims,
                const std::vector<std::int64_t>& strides, bool by_value = false);
  // An intermediate tensor that never reaches memory; its uid is picked here.
  Tensor virtual_tensor(cudnnDataType_t dtype, const std::vector<std::int64_t>& dims,
                        const std::vector<std::int64_t>& strides);

  // y = op(x[, b[, t]]) element-wise with broadcasting; compute is the math precision. axis is
  // for GEN_INDEX (the dimension whose index is produced), -1 otherwise.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, Tensor x, Tensor b, Tensor t,
                 Tensor y, std::int64_t axis = -1);
  // c = a · b over the last two dims, batched over the leading ones; f32 accumulation. The
  // override tensors (or nullptr) give per-batch m, n, k limits.
  void matmul(Tensor a, Tensor b, Tensor c, Tensor m_override = nullptr,
              Tensor n_override = nullptr, Tensor k_override = nullptr);
  // y = reduce(x) over the dims where y has extent 1; f32.
  void reduction(cudnnReduceTensorOp_t op, Tensor x, Tensor y);
  // y = x seen with y's dims and strides (a transpose when the strides are swapped).
  void reshape(Tensor x, Tensor y);

  // The operation graph of every op added, and the first execution plan that cuDNN's heuristics
  // offer (mode A, then fallback) and that finalizes on handle. Throws Cuda (naming the last
  // engine's complaint) when no engine supports the graph. Consumes the graph.
  ExecutionPlan build(cudnnHandle_t handle);

 private:
  Tensor keep(Descriptor d);
  std::vector<Descriptor> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::int64_t next_virtual_uid_ = std::int64_t{1} << 40;
};

}  // namespace quintet::nn::cudnn_backend
