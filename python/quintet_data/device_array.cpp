// DeviceArray: a batch tensor on a GPU, handed to PyTorch (or CuPy, JAX, ...) through DLPack.
//
// The DLPack structures are declared here (their C ABI is fixed by the DLPack specification,
// version 0.8 unversioned capsules, which every consumer accepts), so no dlpack header is needed.
// __dlpack__(stream) makes the consumer's stream wait, on the GPU, for the loader's copy: the
// host never waits. Each capsule holds its own reference to the tensor, so the memory lives as
// long as the consumer's tensor does, whatever happens to this object.
#include <Python.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet_data/device_array.hpp"

namespace py = pybind11;

namespace quintet::python {
namespace {

// The DLPack ABI (dlpack.h, v0.8).
enum DLDeviceTypeCode : std::int32_t { kDLCUDA = 2 };
enum DLDataTypeCode : std::uint8_t { kDLInt = 0 };
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// What one capsule owns: a reference to the tensor and the shape/strides arrays DLTensor points at.
struct Exported {
  Tensor tensor;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensor managed{};
};

void delete_exported(DLManagedTensor* self) {
  delete static_cast<Exported*>(self->manager_ctx);  // needs no GIL: frees into quintet's pool
}

// A capsule the consumer never took (still named "dltensor") is deleted with it.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor") == 0) return;  // consumed: now "used_dltensor"
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

DLDataType dl_dtype(DType dtype) {
  QUINTET_CHECK(dtype == DType::i32, "only int32 batches are exported, got {}", dtype_name(dtype));
  return DLDataType{kDLInt, 32, 1};
}

// The stream argument of __dlpack__: None is the legacy default stream, 1 the legacy default,
// 2 the per-thread default, -1 no synchronisation, anything else a cudaStream_t.
std::optional<Stream> consumer_stream(const Device& device, const py::object& stream) {
  if (stream.is_none()) return Stream::default_stream(device);
  const auto handle = stream.cast<std::int64_t>();
  if (handle == -1) return std::nullopt;
  QUINTET_CHECK(handle != 0,
                "__dlpack__(stream=0) is ambiguous (DLPack asks for 1, the legacy default stream)");
  QUINTET_CHECK(handle > 0, "__dlpack__: stream must be -1, None or a CUDA stream, got {}", handle);
  return Stream::borrow(device, reinterpret_cast<cudaStream_t>(static_cast<std::intptr_t>(handle)));
}

}  // namespace

DeviceArray::DeviceArray(Tensor tensor, std::shared_ptr<Event> ready)
    : tensor_(std::move(tensor)), ready_(std::move(ready)) {
  QUINTET_CHECK(tensor_.device().is_cuda(), "a DeviceArray holds GPU memory, got {}",
                tensor_.device().str());
}

py::tuple DeviceArray::dlpack_device() const {
  return py::make_tuple(static_cast<int>(kDLCUDA), tensor_.device().index());
}

py::capsule DeviceArray::dlpack(const py::object& stream) const {
  if (const std::optional<Stream> consumer = consumer_stream(tensor_.device(), stream)) {
    if (ready_) ready_->wait(*consumer);
  }
  auto owned = std::make_unique<Exported>();
  Exported& e = *owned;
  e.tensor = tensor_;
  e.shape.assign(tensor_.shape().begin(), tensor_.shape().end());
  e.strides.assign(tensor_.strides().begin(), tensor_.strides().end());
  DLTensor& t = e.managed.dl_tensor;
  t.data = tensor_.data_ptr();
  t.device = DLDevice{kDLCUDA, tensor_.device().index()};
  t.ndim = static_cast<std::int32_t>(e.shape.size());
  t.dtype = dl_dtype(tensor_.dtype());
  t.shape = e.shape.data();
  t.strides = e.strides.data();
  t.byte_offset = 0;
  e.managed.manager_ctx = owned.get();
  e.managed.deleter = &delete_exported;
  PyObject* capsule = PyCapsule_New(&e.managed, "dltensor", &capsule_destructor);
  if (capsule == nullptr) throw py::error_already_set();
  owned.release();  // the capsule (or its consumer) deletes it now
  return py::reinterpret_steal<py::capsule>(capsule);
}

std::vector<std::int64_t> DeviceArray::shape() const {
  return {tensor_.shape().begin(), tensor_.shape().end()};
}

std::string DeviceArray::device() const { return tensor_.device().str(); }

void bind_device_array(py::module_& m) {
  py::class_<DeviceArray>(m, "DeviceArray", R"doc(
A batch array in GPU memory (Loader(..., device="cuda:N")), for any DLPack consumer:
torch.from_dlpack(a) is a torch tensor on the same memory, without a copy. __dlpack__(stream)
makes the consumer's stream wait, on the GPU, until the loader's copy has finished; the memory
stays valid as long as the consumer's tensor lives.)doc")
      .def(
          "__dlpack__",
          [](const DeviceArray& self, const py::object& stream, const py::kwargs&) {
            return self.dlpack(stream);
          },
          py::arg("stream") = py::none(),
          "A DLPack capsule of this array; stream: the consumer's CUDA stream (DLPack's rules).")
      .def("__dlpack_device__", &DeviceArray::dlpack_device)
      .def_property_readonly("shape", &DeviceArray::shape)
      .def_property_readonly("dtype", [](const DeviceArray&) { return std::string("int32"); })
      .def_property_readonly("device", &DeviceArray::device)
      .def("__repr__", [](const DeviceArray& self) {
        std::string dims;
        for (const std::int64_t d : self.shape())
          dims += (dims.empty() ? "" : ", ") + std::to_string(d);
        return "quintet_data.DeviceArray(shape=(" + dims +
               "), dtype=int32, device=" + self.device() + ")";
      });
}

}  // namespace quintet::python
