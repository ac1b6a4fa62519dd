// 05_moe_train: the mixture-of-experts GPT trainer. 04_gpt_train's program (trainer.cpp) over
// the MoE preset of the job config: every block's MLP is an MoE layer (8 experts, top-2) spread
// over --ep and split over --etp, with the MoE flags and the per-step MoE telemetry (tokens per
// expert, dropped tokens, aux and z losses); every 04 flag works too.
//
//   mpirun -np 4 05_moe_train --dp 2 --ep 2 --device cpu --steps 100
//   mpirun -np 8 05_moe_train --tp 2 --sp --pp 2 --dp 2 --ep 2 --zero 1 --layers 4 --device cpu
#include "trainer.hpp"

int main(int argc, char** argv) {
  return gpt::train_main(argc, argv,
                         {"05_moe_train",
                          "Train a mixture-of-experts GPT under any dp x tp (+sp) x ep x pp x cp "
                          "layout, on CPU or GPU",
                          quintet::train::JobConfig::moe_preset()});
}
