#include "timing.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "quintet/core/tensor.hpp"

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

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

CopyBound copy_bound(const Stream& s, std::int64_t bytes, int warmup, int iters) {
  const Device gpu = s.device();
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, gpu.index()), "cudaGetDeviceProperties");
  const Tensor src = Tensor::zeros({bytes}, DType::u8, gpu);
  const Tensor dst = Tensor::zeros({bytes}, DType::u8, gpu);
  Stream::default_stream(gpu).synchronize();
  CopyBound b;
  b.gpu = prop.name;
  b.ms = median_ms(s, warmup, iters, [&] {
    check_cuda(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<std::size_t>(bytes),
                               cudaMemcpyDeviceToDevice, s.handle()),
               "cudaMemcpyAsync");
  });
  b.gbps = 2.0 * static_cast<double>(bytes) / b.ms * 1e-6;
  return b;
}
