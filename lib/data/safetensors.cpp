#include "quintet/data/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "data/internal/mapped_file.hpp"
#include "quintet/core/error.hpp"

namespace quintet::data {

// The format is little-endian and the data is handed out as is.
static_assert(std::endian::native == std::endian::little, "safetensors needs a little-endian host");

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// The reference implementation refuses headers above this size.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  std::string_view name;
  int bits;
  bool supported;
  DType dtype;
};

// Every dtype of the format (safetensors' Dtype enum), the ones Quintet reads first.
constexpr DTypeInfo kDTypes[] = {
    {"F32", 32, true, DType::f32},        {"F16", 16, true, DType::f16},
    {"BF16", 16, true, DType::bf16},      {"F64", 64, true, DType::f64},
    {"I64", 64, true, DType::i64},        {"I32", 32, true, DType::i32},
    {"U16", 16, true, DType::u16},        {"U8", 8, true, DType::u8},
    {"BOOL", 8, false, DType::u8},        {"I8", 8, false, DType::u8},
    {"I16", 16, false, DType::u8},        {"U32", 32, false, DType::u8},
    {"U64", 64, false, DType::u8},        {"C64", 64, false, DType::u8},
    {"F8_E5M2", 8, false, DType::u8},     {"F8_E4M3", 8, false, DType::u8},
    {"F8_E8M0", 8, false, DType::u8},     {"F8_E4M3FNUZ", 8, false, DType::u8},
    {"F8_E5M2FNUZ", 8, false, DType::u8}, {"F6_E2M3", 6, false, DType::u8},
    {"F6_E3M2", 6, false, DType::u8},     {"F4", 4, false, DType::u8},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string dtype_names(bool supported_only) {
  std::string out;
  for (const DTypeInfo& d : kDTypes) {
    if (supported_only && !d.supported) continue;
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

template <class... Args>
[[noreturn]] void malformed(const std::string& path, fmt::format_string<Args...> format,
                            Args&&... args) {
  QUINTET_THROW(InvalidArgument, "malformed safetensors file {}: {}", path,
                fmt::format(format, std::forward<Args>(args)...));
}

// a * b, or false on uint64 overflow.
bool mul_checked(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const Json& j,
                             std::uint64_t data_bytes) {
  if (!j.is_object()) malformed(path, "tensor {}: expected an object, found {}", name, j.dump());
  const auto field = [&](const char* key) -> const Json& {
    const auto it = j.find(key);
    if (it == j.end()) malformed(path, "tensor {}: no \"{}\" in {}", name, key, j.dump());
    return *it;
  };
  const Json& dtype = field("dtype");
  const Json& shape = field("shape");
  const Json& offsets = field("data_offsets");

  SafetensorsEntry e;
  e.name = name;
  if (!dtype.is_string())
    malformed(path, "tensor {}: dtype {} is not a string", name, dtype.dump());
  e.dtype_name = dtype.get<std::string>();
  const DTypeInfo* info = find_dtype(e.dtype_name);
  if (info == nullptr) {
    malformed(path, "tensor {}: unknown dtype \"{}\" (the format's dtypes: {})", name, e.dtype_name,
              dtype_names(false));
  }
  e.supported = info->supported;
  e.dtype = info->dtype;
  e.bits = info->bits;

  const auto is_count = [](const Json& v) { return v.is_number_unsigned(); };
  if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), is_count)) {
    malformed(path, "tensor {}: shape {} is not an array of non-negative integers", name,
              shape.dump());
  }
  std::uint64_t numel = 1;
  for (const Json& d : shape) {
    const auto size = d.get<std::uint64_t>();
    if (size > static_cast<std::uint64_t>(INT64_MAX) || !mul_checked(numel, size, &numel)) {
      malformed(path, "tensor {}: shape {} overflows 64 bits", name, shape.dump());
    }
    e.shape.push_back(static_cast<std::int64_t>(size));
  }
  if (!offsets.is_array() || offsets.size() != 2 ||
      !std::all_of(offsets.begin(), offsets.end(), is_count)) {
    malformed(path, "tensor {}: data_offsets {} is not [begin, end] of non-negative integers", name,
              offsets.dump());
  }
  e.begin = offsets[0].get<std::uint64_t>();
  e.end = offsets[1].get<std::uint64_t>();

  std::uint64_t bits = 0;
  if (!mul_checked(numel, static_cast<std::uint64_t>(e.bits), &bits)) {
    malformed(path, "tensor {}: shape {} of {} overflows 64 bits", name, shape.dump(),
              e.dtype_name);
  }
  if (bits % 8 != 0) {
    malformed(path, "tensor {}: {} elements of {} ({} bits each) are not a whole number of bytes",
              name, numel, e.dtype_name, e.bits);
  }
  if (e.end < e.begin) {
    malformed(path, "tensor {}: data_offsets [{}, {}] end before they begin", name, e.begin, e.end);
  }
  if (e.end > data_bytes) {
    malformed(path,
              "tensor {}: data_offsets [{}, {}] lie outside the data region of {} bytes "
              "(a truncated file?)",
              name, e.begin, e.end, data_bytes);
  }
  if (e.end - e.begin != bits / 8) {
    malformed(path, "tensor {}: data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {}",
              name, e.begin, e.end, e.end - e.begin, shape.dump(), e.dtype_name, bits / 8);
  }
  return e;
}

// The tensors must cover the data region back to back, without overlap or gap.
void check_layout(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                  std::uint64_t data_bytes) {
  std::uint64_t pos = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    if (e.begin < pos) {
      const SafetensorsEntry& p = entries[i - 1];
      malformed(path, "tensors {} [{}, {}) and {} [{}, {}) overlap", p.name, p.begin, p.end, e.name,
                e.begin, e.end);
    }
    if (e.begin > pos) {
      malformed(path, "bytes [{}, {}) of the data region, before tensor {}, belong to no tensor",
                pos, e.begin, e.name);
    }
    pos = e.end;
  }
  if (pos != data_bytes) {
    malformed(path, "bytes [{}, {}) at the end of the data region belong to no tensor", pos,
              data_bytes);
  }
}

std::string some_names(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 5;
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) {
    out += (i == 0 ? "" : ", ") + names[i];
  }
  if (names.size() > kShown) out += fmt::format(", ... ({} in all)", names.size());
  return out.empty() ? "none" : out;
}

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.supported && d.dtype == dtype) return d.name;
  }
  QUINTET_THROW(InvalidArgument, "dtype {} has no safetensors name", dtype_name(dtype));
}

// ---- SafetensorsFile ----

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<detail::MappedFile> map;
  std::uint64_t data_start = 0;  // 8 + header length
  std::uint64_t data_bytes = 0;
  SafetensorsMetadata metadata;
  std::vector<SafetensorsEntry> entries;  // by offset
  std::map<std::string, std::size_t, std::less<>> by_name;
  std::vector<std::string> names;  // sorted, for messages

  const SafetensorsEntry& find(std::string_view name) const;      // throws when absent
  const SafetensorsEntry& readable(std::string_view name) const;  // and when not supported
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->map = std::make_shared<detail::MappedFile>(path, "safetensors file",
                                                   detail::MappedFile::Access::copy_on_write);
  const std::uint64_t size = impl->map->size();
  if (size < 8) {
    malformed(path, "it has {} bytes, fewer than the 8 of the header length (a truncated file?)",
              size);
  }
  std::uint64_t n = 0;
  std::memcpy(&n, impl->map->data(), 8);
  if (n > kMaxHeaderBytes) {
    malformed(path, "header length {} is above the format's limit of {} bytes", n, kMaxHeaderBytes);
  }
  if (n > size - 8) {
    malformed(path,
              "header length {} runs past the end of the file ({} bytes after the length; a "
              "truncated file?)",
              n, size - 8);
  }
  impl->data_start = 8 + n;
  impl->data_bytes = size - impl->data_start;

  Json header;
  try {
    const auto* p = reinterpret_cast<const char*>(impl->map->data()) + 8;
    header = Json::parse(p, p + n);
  } catch (const Json::exception& e) {
    malformed(path, "the header is not valid JSON: {}", e.what());
  }
  if (!header.is_object())
    malformed(path, "the header is {}, not a JSON object", header.type_name());
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) malformed(path, "__metadata__ is {}, not an object", value.dump());
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) {
          malformed(path, "__metadata__ value of \"{}\" is {}, not a string", k, v.dump());
        }
        impl->metadata[k] = v.get<std::string>();
      }
      continue;
    }
    impl->entries.push_back(parse_entry(path, key, value, impl->data_bytes));
  }
  std::sort(impl->entries.begin(), impl->entries.end(), [](const auto& a, const auto& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  check_layout(path, impl->entries, impl->data_bytes);
  for (std::size_t i = 0; i < impl->entries.size(); ++i) {
    impl->by_name.emplace(impl->entries[i].name, i);
    impl->names.push_back(impl->entries[i].name);
  }
  std::sort(impl->names.begin(), impl->names.end());
  SafetensorsFile f;
  f.impl_ = std::move(impl);
  return f;
}

const SafetensorsFile::Impl& SafetensorsFile::impl() const {
  QUINTET_CHECK(impl_ != nullptr, "SafetensorsFile: not open (use SafetensorsFile::open)");
  return *impl_;
}
const std::string& SafetensorsFile::path() const { return impl().path; }
const SafetensorsMetadata& SafetensorsFile::metadata() const { return impl().metadata; }
const std::vector<SafetensorsEntry>& SafetensorsFile::entries() const { return impl().entries; }
std::uint64_t SafetensorsFile::data_bytes() const { return impl().data_bytes; }
bool SafetensorsFile::contains(std::string_view name) const {
  return impl().by_name.find(name) != impl().by_name.end();
}
const SafetensorsEntry& SafetensorsFile::entry(std::string_view name) const {
  return impl().find(name);
}

const SafetensorsEntry& SafetensorsFile::Impl::find(std::string_view name) const {
  const auto it = by_name.find(name);
  QUINTET_CHECK(it != by_name.end(), "safetensors file {} has no tensor {} (it holds: {})", path,
                name, some_names(names));
  return entries[it->second];
}

const SafetensorsEntry& SafetensorsFile::Impl::readable(std::string_view name) const {
  const SafetensorsEntry& e = find(name);
  QUINTET_CHECK(e.supported, "unsupported dtype {} for tensor {} in {}: Quintet reads {}",
                e.dtype_name, e.name, path, dtype_names(true));
  return e;
}

Tensor SafetensorsFile::read(std::string_view name) const {
  return read_box(name, {}, impl().readable(name).dtype);
}

Tensor SafetensorsFile::read(std::string_view name, DType dtype) const {
  return read_box(name, {}, dtype);
}

Tensor SafetensorsFile::read_box(std::string_view name, const std::vector<IndexRange>& box,
                                 DType dtype) const {
  const SafetensorsEntry& e = impl().readable(name);
  const int rank = static_cast<int>(e.shape.size());
  QUINTET_CHECK(static_cast<int>(box.size()) <= rank,
                "read_box of tensor {} in {}: {} ranges for a tensor of shape {}", e.name,
                impl_->path, box.size(), shape_str(e.shape));
  Shape out_shape = e.shape;
  Shape begin(rank, 0);
  for (std::size_t d = 0; d < box.size(); ++d) {
    const IndexRange r = box[d];
    QUINTET_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= e.shape[d],
                  "read_box of tensor {} in {}: range [{}, {}) of dimension {} is outside its "
                  "shape {}",
                  e.name, impl_->path, r.begin, r.end, d, shape_str(e.shape));
    begin[d] = r.begin;
    out_shape[d] = r.end - r.begin;
  }
  if (shape_numel(out_shape) == 0) return Tensor::empty(out_shape, dtype);

  // The box is a set of runs, each contiguous in the file: dimensions after the last one the box
  // cuts are whole, so a run spans that dimension's range of them.
  const Shape strides = contiguous_strides(e.shape);
  int cut = 0;  // the last dimension the box cuts (0 when it cuts none: one run of everything)
  for (int d = rank - 1; d >= 0; --d) {
    if (out_shape[d] != e.shape[d]) {
      cut = d;
      break;
    }
  }
  const std::size_t esize = dtype_size(e.dtype);
  const std::size_t run_bytes =
      static_cast<std::size_t>(rank == 0 ? 1 : out_shape[cut] * strides[cut]) * esize;
  std::int64_t runs = 1;
  for (int d = 0; d < cut; ++d) runs *= out_shape[d];
  unsigned char* base = impl_->map->data() + impl_->data_start + e.begin;

  std::vector<std::int64_t> index(begin.begin(), begin.begin() + (rank == 0 ? 0 : cut + 1));
  const auto run_start = [&] {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < index.size(); ++d) off += index[d] * strides[d];
    return base + static_cast<std::size_t>(off) * esize;
  };
  if (runs == 1 && reinterpret_cast<std::uintptr_t>(run_start()) % esize == 0) {
    // A view: the tensor's storage is the run, and it keeps the mapping alive. Converted, the
    // view is read once into the result, with no copy in the file's dtype in between.
    const Tensor view = Tensor::from_storage(std::shared_ptr<void>(impl_->map, run_start()),
                                             run_bytes, out_shape, e.dtype, Device::cpu());
    return view.to(dtype);
  }
  Tensor raw = Tensor::empty(out_shape, e.dtype);
  auto* dst = static_cast<unsigned char*>(raw.data_ptr());
  for (std::int64_t r = 0; r < runs; ++r) {
    std::memcpy(dst + static_cast<std::size_t>(r) * run_bytes, run_start(), run_bytes);
    // The next index over dimensions [0, cut), odometer-wise within the box.
    for (int d = cut - 1; d >= 0; --d) {
      if (++index[d] < begin[d] + out_shape[d]) break;
      index[d] = begin[d];
    }
  }
  return raw.to(dtype);
}

void SafetensorsFile::check_shape(std::string_view name, const Shape& expected,
                                  std::string_view source) const {
  const SafetensorsEntry& e = entry(name);
  QUINTET_CHECK(e.shape == expected, "tensor {} in {} has shape {}, but {} expects {}", e.name,
                impl_->path, shape_str(e.shape), source, shape_str(expected));
}

// ---- SafetensorsCheckpoint ----

namespace {

struct CheckpointContents {
  SafetensorsMetadata index_metadata;
  std::vector<SafetensorsFile> files;
  std::map<std::string, std::size_t, std::less<>> file_of;  // tensor -> index into files
  std::vector<std::string> names;
};

template <class... Args>
[[noreturn]] void malformed_index(const std::string& path, fmt::format_string<Args...> format,
                                  Args&&... args) {
  QUINTET_THROW(InvalidArgument, "malformed safetensors index {}: {}", path,
                fmt::format(format, std::forward<Args>(args)...));
}

void open_index(CheckpointContents& impl, const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  if (!in) QUINTET_THROW(System, "cannot open safetensors index {}", index_path);
  std::stringstream text;
  text << in.rdbuf();
  Json index;
  try {
    index = Json::parse(text.str());
  } catch (const Json::exception& e) {
    malformed_index(index_path, "not valid JSON: {}", e.what());
  }
  if (!index.is_object()) malformed_index(index_path, "{}, not a JSON object", index.type_name());
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    malformed_index(index_path, "no \"weight_map\" object of tensor name -> file name");
  }
  if (const auto m = index.find("metadata"); m != index.end() && m->is_object()) {
    for (const auto& [k, v] : m->items()) {
      impl.index_metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
  }
  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, std::size_t> file_index;
  for (const auto& [tensor, file] : map_it->items()) {
    if (!file.is_string()) {
      malformed_index(index_path, "tensor {} maps to {}, not a file name", tensor, file.dump());
    }
    const std::string name = file.get<std::string>();
    const fs::path rel(name);
    const bool escapes =
        rel.is_absolute() || name.empty() ||
        std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; });
    if (escapes) {
      malformed_index(index_path, "tensor {} maps to \"{}\", not a file beside the index", tensor,
                      name);
    }
    auto [it, added] = file_index.emplace(name, impl.files.size());
    if (added) {
      const fs::path p = dir / rel;
      QUINTET_CHECK(fs::is_regular_file(p),
                    "safetensors index {} maps tensor {} to file {}, which does not exist",
                    index_path, tensor, p.string());
      impl.files.push_back(SafetensorsFile::open(p.string()));
    }
    const SafetensorsFile& f = impl.files[it->second];
    QUINTET_CHECK(f.contains(tensor),
                  "safetensors index {} maps tensor {} to file {}, which has no such tensor",
                  index_path, tensor, f.path());
    impl.file_of.emplace(tensor, it->second);
    impl.names.push_back(tensor);
  }
}

}  // namespace

struct SafetensorsCheckpoint::Impl : CheckpointContents {
  std::string path;
};

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  const fs::path p(path);
  std::string index_path, file_path;
  if (fs::is_directory(p)) {
    if (fs::is_regular_file(p / "model.safetensors.index.json")) {
      index_path = (p / "model.safetensors.index.json").string();
    } else if (fs::is_regular_file(p / "model.safetensors")) {
      file_path = (p / "model.safetensors").string();
    } else {
      QUINTET_THROW(InvalidArgument,
                    "directory {} holds neither model.safetensors.index.json nor "
                    "model.safetensors",
                    path);
    }
  } else {
    QUINTET_CHECK(fs::exists(p), "no safetensors file, index or directory at {}", path);
    (p.extension() == ".json" ? index_path : file_path) = path;
  }
  if (!index_path.empty()) {
    open_index(*impl, index_path);
  } else {
    impl->files.push_back(SafetensorsFile::open(file_path));
    for (const SafetensorsEntry& e : impl->files[0].entries()) {
      impl->file_of.emplace(e.name, 0);
      impl->names.push_back(e.name);
    }
  }
  std::sort(impl->names.begin(), impl->names.end());
  SafetensorsCheckpoint c;
  c.impl_ = std::move(impl);
  return c;
}

const SafetensorsCheckpoint::Impl& SafetensorsCheckpoint::impl() const {
  QUINTET_CHECK(impl_ != nullptr,
                "SafetensorsCheckpoint: not open (use SafetensorsCheckpoint::open)");
  return *impl_;
}
const std::string& SafetensorsCheckpoint::path() const { return impl().path; }
const SafetensorsMetadata& SafetensorsCheckpoint::index_metadata() const {
  return impl().index_metadata;
}
const std::vector<std::string>& SafetensorsCheckpoint::names() const { return impl().names; }
const std::vector<SafetensorsFile>& SafetensorsCheckpoint::files() const { return impl().files; }
bool SafetensorsCheckpoint::contains(std::string_view name) const {
  return impl().file_of.find(name) != impl().file_of.end();
}
const SafetensorsFile& SafetensorsCheckpoint::file_of(std::string_view name) const {
  const Impl& c = impl();
  const auto it = c.file_of.find(name);
  QUINTET_CHECK(it != c.file_of.end(), "safetensors checkpoint {} has no tensor {} (it holds: {})",
                c.path, name, some_names(c.names));
  return c.files[it->second];
}

}  // namespace quintet::data
