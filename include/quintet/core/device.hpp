// Device: where a tensor's memory lives, the CPU or one CUDA GPU ("cpu", "cuda:N").
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace quintet {

enum class DeviceKind { cpu, cuda };

class Device {
 public:
  constexpr Device() = default;
  static constexpr Device cpu() { return Device(); }
  // cuda:index; the index is checked against the visible GPUs when memory is first allocated.
  static Device cuda(int index = 0);
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N"; throws InvalidArgument otherwise.
  static Device parse(std::string_view text);

  DeviceKind kind() const { return kind_; }
  int index() const { return index_; }  // -1 for the CPU
  bool is_cpu() const { return kind_ == DeviceKind::cpu; }
  bool is_cuda() const { return kind_ == DeviceKind::cuda; }
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.kind_ == b.kind_ && a.index_ == b.index_;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }

 private:
  constexpr Device(DeviceKind kind, int index) : kind_(kind), index_(index) {}
  DeviceKind kind_ = DeviceKind::cpu;
  int index_ = -1;
};

// Number of CUDA GPUs visible to this process; 0 when CUDA is not built or no driver/GPU exists.
int cuda_device_count();
// True when this build has CUDA and at least one GPU is visible.
bool cuda_available();
// Throws InvalidArgument when device is cuda:N and N is not a visible GPU.
void check_device(const Device& device);
// Makes device the current CUDA device of the calling thread (no-op for the CPU).
void set_current_device(const Device& device);
// The PCI bus id of a GPU as the CUDA runtime gives it (cudaDeviceGetPCIBusId), lower case:
// "0000:17:00.0" (domain:bus:device.function); "" for the CPU. Throws InvalidArgument for a GPU
// that is not visible.
std::string pci_bus_id(const Device& device);

}  // namespace quintet

template <>
struct fmt::formatter<quintet::Device> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const quintet::Device& d, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
