// safetensors: Hugging Face's tensor file format, read through mmap and written atomically.
//
// A file is an 8-byte little-endian u64 N, a UTF-8 JSON header of N bytes, then the data region:
//   {"<name>": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>", ...}}        (__metadata__ optional, strings only)
// with byte offsets relative to the first byte after the header, row-major little-endian data.
// The tensors must not overlap and must cover the data region exactly, back to back (as the
// reference implementation requires). A model of several files has model.safetensors.index.json
// beside them: {"metadata": {"total_size": <bytes>}, "weight_map": {"<name>": "<file>", ...}}.
//
// Opening checks the whole structure and throws InvalidArgument naming the file (and the tensor)
// for: a truncated file, a header length beyond the file, invalid JSON, an unknown dtype, a shape
// or data_offsets that are not arrays of non-negative integers, offsets outside the data region,
// overlapping tensors, bytes of the data region no tensor covers, and data_offsets whose size
// disagrees with dtype x shape; for an index: a file it names that does not exist, or a tensor its
// file does not hold. Reading then fails only for bad arguments (a missing name, a box outside the
// tensor) or a dtype Quintet has no type for: every dtype of the format is accepted in a file,
// and F32, F16, BF16, F64, I64, I32, U16 and U8 are read.
//
// Reads are on the CPU, touch only the bytes of the tensor (or the box of it) asked for, and
// return a Tensor that is either a view into the mapping (no copy: the dtype asked is the file's,
// the bytes are one contiguous run and aligned for it) or a contiguous copy converted to the dtype
// asked for (BF16 on disk to f32, ...). The mapping is private copy-on-write: writing into a view
// changes this process's pages only, never the file. A view keeps the mapping alive.
//
// SafetensorsFile and SafetensorsCheckpoint are cheap copyable handles to immutable state; all
// their methods are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/core/dtype.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::data {

using SafetensorsMetadata = std::map<std::string, std::string>;

// The dtype names of the format and Quintet's DType for them: "F32" <-> f32, "BF16" <-> bf16,
// "F16" <-> f16, "F64" <-> f64, "I64" <-> i64, "I32" <-> i32, "U16" <-> u16, "U8" <-> u8.
std::string_view safetensors_dtype_name(DType dtype);

// One tensor of a file's header. bits is the element size in bits (4 for F4, 6 for F6_*).
struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;  // as in the file: "BF16", "F8_E4M3", ...
  bool supported = false;  // dtype is one Quintet reads (then `dtype` is it)
  DType dtype = DType::u8;
  int bits = 0;
  Shape shape;
  std::uint64_t begin = 0;  // bytes, relative to the data region
  std::uint64_t end = 0;
  std::uint64_t nbytes() const { return end - begin; }
};

// A half-open range [begin, end) of indices along one dimension, in elements.
struct IndexRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

class SafetensorsFile {
 public:
  SafetensorsFile() = default;

  // Maps path read-only and checks its header and layout (see above); throws InvalidArgument for a
  // malformed file, System when it cannot be opened.
  static SafetensorsFile open(const std::string& path);

  bool is_open() const { return impl_ != nullptr; }
  const std::string& path() const;
  const SafetensorsMetadata& metadata() const;  // __metadata__ (empty when absent)
  // The tensors in data-region order.
  const std::vector<SafetensorsEntry>& entries() const;
  bool contains(std::string_view name) const;
  // The entry of name; throws InvalidArgument naming the file when it has no such tensor.
  const SafetensorsEntry& entry(std::string_view name) const;
  // Bytes of the data region (the file's size less 8 and the header).
  std::uint64_t data_bytes() const;

  // The whole tensor, in the file's dtype / converted to dtype (see above for view or copy).
  Tensor read(std::string_view name) const;
  Tensor read(std::string_view name, DType dtype) const;
  // The box of the tensor given by one range per leading dimension (dimensions past box.size()
  // are taken whole), as a contiguous tensor of the box's sizes: rows [r0, r1) of a matrix is
  // read_box(name, {{r0, r1}}, dtype), columns [c0, c1) is read_box(name, {{0, rows}, {c0, c1}}).
  // Reads only the bytes inside the box. Throws InvalidArgument for a range outside the tensor.
  Tensor read_box(std::string_view name, const std::vector<IndexRange>& box, DType dtype) const;

  // Throws InvalidArgument naming the file, the tensor and both shapes when name's shape is not
  // expected; `source` says where the expectation came from ("config.json"), for the message.
  void check_shape(std::string_view name, const Shape& expected,
                   std::string_view source = "the caller") const;

 private:
  struct Impl;
  const Impl& impl() const;  // throws when not open
  std::shared_ptr<const Impl> impl_;
};

// The tensors of a model: one .safetensors file, or several with model.safetensors.index.json.
class SafetensorsCheckpoint {
 public:
  SafetensorsCheckpoint() = default;

  // path is a .safetensors file, an index .json file (its files are beside it), or a directory
  // holding model.safetensors.index.json or else model.safetensors. Opens every file (checking
  // each as SafetensorsFile::open does) and that every tensor of the index is in its file; throws
  // InvalidArgument for a malformed index or file, a file the index names that does not exist,
  // or a directory with neither file.
  static SafetensorsCheckpoint open(const std::string& path);

  bool is_open() const { return impl_ != nullptr; }
  const std::string& path() const;  // as opened
  // The index's "metadata" values as strings (total_size, ...); empty for a single file.
  const SafetensorsMetadata& index_metadata() const;
  // Every tensor name, sorted.
  const std::vector<std::string>& names() const;
  bool contains(std::string_view name) const;
  // The file holding name; throws InvalidArgument naming the checkpoint when none does.
  const SafetensorsFile& file_of(std::string_view name) const;
  const std::vector<SafetensorsFile>& files() const;

  // As SafetensorsFile's, on the file holding name.
  const SafetensorsEntry& entry(std::string_view name) const { return file_of(name).entry(name); }
  Tensor read(std::string_view name) const { return file_of(name).read(name); }
  Tensor read(std::string_view name, DType dtype) const { return file_of(name).read(name, dtype); }
  Tensor read_box(std::string_view name, const std::vector<IndexRange>& box, DType dtype) const {
    return file_of(name).read_box(name, box, dtype);
  }
  void check_shape(std::string_view name, const Shape& expected,
                   std::string_view source = "the caller") const {
    file_of(name).check_shape(name, expected, source);
  }

 private:
  struct Impl;
  const Impl& impl() const;  // throws when not open
  std::shared_ptr<const Impl> impl_;
};

// ---- Writing ----

struct NamedTensor {
  std::string name;
  Tensor tensor;  // any device, any strides; written in its own dtype
};

// Writes tensors (and metadata as __metadata__) to path as one safetensors file, atomically (a
// temporary file renamed over path when complete). Ordered as the reference writer orders them
// (larger elements first, then by name) and the header padded with spaces to a multiple of 8
// bytes, so every tensor is aligned for its dtype. GPU tensors are copied to the host one at a
// time. Throws InvalidArgument (before anything is written) for an empty or duplicate name, the
// name "__metadata__", or an undefined tensor; System when the file cannot be written.
// Note: transformers loads a file only if its metadata holds {"format": "pt"}.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata = {});

// Which tensors go in which file, by sizes in bytes, as Hugging Face splits a model: in order, a
// file is closed when the next tensor would take it past max_shard_bytes, and a tensor larger
// than max_shard_bytes gets a file of its own. Returns the indices of each file's tensors.
std::vector<std::vector<std::size_t>> plan_safetensors_shards(
    const std::vector<std::uint64_t>& tensor_bytes, std::uint64_t max_shard_bytes);

struct SafetensorsShardOptions {
  std::uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default, "5GB"
  std::string prefix = "model";                   // file names: <prefix>.safetensors, ...
  SafetensorsMetadata metadata;                   // written in every file
};

// Writes tensors into directory dir (created if needed) as transformers' save_pretrained does:
// one file <prefix>.safetensors when all fit in max_shard_bytes, else <prefix>-00001-of-0000N
// .safetensors ... (plan_safetensors_shards) and <prefix>.safetensors.index.json with the
// total_size and weight_map, written last. Each file is written atomically. Returns the names of
// the files written, in dir, the index last. Throws as write_safetensors does.
std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<NamedTensor>& tensors,
                                                   const SafetensorsShardOptions& options = {});

}  // namespace quintet::data
