// The registry of cuDNN handles (see cudnn_handles.hpp).
#include "nn/cudnn/cudnn_handles.hpp"

#include <map>
#include <mutex>
#include <utility>

namespace quintet::nn::cudnn_backend {

void throw_cudnn_error(cudnnStatus_t status, const char* call) {
  char message[1024] = {0};
  cudnnGetLastErrorString(message, sizeof(message));
  QUINTET_THROW(Cuda, "{} failed: {} ({})", call, cudnnGetErrorString(status),
                message[0] != '\0' ? message : "no further message from cuDNN");
}

namespace {

using StreamKey = std::pair<int, cudaStream_t>;  // device, stream

// Process-wide and never destroyed (see the header).
struct Registry {
  std::mutex mutex;
  std::map<StreamKey, cudnnHandle_t> handles;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

cudnnHandle_t cudnn_handle(const Stream& stream) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const StreamKey key{stream.device().index(), stream.handle()};
  auto it = reg.handles.find(key);
  if (it != reg.handles.end()) return it->second;
  cudnnHandle_t h = nullptr;
  QUINTET_CUDNN_CHECK(cudnnCreate(&h));
  QUINTET_CUDNN_CHECK(cudnnSetStream(h, stream.handle()));
  return reg.handles.emplace(key, h).first->second;
}

}  // namespace quintet::nn::cudnn_backend
