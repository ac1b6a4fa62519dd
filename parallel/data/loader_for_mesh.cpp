// The loader configuration of a mesh's rank (see loader_for_mesh.hpp).
#include "quintet/parallel/data/loader_for_mesh.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

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

}  // namespace quintet
