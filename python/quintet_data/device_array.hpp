// DeviceArray (device_array.cpp): one batch tensor in GPU memory, exported through DLPack with
// the loader's copy-finished event, so that the consumer's stream waits for the copy on the GPU.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::python {

class DeviceArray {
 public:
  // tensor: on a GPU; ready: recorded after the copy that fills it (null: nothing to wait for).
  DeviceArray(Tensor tensor, std::shared_ptr<Event> ready);

  // DLPack: (kDLCUDA, device index), and a "dltensor" capsule holding its own reference.
  pybind11::tuple dlpack_device() const;
  pybind11::capsule dlpack(const pybind11::object& stream) const;

  std::vector<std::int64_t> shape() const;
  std::string device() const;

 private:
  Tensor tensor_;
  std::shared_ptr<Event> ready_;
};

}  // namespace quintet::python
