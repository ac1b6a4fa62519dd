// A GPU kernel that runs for a given time, standing in for a training step (CUDA builds only).
#pragma once

typedef struct CUstream_st* cudaStream_t;

// Queues on stream one single-thread kernel that reads tokens[0] (so it depends on the batch's
// copy) and spins for ms milliseconds of GPU time (the %globaltimer clock).
void gpu_spin(double ms, const int* tokens, cudaStream_t stream);
