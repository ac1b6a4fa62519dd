#include "quintet/parallel/checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "quintet/core/error.hpp"
#include "shard_file.hpp"

namespace quintet::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string shard_name(int rank) { return fmt::format("rank_{:05d}.qckpt", rank); }

// checkpoint.json's text as JSON; System naming the file when it is not.
nlohmann::ordered_json parse_metadata(const std::string& text, const std::string& file) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    QUINTET_THROW(System, "checkpoint: {} is not valid JSON: {}", file, e.what());
  }
}

// The XXH64 that checkpoint.json records for rank's shard (the one the shard must carry).
std::uint64_t recorded_checksum(const CheckpointInfo& checkpoint, int rank) {
  const nlohmann::ordered_json meta = parse_metadata(
      checkpoint.metadata_json, (fs::path(checkpoint.path) / "checkpoint.json").string());
  const std::string file = shard_name(rank);
  for (const auto& shard : meta.value("shards", nlohmann::ordered_json::array())) {
    if (!shard.is_object() || shard.value("file", "") != file) continue;
    const std::string sum = shard.value("xxh64", "");
    QUINTET_CHECK_CODE(sum.size() == 16, System, "checkpoint {}: no checksum for {}",
                       checkpoint.path, file);
    return std::stoull(sum, nullptr, 16);
  }
  QUINTET_THROW(System, "checkpoint {}: no entry for {}", checkpoint.path, file);
}

// Writes text to path and flushes it to the disk before returning.
void write_file_durably(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  QUINTET_CHECK_CODE(fd >= 0, System, "checkpoint: cannot create {}: {}", path.string(),
                     std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      QUINTET_THROW(System, "checkpoint: cannot write {}: {}", path.string(), std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  QUINTET_CHECK_CODE(synced, System, "checkpoint: cannot flush {}", path.string());
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: the renames are already atomic
  ::fsync(fd);
  ::close(fd);
}

// Sums local failure flags over comm: every rank learns how many ranks failed, and the first
// failing rank's index, so a local error never leaves the other ranks waiting.
struct Agreement {
  std::int64_t failures = 0;
  std::int64_t first_failed_rank = -1;
};

Agreement agree(Communicator& comm, bool ok) {
  const int n = comm.size();
  Tensor flags = Tensor::zeros({n}, DType::i64);
  flags.data<std::int64_t>()[comm.rank()] = ok ? 0 : 1;
  Tensor on_device = comm.device().is_cuda() ? flags.to(comm.device()) : flags;
  comm.all_reduce(on_device, ReduceOp::sum).synchronize();
  if (comm.device().is_cuda()) flags = on_device.to(Device::cpu());
  Agreement a;
  for (int r = 0; r < n; ++r) {
    if (flags.data<std::int64_t>()[r] != 0) {
      ++a.failures;
      if (a.first_failed_rank < 0) a.first_failed_rank = r;
    }
  }
  return a;
}

// Runs fn; if it or any other rank fails, every rank throws (the failing rank its own error).
template <class Fn>
void run_agreed(Communicator& comm, const char* what, Fn&& fn) {
  std::exception_ptr failure;
  try {
    fn();
  } catch (...) {
    failure = std::current_exception();
  }
  const Agreement a = agree(comm, failure == nullptr);
  if (failure) std::rethrow_exception(failure);
  QUINTET_CHECK_CODE(a.failures == 0, Remote, "{}: {} rank(s) failed, first rank {}", what,
                     a.failures, a.first_failed_rank);
}

// checkpoint.json's integer field key; System naming the file when it is missing.
std::int64_t read_int_field(const nlohmann::ordered_json& meta, const std::string& key,
                            const std::string& path) {
  const auto it = meta.find(key);
  QUINTET_CHECK_CODE(it != meta.end() && it->is_number_integer(), System,
                     "checkpoint {}: no integer \"{}\" field", path, key);
  return it->get<std::int64_t>();
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  QUINTET_CHECK_CODE(in.good(), System, "checkpoint: cannot read {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string checkpoint_name(std::int64_t step) { return fmt::format("step_{:06d}", step); }

std::vector<std::string> prune_checkpoints(const std::string& dir, int keep_last) {
  QUINTET_CHECK(keep_last >= 1, "prune_checkpoints: keep_last = {}; expected >= 1", keep_last);
  const fs::path root(dir);
  if (!fs::exists(root)) return {};
  std::string latest;
  if (fs::exists(root / "latest")) {
    latest = read_text(root / "latest");
    while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  }
  // step_NNNNNN names sort as their steps (fixed width).
  std::vector<std::string> complete;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.size() == 11 && name.rfind("step_", 0) == 0 &&
        name.find_first_not_of("0123456789", 5) == std::string::npos) {
      complete.push_back(name);
    }
  }
  std::sort(complete.begin(), complete.end());
  std::vector<std::string> removed;
  const std::size_t keep = static_cast<std::size_t>(keep_last);
  for (std::size_t i = 0; i + keep < complete.size(); ++i) {
    if (complete[i] == latest) continue;
    std::error_code ec;
    fs::remove_all(root / complete[i], ec);
    QUINTET_CHECK_CODE(!ec, System, "prune_checkpoints: cannot remove {}: {}",
                       (root / complete[i]).string(), ec.message());
    removed.push_back(complete[i]);
  }
  return removed;
}

void run_on_every_rank(Communicator& comm, const char* what, const std::function<void()>& fn) {
  run_agreed(comm, what, fn);
}

void save_checkpoint(const std::string& dir, std::int64_t step,
                     const std::vector<NamedTensor>& tensors, const std::string& metadata_json,
                     Communicator& comm, const Stream& stream,
                     const std::function<void()>& before_commit) {
  QUINTET_CHECK(!dir.empty(), "save_checkpoint: empty directory name");
  QUINTET_CHECK(step >= 0, "save_checkpoint: step = {}; expected >= 0", step);
  QUINTET_CHECK(!metadata_json.empty(), "save_checkpoint: empty metadata; pass a JSON value");
  nlohmann::ordered_json user;
  try {
    user = nlohmann::ordered_json::parse(metadata_json);
  } catch (const nlohmann::json::exception& e) {
    QUINTET_THROW(InvalidArgument, "save_checkpoint: the metadata is not a JSON value ({}): {}",
                  e.what(), metadata_json);
  }
  std::set<std::string> names;
  for (const auto& t : tensors) {
    QUINTET_CHECK(!t.name.empty() && t.name.find_first_of(" \n\t") == std::string::npos,
                  "save_checkpoint: tensor name '{}' must be non-empty without spaces", t.name);
    QUINTET_CHECK(names.insert(t.name).second, "save_checkpoint: two tensors are named {}", t.name);
    QUINTET_CHECK(t.tensor.defined(), "save_checkpoint: tensor {} is undefined", t.name);
  }

  const fs::path root(dir);
  const fs::path partial = root / (".partial-" + checkpoint_name(step));
  const fs::path final_dir = root / checkpoint_name(step);
  const int rank = comm.rank();

  // Rank 0 clears what an earlier, interrupted save of this step left.
  run_agreed(comm, "save_checkpoint: preparing the directory", [&] {
    if (rank == 0) {
      fs::create_directories(root);
      fs::remove_all(partial);
      fs::create_directories(partial);
    }
  });
  std::uint64_t checksum = 0;
  std::uint64_t bytes = 0;
  run_agreed(comm, "save_checkpoint: writing shards", [&] {
    const ShardSummary s = write_shard(partial / shard_name(rank), tensors, stream,
                                       [rank] { save_point("shard", rank); });
    checksum = s.checksum;
    bytes = s.bytes;
  });

  // Rank 0 lists every shard's checksum in the metadata.
  Tensor mine = Tensor::from_vector<std::int64_t>(
      {static_cast<std::int64_t>(checksum), static_cast<std::int64_t>(bytes)}, {2});
  Tensor all = Tensor::empty({2 * comm.size()}, DType::i64);
  if (comm.device().is_cuda()) {
    Tensor d_all = Tensor::empty({2 * comm.size()}, DType::i64, comm.device());
    comm.all_gather(mine.to(comm.device()), d_all).synchronize();
    all = d_all.to(Device::cpu());
  } else {
    comm.all_gather(mine, all).synchronize();
  }

  save_point("before_commit", rank);
  if (before_commit) before_commit();
  run_agreed(comm, "save_checkpoint: committing", [&] {
    if (rank != 0) return;
    nlohmann::ordered_json meta{{"format", "quintet-checkpoint-1"},
                                {"step", step},
                                {"world_size", comm.size()},
                                {"shards", nlohmann::ordered_json::array()}};
    for (int r = 0; r < comm.size(); ++r) {
      meta["shards"].push_back(
          {{"rank", r},
           {"file", shard_name(r)},
           {"bytes", all.data<std::int64_t>()[2 * r + 1]},
           {"xxh64",
            fmt::format("{:016x}", static_cast<std::uint64_t>(all.data<std::int64_t>()[2 * r]))}});
    }
    meta["user"] = std::move(user);
    const std::string json = meta.dump(2) + "\n";
    write_file_durably(partial / "checkpoint.json", json);
    sync_directory(partial);
    save_point("metadata", rank);
    // Re-saving a step replaces it; `latest` is only moved after the new one is in place.
    if (fs::exists(final_dir)) fs::remove_all(final_dir);
    fs::rename(partial, final_dir);
    save_point("rename", rank);
    write_file_durably(root / "latest.tmp", checkpoint_name(step) + "\n");
    fs::rename(root / "latest.tmp", root / "latest");
    sync_directory(root);
  });
}

std::optional<CheckpointInfo> latest_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  const fs::path latest = root / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::string name = read_text(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  QUINTET_CHECK_CODE(!name.empty() && name.find('/') == std::string::npos, System,
                     "checkpoint: {} does not name a checkpoint ('{}')", latest.string(), name);
  CheckpointInfo info;
  info.path = (root / name).string();
  const fs::path meta = root / name / "checkpoint.json";
  QUINTET_CHECK_CODE(fs::exists(meta), System,
                     "checkpoint: {} names {}, which has no checkpoint.json", latest.string(),
                     info.path);
  info.metadata_json = read_text(meta);
  const nlohmann::ordered_json parsed = parse_metadata(info.metadata_json, meta.string());
  QUINTET_CHECK_CODE(parsed.is_object(), System, "checkpoint {}: checkpoint.json is not an object",
                     meta.string());
  info.step = read_int_field(parsed, "step", meta.string());
  info.world_size = static_cast<int>(read_int_field(parsed, "world_size", meta.string()));
  const auto user = parsed.find("user");
  QUINTET_CHECK_CODE(user != parsed.end(), System, "checkpoint {}: no \"user\" field",
                     meta.string());
  info.user_json = user->dump();
  return info;
}

void load_checkpoint(const CheckpointInfo& checkpoint, const std::vector<NamedTensor>& tensors,
                     Communicator& comm, const Stream& stream) {
  QUINTET_CHECK(checkpoint.world_size == comm.size(),
                "load_checkpoint: {} was saved by {} ranks, this job has {}; resume with the same "
                "number of ranks and the same layout",
                checkpoint.path, checkpoint.world_size, comm.size());
  run_agreed(comm, "load_checkpoint", [&] {
    const fs::path shard = fs::path(checkpoint.path) / shard_name(comm.rank());
    read_shard(shard, recorded_checksum(checkpoint, comm.rank()), tensors, stream);
  });
}

std::string shard_path(const CheckpointInfo& checkpoint, int rank) {
  return (fs::path(checkpoint.path) / shard_name(rank)).string();
}

ShardIndex read_shard_index(const CheckpointInfo& checkpoint, int rank) {
  return read_shard_index(fs::path(shard_path(checkpoint, rank)));
}

Tensor read_shard_tensor(const CheckpointInfo& checkpoint, int rank, const ShardIndex& index,
                         const ShardEntry& entry) {
  return read_shard_tensor(fs::path(shard_path(checkpoint, rank)), index, entry);
}

void verify_checkpoint(const CheckpointInfo& checkpoint) {
  for (int r = 0; r < checkpoint.world_size; ++r) {
    const fs::path path = shard_path(checkpoint, r);
    const std::uint64_t actual = shard_file_checksum(path);
    const std::uint64_t expected = recorded_checksum(checkpoint, r);
    QUINTET_CHECK_CODE(actual == expected, System,
                       "checkpoint: shard {} is corrupt: XXH64 {:016x}, checkpoint.json says "
                       "{:016x}",
                       path.string(), actual, expected);
    const ShardIndex index = read_shard_index(path);
    for (const ShardEntry& e : index.entries) (void)read_shard_tensor(path, index, e);
  }
}

}  // namespace quintet::checkpoint
