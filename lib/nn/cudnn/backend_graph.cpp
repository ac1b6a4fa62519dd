// The cuDNN backend-API layer (see backend_graph.hpp).
#include "nn/cudnn/backend_graph.hpp"

#include <string>

#include "nn/cudnn/cudnn_handles.hpp"
#include "quintet/core/error.hpp"

// The execution plan's and the operation graph's handle attributes are marked deprecated in
// cuDNN 9.19 (in favour of device-property descriptors that 9.14 lacks); both still work.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace quintet::nn::cudnn_backend {

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  QUINTET_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
}

Descriptor::~Descriptor() {
  if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(other.d_, nullptr);
  }
  return *this;
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            std::int64_t count, const void* values) {
  QUINTET_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  return *this;
}

Descriptor& Descriptor::set_int64(cudnnBackendAttributeName_t name, std::int64_t value) {
  return set(name, CUDNN_TYPE_INT64, 1, &value);
}

Descriptor& Descriptor::set_int64s(cudnnBackendAttributeName_t name,
                                   const std::vector<std::int64_t>& v) {
  return set(name, CUDNN_TYPE_INT64, static_cast<std::int64_t>(v.size()), v.data());
}

Descriptor& Descriptor::set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
  return set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
}

Descriptor& Descriptor::set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}

void Descriptor::finalize() { QUINTET_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

void ExecutionPlan::execute(cudnnHandle_t handle,
                            const std::vector<std::pair<std::int64_t, void*>>& uid_ptrs,
                            void* workspace) const {
  std::vector<std::int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [uid, ptr] : uid_ptrs) {
    uids.push_back(uid);
    ptrs.push_back(ptr);
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set_int64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<std::int64_t>(ptrs.size()), ptrs.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  QUINTET_CUDNN_CHECK(cudnnBackendExecute(handle, owned_.back().get(), pack.get()));
}

Graph::Tensor Graph::keep(Descriptor d) {
  owned_.push_back(std::move(d));
  return owned_.back().get();
}

Graph::Tensor Graph::tensor(std::int64_t uid, cudnnDataType_t dtype,
                            const std::vector<std::int64_t>& dims,
                            const std::vector<std::int64_t>& strides, bool by_value) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)
      .set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
  if (by_value) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  t.finalize();
  return keep(std::move(t));
}

Graph::Tensor Graph::virtual_tensor(cudnnDataType_t dtype, const std::vector<std::int64_t>& dims,
                                    const std::vector<std::int64_t>& strides) {
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const bool yes = true;
  t.set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, dtype)
      .set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, next_virtual_uid_++)
      .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
  t.finalize();
  return keep(std::move(t));
}

void Graph::pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t compute, Tensor x, Tensor b,
                      Tensor t, Tensor y, std::int64_t axis) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, compute);
  if (axis >= 0) pw.set_int64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get())
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  op.finalize();
  keep(std::move(pw));
  ops_.push_back(keep(std::move(op)));
}

void Graph::matmul(Tensor a, Tensor b, Tensor c, Tensor m_override, Tensor n_override,
                   Tensor k_override) {
  Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  mm.set_dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT);
  mm.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
  if (m_override != nullptr)
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m_override);
  if (n_override != nullptr)
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n_override);
  if (k_override != nullptr)
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k_override);
  op.finalize();
  keep(std::move(mm));
  ops_.push_back(keep(std::move(op)));
}

void Graph::reduction(cudnnReduceTensorOp_t reduce, Tensor x, Tensor y) {
  Descriptor red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce)
      .set_dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT);
  red.finalize();
  Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get());
  op.finalize();
  keep(std::move(red));
  ops_.push_back(keep(std::move(op)));
}

void Graph::reshape(Tensor x, Tensor y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x)
      .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
  op.finalize();
  ops_.push_back(keep(std::move(op)));
}

ExecutionPlan Graph::build(cudnnHandle_t handle) {
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
            static_cast<std::int64_t>(ops_.size()), ops_.data());
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  graph.finalize();

  std::string complaints;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get())
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) continue;
    std::int64_t count = 0;
    if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr) != CUDNN_STATUS_SUCCESS ||
        count <= 0) {
      continue;
    }
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    std::int64_t returned = 0;
    if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                 raw.data()) != CUDNN_STATUS_SUCCESS) {
      continue;
    }
    for (std::int64_t i = 0; i < returned; ++i) {
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
          .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i]);
      const cudnnStatus_t status = cudnnBackendFinalize(plan.get());
      if (status != CUDNN_STATUS_SUCCESS) {
        char message[512] = {0};
        cudnnGetLastErrorString(message, sizeof(message));
        complaints = std::string(cudnnGetErrorString(status)) + ": " + message;
        continue;
      }
      std::int64_t workspace = 0, n = 0;
      QUINTET_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(),
                                                   CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                   CUDNN_TYPE_INT64, 1, &n, &workspace));
      std::vector<Descriptor> owned = std::move(owned_);
      owned.push_back(std::move(graph));
      owned.push_back(std::move(heur));
      for (Descriptor& c : configs) owned.push_back(std::move(c));
      owned.push_back(std::move(plan));  // last: execute() runs owned_.back()
      return ExecutionPlan(std::move(owned), workspace);
    }
  }
  QUINTET_THROW(Cuda, "cuDNN has no engine for this operation graph ({} ops){}{}", ops_.size(),
                complaints.empty() ? "" : "; the last engine tried said ", complaints);
}

}  // namespace quintet::nn::cudnn_backend
