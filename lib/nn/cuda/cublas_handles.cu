// The registry of cuBLAS / cuBLASLt handles and workspaces (see cublas_handles.hpp).
#include "nn/cuda/cublas_handles.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "quintet/core/allocator.hpp"

namespace quintet::nn::cuda_ops::detail {

namespace {

using StreamKey = std::pair<int, cudaStream_t>;  // device, stream

// Process-wide and never destroyed (see the header).
struct Registry {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> lt_handles;             // by device
  std::map<StreamKey, std::shared_ptr<void>> workspaces;  // by device, stream
  std::map<StreamKey, cublasHandle_t> handles;            // by device, stream
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

StreamKey key_of(const Stream& stream) { return {stream.device().index(), stream.handle()}; }

// The caller holds reg.mutex.
void* workspace_locked(Registry& reg, const Stream& stream) {
  auto it = reg.workspaces.find(key_of(stream));
  if (it == reg.workspaces.end()) {
    it = reg.workspaces
             .emplace(key_of(stream), cuda_allocate(kCublasWorkspaceBytes, stream.device(), stream))
             .first;
  }
  return it->second.get();
}

}  // namespace

cublasHandle_t cublas_handle(const Stream& stream) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.handles.find(key_of(stream));
  if (it != reg.handles.end()) return it->second;
  void* const workspace = workspace_locked(reg, stream);
  cublasHandle_t h = nullptr;
  QUINTET_CUBLAS_CHECK(cublasCreate(&h));
  // SetStream resets the workspace to cuBLAS's own pool: set ours after it.
  QUINTET_CUBLAS_CHECK(cublasSetStream(h, stream.handle()));
  QUINTET_CUBLAS_CHECK(cublasSetWorkspace(h, workspace, kCublasWorkspaceBytes));
  return reg.handles.emplace(key_of(stream), h).first->second;
}

cublasLtHandle_t cublaslt_handle(const Stream& stream) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const int device = stream.device().index();
  auto it = reg.lt_handles.find(device);
  if (it != reg.lt_handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  QUINTET_CUBLAS_CHECK(cublasLtCreate(&h));
  return reg.lt_handles.emplace(device, h).first->second;
}

void* cublas_workspace(const Stream& stream) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  return workspace_locked(reg, stream);
}

}  // namespace quintet::nn::cuda_ops::detail
