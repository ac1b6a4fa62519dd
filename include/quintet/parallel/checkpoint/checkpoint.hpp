// Checkpoints of a sharded training job: every rank writes its own tensors (its parameter shard,
// its optimizer state), rank 0 writes one metadata file, and the checkpoint becomes visible only
// once every rank has finished, so an interrupted save never replaces a good checkpoint.
//
//   dir/
//     latest                  one line: the name of the newest complete checkpoint ("step_000020")
//     step_000020/
//       checkpoint.json       step, world size, each shard's bytes and XXH64, and the caller's
//                             metadata (config, layout, data position) under "user"
//       rank_00000.qckpt ...  one shard per rank
//     .partial-step_000030/   a save in progress (or killed): never read
//
// A save writes everything under dir/.partial-step_N/, agrees over the communicator that every
// rank succeeded, and then rank 0 writes checkpoint.json, renames the directory to step_N and
// replaces `latest` by rename (both atomic on POSIX file systems). A rank that fails makes every
// rank throw (no rank waits forever). Loading reads `latest` only, and checks each shard's
// checksum, tensor names, dtypes and shapes against what the caller expects.
//
// Fault tests: a save passes named points ("shard": a shard half written, "before_commit",
// "metadata": rank 0 has written checkpoint.json but not renamed the directory, "rename": the
// directory renamed, `latest` not yet moved), where a hook the program installs
// (set_save_point_hook) may kill the process. Whatever the point, `latest` still names the
// previous checkpoint, which loads. (04_gpt_train installs one from QUINTET_CHECKPOINT_FAULT.)
//
// Shard format (rank_NNNNN.qckpt): "QNTCKPT2", u64 header length, a header of one line per tensor
// ("name dtype d0,d1,... byte_offset byte_count xxh64"), the header's XXH64, the raw
// little-endian payload, then the XXH64 of everything before it. Each tensor's own XXH64 lets a
// reader that reads only some tensors (a resharding restore) verify what it read. Tensors are
// saved in their own dtype (bf16 stays bf16). Version 1 ("QNTCKPT1": no per-tensor or header
// checksums) is still read.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"

namespace quintet::checkpoint {

// A tensor saved or restored under a name unique within a rank's shard.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// Saves step's checkpoint into dir (created if absent). Collective over comm (every rank calls it
// with its own tensors; comm is the whole job, CPU or GPU). metadata_json must be a JSON value
// (an object, typically); it is stored under "user" (as JSON: its formatting is not kept). Tensors
// on a GPU are copied to the host after the work queued on stream. Throws InvalidArgument (before
// any communication) for an empty dir, a negative step, metadata that is not JSON, or
// duplicate/empty tensor names; System when a file cannot be
// written; Remote on the ranks whose peers failed. before_commit, when given, runs on every rank
// once all shards are written and agreed, just before rank 0 commits (for logging, or for tests
// that stop a save midway).
void save_checkpoint(const std::string& dir, std::int64_t step,
                     const std::vector<NamedTensor>& tensors, const std::string& metadata_json,
                     Communicator& comm, const Stream& stream = Stream(),
                     const std::function<void()>& before_commit = {});

// Called at each named point of every save of this process (above: "shard", "before_commit",
// "metadata", "rename"), with the point and the saving rank's rank in the save's communicator,
// from the thread that saves (an asynchronous save's own thread too). For fault tests: it may end
// the process; it must not throw.
using SavePointHook = std::function<void(std::string_view point, int rank)>;
// Installs hook for the whole process (an empty one removes it). Thread-safe; a save already
// running may still call the previous hook.
void set_save_point_hook(SavePointHook hook);

// A complete checkpoint found on disk.
struct CheckpointInfo {
  std::string path;  // dir/step_NNNNNN
  std::int64_t step = 0;
  int world_size = 0;         // ranks that saved it
  std::string metadata_json;  // the whole checkpoint.json text (the caller's part under "user")
  std::string user_json;      // the caller's part: save_checkpoint's metadata_json, as compact JSON
};

// The checkpoint `dir/latest` names, or nullopt when there is none (no dir, no `latest`).
// Throws System when `latest` names a checkpoint whose checkpoint.json is missing or unreadable.
// Local: no communication.
std::optional<CheckpointInfo> latest_checkpoint(const std::string& dir);

// Restores this rank's tensors from checkpoint. Collective over comm. Every tensor must be in the
// shard with the same dtype and shape (copied in place, on stream for GPU tensors); the shard's
// checksum is verified first. Throws InvalidArgument when comm's size differs from the
// checkpoint's world size or a tensor is missing or mismatched (the message names it), System for
// a corrupt or unreadable shard; Remote on ranks whose peers failed.
void load_checkpoint(const CheckpointInfo& checkpoint, const std::vector<NamedTensor>& tensors,
                     Communicator& comm, const Stream& stream = Stream());

// "step_000020" for 20: the directory name of a checkpoint.
std::string checkpoint_name(std::int64_t step);

// Removes the complete checkpoints of dir (step_NNNNNN) but the newest keep_last and the one
// `latest` names; leaves partial saves, `latest` and anything else alone. Returns the names
// removed, oldest first. Local (no communication): call it on one rank (the one that commits) of
// a job whose ranks share dir. Throws InvalidArgument for keep_last < 1, System when a
// checkpoint cannot be removed.
std::vector<std::string> prune_checkpoints(const std::string& dir, int keep_last);

// Runs fn on this rank; when it throws on any rank of comm, every rank throws: the failing rank
// its own error, the others Remote naming how many failed and the first of them. Collective over
// comm (one small all-reduce after fn), so that an error on one rank never leaves the others
// waiting in their next collective.
void run_on_every_rank(Communicator& comm, const char* what, const std::function<void()>& fn);

// ---- Reading parts of a checkpoint (local: no communication) ----

// One tensor of a shard, as its header lists it.
struct ShardEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t offset = 0;  // in the payload
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;  // XXH64 of its bytes (version 2)
  bool has_checksum = false;
};
struct ShardIndex {
  std::vector<ShardEntry> entries;
  std::uint64_t payload_offset = 0;  // in the file
  std::uint64_t file_bytes = 0;
};

// The path of rank's shard in checkpoint.
std::string shard_path(const CheckpointInfo& checkpoint, int rank);
// rank's shard's tensors, from its header only (its checksum verified). Throws System for a
// missing, truncated or corrupt file, naming it.
ShardIndex read_shard_index(const CheckpointInfo& checkpoint, int rank);
// One tensor of rank's shard as a CPU tensor, its checksum verified (System, naming the file, the
// tensor and both checksums, when it differs).
Tensor read_shard_tensor(const CheckpointInfo& checkpoint, int rank, const ShardIndex& index,
                         const ShardEntry& entry);
// Reads every byte of every shard and checks each file's XXH64 against its trailer and
// checkpoint.json, and each tensor's against the header. Throws System naming the first bad file.
void verify_checkpoint(const CheckpointInfo& checkpoint);

}  // namespace quintet::checkpoint
