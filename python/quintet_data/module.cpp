// quintet_data: Quintet's token data loader and shard writers for Python programs.
//
// Every quintet::Error becomes a quintet_data.Error carrying the C++ message (for a bad file:
// the file, the byte offset, what was expected and what was found); an InvalidArgument becomes
// quintet_data.InvalidArgument, which is also a ValueError, so `except ValueError` catches bad
// arguments and bad files as a Python user expects.
#include <Python.h>

#include "quintet/core/device.hpp"
#include "quintet/core/error.hpp"
#include "quintet_data/module_parts.hpp"

namespace py = pybind11;

namespace {

// Exception types live as long as the interpreter: created once, kept in the module.
PyObject* g_error = nullptr;
PyObject* g_invalid_argument = nullptr;

}  // namespace

PYBIND11_MODULE(quintet_data, m) {
  m.doc() =
      "Quintet's multithreaded token data loader: batches prepared by C++ threads, handed to "
      "NumPy (and through it PyTorch) without copies, the GIL released while waiting.";

  g_error = PyErr_NewExceptionWithDoc("quintet_data.Error",
                                      "A failure reported by Quintet (the C++ message).",
                                      PyExc_RuntimeError, nullptr);
  py::tuple invalid_bases = py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError));
  g_invalid_argument = PyErr_NewExceptionWithDoc("quintet_data.InvalidArgument",
                                                 "Bad input: an argument, a state or a file.",
                                                 invalid_bases.ptr(), nullptr);
  if (g_error == nullptr || g_invalid_argument == nullptr) throw py::error_already_set();
  m.attr("Error") = py::handle(g_error);
  m.attr("InvalidArgument") = py::handle(g_invalid_argument);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const quintet::Error& e) {
      PyErr_SetString(
          e.code() == quintet::ErrorCode::InvalidArgument ? g_invalid_argument : g_error, e.what());
    }
  });

  m.def("cuda_available", &quintet::cuda_available,
        "True when this build has CUDA and a GPU is visible (Loader(device='cuda:N') works).");
  quintet::python::bind_device_array(m);
  quintet::python::bind_loader(m);
  quintet::python::bind_writers(m);
}
