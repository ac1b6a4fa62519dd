#include "timing.hpp"

#include <algorithm>
#include <vector>

using namespace quintet;

double median_ms(const Stream& stream, int warmup, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<Event> start, stop;
  start.reserve(iters);
  stop.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    start.emplace_back(stream.device(), true);
    stop.emplace_back(stream.device(), true);
  }
  for (int i = 0; i < iters; ++i) {
    start[i].record(stream);
    fn();
    stop[i].record(stream);
  }
  stop.back().synchronize();
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) ms[i] = stop[i].elapsed_ms(start[i]);
  std::sort(ms.begin(), ms.end());
  return iters % 2 == 1 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
}
