// The parts of the quintet_data module, each registered on the module by its own source:
//   module.cpp           PYBIND11_MODULE, the exception types and how quintet::Error maps to them
//   loader_binding.cpp   Loader (the DataLoader as a Python iterator) and describe()
//   device_array.cpp     DeviceArray (a GPU batch handed out through DLPack)
//   writers_binding.cpp  write_quintet_shard, write_llmc_shard, write_megatron_dataset
#pragma once

#include <pybind11/pybind11.h>

namespace quintet::python {

void bind_device_array(pybind11::module_& m);
void bind_loader(pybind11::module_& m);
void bind_writers(pybind11::module_& m);

}  // namespace quintet::python
