#include "quintet/core/device.hpp"

#include <cctype>
#include <charconv>

#include "quintet/core/config.hpp"
#include "quintet/core/device_guard.hpp"
#include "quintet/core/error.hpp"
#if QUINTET_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace quintet {

Device Device::cuda(int index) {
  QUINTET_CHECK(index >= 0, "Device::cuda({}): a GPU index must be >= 0", index);
  return Device(DeviceKind::cuda, index);
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  if (text.starts_with("cuda:")) {
    const std::string_view num = text.substr(5);
    int index = -1;
    const auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && ptr == num.data() + num.size() && index >= 0) return cuda(index);
  }
  QUINTET_THROW(InvalidArgument, "unknown device '{}': expected cpu, cuda or cuda:N", text);
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index_);
}

int cuda_device_count() {
#if QUINTET_HAS_CUDA
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no GPU: clear the sticky error, report none
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

void check_device(const Device& device) {
  if (device.is_cpu()) return;
  const int n = cuda_device_count();
  QUINTET_CHECK(device.index() < n,
                "device {} is out of range: {} CUDA GPU(s) visible{}; use cpu or cuda:0..cuda:{}",
                device.str(), n, QUINTET_HAS_CUDA ? "" : " (Quintet built without CUDA)",
                n > 0 ? n - 1 : 0);
}

void set_current_device(const Device& device) {
  if (device.is_cpu()) return;
  check_device(device);
#if QUINTET_HAS_CUDA
  QUINTET_CUDA_CHECK(cudaSetDevice(device.index()));
#endif
}

std::string pci_bus_id(const Device& device) {
  if (device.is_cpu()) return std::string();
  check_device(device);
#if QUINTET_HAS_CUDA
  char id[64] = {};
  QUINTET_CUDA_CHECK(cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof(id)), device.index()));
  std::string out(id);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
#else
  return std::string();  // not reached: check_device finds no GPU without CUDA
#endif
}

DeviceGuard::DeviceGuard(const Device& device) {
#if QUINTET_HAS_CUDA
  if (!device.is_cuda()) return;
  check_device(device);
  int current = 0;
  QUINTET_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device.index()) {
    QUINTET_CUDA_CHECK(cudaSetDevice(device.index()));
    previous_ = current;
  }
#else
  check_device(device);
#endif
}

DeviceGuard::~DeviceGuard() {
#if QUINTET_HAS_CUDA
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
#endif
}

}  // namespace quintet
