// Loader: quintet::data::DataLoader as a Python iterator of (inputs, targets) NumPy arrays, and
// describe(): what a data specification holds.
//
// Batches are not copied: each array points at the loader's batch memory (pinned host memory
// where CUDA is present, so torch.from_numpy(x).to("cuda", non_blocking=True) is an asynchronous
// copy) and keeps it alive through its base object; the loader allocates every batch afresh, so
// nothing is reused while Python holds an array. next() waits with the GIL released.
// With device="cuda:N" the C++ loader copies each batch to the GPU on its own stream, the next
// batch's copy overlapping the consumer's step, and next() returns DeviceArrays (DLPack).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "quintet/core/error.hpp"
#include "quintet/data/loader.hpp"
#include "quintet/data/token_dataset.hpp"
#include "quintet_data/device_array.hpp"
#include "quintet_data/module_parts.hpp"

namespace py = pybind11;

namespace quintet::python {
namespace {

// Owns a batch tensor for as long as a NumPy array views it (the array's base object).
struct BatchMemory {
  Tensor tensor;
};

py::array as_numpy(Tensor tensor) {
  QUINTET_CHECK(tensor.is_contiguous() && tensor.dtype() == DType::i32,
                "a batch must be a contiguous int32 tensor");
  const std::int32_t* data = tensor.data<std::int32_t>();
  std::vector<py::ssize_t> shape(tensor.shape().begin(), tensor.shape().end());
  py::object base = py::cast(BatchMemory{std::move(tensor)});
  return py::array_t<std::int32_t>(shape, data, base);
}

// A path, a glob, a comma-separated list of either, or a sequence of str / os.PathLike.
std::string data_spec(const py::object& paths) {
  const py::module_ os = py::module_::import("os");
  if (py::isinstance<py::str>(paths) || py::hasattr(paths, "__fspath__")) {
    return py::str(os.attr("fspath")(paths));
  }
  std::string spec;
  for (const py::handle item : paths) {
    const std::string path = py::str(os.attr("fspath")(item));
    QUINTET_CHECK(path.find(',') == std::string::npos,
                  "path '{}' contains ',', which separates entries of a data specification", path);
    spec += (spec.empty() ? "" : ",") + path;
  }
  QUINTET_CHECK(!spec.empty(), "no data paths given");
  return spec;
}

py::dict state_dict(const data::SamplerState& s) {
  py::dict d;
  d["epoch"] = s.epoch;
  d["sample_index"] = s.sample_index;
  return d;
}

data::SamplerState state_from(const py::dict& d) {
  for (const char* key : {"epoch", "sample_index"}) {
    QUINTET_CHECK(d.contains(key), "a loader state needs the key '{}' (as state() returns)", key);
  }
  for (const auto& [key, value] : d) {
    const std::string name = py::str(key);
    QUINTET_CHECK(name == "epoch" || name == "sample_index",
                  "unknown key '{}' in a loader state (expected epoch and sample_index)", name);
    QUINTET_CHECK(py::isinstance<py::int_>(value) && value.cast<py::int_>() >= py::int_(0),
                  "loader state '{}' must be a non-negative int, got {}", name,
                  std::string(py::repr(value)));
  }
  return data::SamplerState{d["epoch"].cast<std::uint64_t>(),
                            d["sample_index"].cast<std::uint64_t>()};
}

// device=: "cpu", "cuda", "cuda:N", an int N or anything whose str() is one (a torch.device).
Device device_of(const py::object& device) {
  if (py::isinstance<py::int_>(device)) return Device::cuda(device.cast<int>());
  return Device::parse(std::string(py::str(device)));
}

// stream=: None (the device's default stream, torch's too unless the program changed it), a
// cudaStream_t as an int, or an object with a cuda_stream attribute (torch.cuda.Stream).
Stream consumer_of(const Device& device, const py::object& stream) {
  if (stream.is_none()) return Stream::default_stream(device);
  const py::object handle =
      py::hasattr(stream, "cuda_stream") ? stream.attr("cuda_stream") : stream;
  QUINTET_CHECK(py::isinstance<py::int_>(handle),
                "stream must be None, a CUDA stream handle (int) or have .cuda_stream, got {}",
                std::string(py::repr(stream)));
  const auto value = handle.cast<std::int64_t>();
  QUINTET_CHECK(value >= 0, "stream handle must be >= 0, got {}", value);
  return Stream::borrow(device, reinterpret_cast<cudaStream_t>(static_cast<std::intptr_t>(value)));
}

class Loader {
 public:
  Loader(const py::object& paths, std::int64_t seq_len, std::int64_t batch, int dp_rank,
         int dp_size, std::uint64_t seed, int threads, std::uint64_t epoch, bool shuffle,
         int queue_depth, bool verify_checksum, const py::object& device,
         const py::object& stream) {
    const std::string spec = data_spec(paths);
    const Device where = device_of(device);
    QUINTET_CHECK(where.is_cuda() || stream.is_none(),
                  "stream is for a GPU loader (device='cuda:N'); this one delivers to the CPU");
    QUINTET_CHECK(where.is_cpu() || cuda_available(),
                  "device '{}': this build of Quintet has no CUDA or no GPU is visible",
                  where.str());
    data::LoaderConfig config;
    config.seq_len = seq_len;
    config.batch_size = batch;
    config.threads = threads;
    config.queue_depth = queue_depth;
    config.seed = seed;
    config.dp_rank = dp_rank;
    config.dp_size = dp_size;
    config.shuffle = shuffle;
    config.start = data::SamplerState{epoch, 0};
    config.device = where;
    if (where.is_cuda()) consumer_.emplace(consumer_of(where, stream));
    QUINTET_CHECK(threads >= 1, "threads must be >= 1, got {}", threads);
    QUINTET_CHECK(queue_depth >= 0, "queue_depth must be >= 0, got {}", queue_depth);
    py::gil_scoped_release release;  // opening verifies checksums: whole files are read
    loader_ = std::make_unique<data::DataLoader>(
        data::TokenDataset::open(spec, data::TokenFileOptions{verify_checksum}), config);
  }

  py::tuple next() {
    data::Batch batch;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mutex_);  // DataLoader::next is for one consumer
      batch = consumer_ ? open_loader().next(*consumer_) : open_loader().next();
    }
    if (consumer_) {
      return py::make_tuple(DeviceArray(std::move(batch.tokens), batch.ready),
                            DeviceArray(std::move(batch.targets), batch.ready));
    }
    return py::make_tuple(as_numpy(std::move(batch.tokens)), as_numpy(std::move(batch.targets)));
  }

  py::dict state() {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_dict(open_loader().state());
  }

  void load_state(const py::dict& d) {
    const data::SamplerState start = state_from(d);
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mutex_);
    open_loader().seek(start);
  }

  py::dict stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    const data::LoaderStats s = open_loader().stats();
    py::dict d;
    d["batches"] = s.batches;
    d["wait_seconds"] = s.wait_seconds;
    return d;
  }

  void close() {
    py::gil_scoped_release release;  // joins the workers
    std::lock_guard<std::mutex> lock(mutex_);
    loader_.reset();
  }

  const data::DataLoader& loader() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_loader();
  }

 private:
  data::DataLoader& open_loader() {
    QUINTET_CHECK(loader_ != nullptr, "the loader is closed");
    return *loader_;
  }

  std::mutex mutex_;
  std::optional<Stream> consumer_;  // GPU: the stream the batches are used on (and pooled for)
  std::unique_ptr<data::DataLoader> loader_;
};

py::list describe(const py::object& paths, bool verify_checksum) {
  const std::string spec = data_spec(paths);
  data::TokenDataset dataset;
  {
    py::gil_scoped_release release;
    dataset = data::TokenDataset::open(spec, data::TokenFileOptions{verify_checksum});
  }
  py::list files;
  for (const data::TokenFile& f : dataset.files()) {
    py::dict d;
    d["path"] = f.path();
    d["format"] = std::string(data::format_name(f.format()));
    d["token_type"] = std::string(data::token_type_name(f.token_type()));
    d["tokens"] = f.num_tokens();
    d["document_offsets"] = f.document_offsets();
    d["metadata"] = f.metadata();
    files.append(d);
  }
  return files;
}

}  // namespace

void bind_loader(py::module_& m) {
  py::class_<BatchMemory>(m, "_BatchMemory",
                          "The loader memory behind one batch array (its base object).");

  py::class_<Loader>(m, "Loader", R"doc(
Batches of training windows from token files, prepared ahead by C++ threads.

Loader(paths, seq_len, batch, dp_rank=0, dp_size=1, seed=0, threads=4, epoch=0,
       shuffle=True, queue_depth=0, verify_checksum=True, device="cpu", stream=None)

paths: a path, a glob ("data/train_*.qts") or a comma-separated list of either, or a list of
paths; Quintet shards, llm.c shards and Megatron indexed datasets. Iterating yields
(inputs, targets), two int32 arrays of shape [batch, seq_len] (targets are the inputs shifted by
one token), without end: epoch after epoch. Rank dp_rank of dp_size reads its share of every
global step (seq_len + 1 tokens a window, windows shuffled per epoch by seed). The arrays view
the loader's own memory, which stays valid as long as they live. The batches equal those of the
C++ DataLoader with the same arguments.

device="cuda:N" (or a torch.device): each batch is copied to that GPU on the loader's own copy
stream, the following batch's copy overlapping the step, and the pair is two DeviceArrays:
torch.from_dlpack(x) is a tensor on that memory, and makes torch's current stream wait (on the
GPU) for the copy. stream: the CUDA stream the batches are used on (None: the default stream;
an int handle or a torch.cuda.Stream); their memory is reused only after that stream's work.)doc")
      .def(py::init<const py::object&, std::int64_t, std::int64_t, int, int, std::uint64_t, int,
                    std::uint64_t, bool, int, bool, const py::object&, const py::object&>(),
           py::arg("paths"), py::arg("seq_len"), py::arg("batch"), py::arg("dp_rank") = 0,
           py::arg("dp_size") = 1, py::arg("seed") = 0, py::arg("threads") = 4,
           py::arg("epoch") = 0, py::arg("shuffle") = true, py::arg("queue_depth") = 0,
           py::arg("verify_checksum") = true, py::arg("device") = "cpu",
           py::arg("stream") = py::none())
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &Loader::next,
           "The next (inputs, targets); waits with the GIL released until it is ready.")
      .def("state", &Loader::state,
           "Where the stream stands after the last batch returned: {'epoch', 'sample_index'}. "
           "It does not depend on dp_size, so a run resumes at another one.")
      .def("load_state", &Loader::load_state, py::arg("state"),
           "Continue from a saved state(): the next batch is the one that starts there.")
      .def("stats", &Loader::stats,
           "{'batches': returned so far, 'wait_seconds': time next() waited for a batch}")
      .def("close", &Loader::close, "Stops and joins the worker threads (also at deletion).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Loader& self, const py::args&) { self.close(); })
      .def_property_readonly("num_windows",
                             [](Loader& self) { return self.loader().windows().count(); })
      .def_property_readonly(
          "batches_per_epoch",
          [](Loader& self) {
            const data::Sampler& s = self.loader().sampler();
            return s.num_windows() / s.global_batch_size();
          },
          "Whole global steps in one epoch (a step may also straddle two epochs).")
      .def_property_readonly("seq_len", [](Loader& self) { return self.loader().config().seq_len; })
      .def_property_readonly("batch",
                             [](Loader& self) { return self.loader().config().batch_size; })
      .def_property_readonly("dp_rank", [](Loader& self) { return self.loader().config().dp_rank; })
      .def_property_readonly("device",
                             [](Loader& self) { return self.loader().config().device.str(); })
      .def_property_readonly("dp_size",
                             [](Loader& self) { return self.loader().config().dp_size; });

  m.def("describe", &describe, py::arg("paths"), py::arg("verify_checksum") = true,
        "What the token files of paths hold: a list of {'path', 'format', 'token_type', 'tokens', "
        "'document_offsets', 'metadata'}, one per file, in the order the loader reads them.");
}

}  // namespace quintet::python
