// GPU timing shared by 09_op_bench's modes.
#pragma once

#include <functional>

#include "quintet/core/stream.hpp"

// Median milliseconds per call of fn on stream: `warmup` untimed calls, then `iters` calls, each
// between its own pair of timing events.
double median_ms(const quintet::Stream& stream, int warmup, int iters,
                 const std::function<void()>& fn);
