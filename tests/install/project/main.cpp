// Uses the installed headers and library: a tensor, a view, a conversion and an error.
#include <quintet/quintet.hpp>

#include <cstdio>

int main() {
  quintet::Tensor t = quintet::Tensor::arange(6).view({2, 3});
  const double corner = t.transpose(0, 1).to(quintet::DType::bf16).item({2, 1});
  try {
    (void)t.view({4, 2});
    return 1;
  } catch (const quintet::Error& e) {
    std::printf("rejected as expected: %s\n", e.what());
  }
  std::printf("quintet %s: corner %.1f\n", QUINTET_VERSION_STRING, corner);
  return corner == 5.0 ? 0 : 1;
}
