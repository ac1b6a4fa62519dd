// The writing half of quintet/data/safetensors.hpp.
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "data/internal/atomic_file.hpp"
#include "quintet/core/error.hpp"
#include "quintet/data/safetensors.hpp"

namespace quintet::data {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

void check_tensors(const std::vector<NamedTensor>& tensors) {
  std::set<std::string_view> seen;
  for (const NamedTensor& t : tensors) {
    QUINTET_CHECK(!t.name.empty(), "safetensors: a tensor needs a name");
    QUINTET_CHECK(t.name != "__metadata__",
                  "safetensors: \"__metadata__\" is the header's metadata key, not a tensor name");
    QUINTET_CHECK(seen.insert(t.name).second, "safetensors: tensor {} is given twice", t.name);
    QUINTET_CHECK(t.tensor.defined(), "safetensors: tensor {} is undefined", t.name);
  }
}

// Writes tensors[which] to path (see write_safetensors).
void write_file(const std::string& path, const std::vector<NamedTensor>& tensors,
                std::vector<std::size_t> which, const SafetensorsMetadata& metadata) {
  // Larger elements first, then by name, as the reference writer orders them: behind a header
  // padded to 8 bytes, every tensor then starts aligned for its dtype.
  std::sort(which.begin(), which.end(), [&](std::size_t a, std::size_t b) {
    const std::size_t sa = tensors[a].tensor.element_size(), sb = tensors[b].tensor.element_size();
    return sa != sb ? sa > sb : tensors[a].name < tensors[b].name;
  });
  std::string header;
  try {
    Json j = Json::object();
    if (!metadata.empty()) j["__metadata__"] = metadata;
    std::uint64_t offset = 0;
    for (const std::size_t i : which) {
      const Tensor& t = tensors[i].tensor;
      j[tensors[i].name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                            {"shape", t.shape()},
                            {"data_offsets", {offset, offset + t.nbytes()}}};
      offset += t.nbytes();
    }
    header = j.dump();
  } catch (const Json::exception& e) {  // a name or metadata that is not UTF-8
    QUINTET_THROW(InvalidArgument, "safetensors: cannot write the header of {}: {}", path,
                  e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  detail::AtomicFile f(path);
  f.put<std::uint64_t>(header.size());
  f.write(header.data(), header.size());
  for (const std::size_t i : which) {
    const Tensor host = tensors[i].tensor.to(Device::cpu()).contiguous();
    f.write(host.data_ptr(), host.nbytes());
  }
  f.commit();
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  check_tensors(tensors);
  std::vector<std::size_t> all(tensors.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  write_file(path, tensors, std::move(all), metadata);
}

std::vector<std::vector<std::size_t>> plan_safetensors_shards(
    const std::vector<std::uint64_t>& tensor_bytes, std::uint64_t max_shard_bytes) {
  // huggingface_hub's split_state_dict_into_shards_factory, which transformers calls.
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::size_t> current;
  std::uint64_t current_bytes = 0;
  for (std::size_t i = 0; i < tensor_bytes.size(); ++i) {
    const std::uint64_t n = tensor_bytes[i];
    if (n > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + n > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += n;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<NamedTensor>& tensors,
                                                   const SafetensorsShardOptions& options) {
  check_tensors(tensors);
  QUINTET_CHECK(!options.prefix.empty(), "write_safetensors_sharded: the file prefix is empty");
  std::vector<std::uint64_t> bytes;
  std::uint64_t total = 0;
  for (const NamedTensor& t : tensors) {
    bytes.push_back(t.tensor.nbytes());
    total += t.tensor.nbytes();
  }
  auto shards = plan_safetensors_shards(bytes, options.max_shard_bytes);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) QUINTET_THROW(System, "cannot create directory {}: {}", dir, ec.message());

  std::vector<std::string> written;
  if (shards.size() <= 1) {
    written.push_back(options.prefix + ".safetensors");
    std::vector<std::size_t> all(tensors.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    write_file((fs::path(dir) / written[0]).string(), tensors, std::move(all), options.metadata);
    return written;
  }
  Json weight_map = Json::object();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string name =
        fmt::format("{}-{:05d}-of-{:05d}.safetensors", options.prefix, s + 1, shards.size());
    for (const std::size_t i : shards[s]) weight_map[tensors[i].name] = name;
    write_file((fs::path(dir) / name).string(), tensors, shards[s], options.metadata);
    written.push_back(name);
  }
  const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  written.push_back(options.prefix + ".safetensors.index.json");
  detail::AtomicFile f((fs::path(dir) / written.back()).string());
  f.write(text.data(), text.size());
  f.commit();
  return written;
}

}  // namespace quintet::data
