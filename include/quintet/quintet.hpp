// Quintet: the whole public API in one include.
#pragma once

#include "quintet/core/allocator.hpp"
#include "quintet/core/config.hpp"
#include "quintet/core/device.hpp"
#include "quintet/core/dtype.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"
#include "quintet/core/random.hpp"
#include "quintet/core/runtime_config.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/collectives/bootstrap.hpp"
#include "quintet/collectives/communicator.hpp"
#include "quintet/collectives/mpi.hpp"
#include "quintet/collectives/work.hpp"
