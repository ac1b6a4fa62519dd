// The loader configuration of a mesh's rank (see loader_for_mesh.hpp).
#include "quintet/parallel/data_parallel/loader_for_mesh.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "quintet/core/error.hpp"

namespace quintet::data_parallel {

data::LoaderConfig loader_config_for(const Mesh& mesh, data::LoaderConfig config) {
  const int rank = mesh.rank(Axis::dp), size = mesh.size(Axis::dp);
  const bool untouched = config.dp_rank == 0 && config.dp_size == 1;
  QUINTET_CHECK(untouched || (config.dp_rank == rank && config.dp_size == size),
                "loader_config_for: the config says data-parallel rank {} of {}, but this rank "
                "is rank {} of {} on the mesh's dp axis; leave dp_rank and dp_size unset and let "
                "the mesh set them",
                config.dp_rank, config.dp_size, rank, size);
  config.dp_rank = rank;
  config.dp_size = size;
  return config;
}

void check_same_batch(Communicator& group, const Tensor& tokens, const Stream& stream) {
  QUINTET_CHECK(tokens.defined(), "check_same_batch: the tokens are an undefined tensor");
  const Tensor host = tokens.contiguous().to(Device::cpu(), stream);
  stream.synchronize();
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
  const auto* bytes = static_cast<const unsigned char*>(host.data_ptr());
  for (std::size_t i = 0; i < host.nbytes(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  // Shape and dtype too, so that a different batch size is a difference.
  for (std::int64_t d : host.shape()) h = (h ^ static_cast<std::uint64_t>(d)) * 1099511628211ull;
  h = (h ^ static_cast<std::uint64_t>(host.dtype())) * 1099511628211ull;
  // Through the group's device (an NCCL group moves GPU tensors only), on stream.
  const Device& device = group.device();
  const Tensor mine =
      Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(h)}, {1})
          .to(device, stream);
  Tensor all = Tensor::empty({group.size()}, DType::i64, device, stream);
  group.all_gather(mine, all, stream).wait(stream);
  const Tensor back = all.to(Device::cpu(), stream);
  stream.synchronize();
  const std::vector<std::int64_t> sums = back.to_vector<std::int64_t>();
  for (int r = 1; r < group.size(); ++r) {
    QUINTET_CHECK(sums[r] == sums[0],
                  "check_same_batch: on communicator '{}', rank {} holds other tokens than rank 0 "
                  "(checksums {:016x} and {:016x}); the ranks of one data-parallel replica must "
                  "read the same batches (configure the loader with loader_config_for(mesh, ...))",
                  group.name(), r, static_cast<std::uint64_t>(sums[r]),
                  static_cast<std::uint64_t>(sums[0]));
  }
}

}  // namespace quintet::data_parallel
