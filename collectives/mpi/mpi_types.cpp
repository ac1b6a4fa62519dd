#include "collectives/mpi/mpi_types.hpp"

#include <mutex>

#include "quintet/core/error.hpp"

namespace quintet::detail {

namespace {

// Reduces 16-bit floats through float, rounding once per pairwise step as a GPU kernel would.
template <class T, ReduceOp Op>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = convert_scalar<float>(a[i]);
    const float y = convert_scalar<float>(b[i]);
    float r;
    if constexpr (Op == ReduceOp::sum) {
      r = x + y;
    } else if constexpr (Op == ReduceOp::prod) {
      r = x * y;
    } else if constexpr (Op == ReduceOp::max) {
      r = (x != x || x > y) ? x : y;  // NaN propagates, as in CUDA's fmaxf-free comparison
    } else {
      r = (x != x || x < y) ? x : y;
    }
    b[i] = convert_scalar<T>(r);
  }
}

struct UserOps {
  MPI_Op bf16[4];  // sum, prod, max, min
  MPI_Op f16[4];
};

template <class T>
void create_ops(MPI_Op (&ops)[4]) {
  QUINTET_MPI_CHECK(MPI_Op_create(&reduce_16bit<T, ReduceOp::sum>, 1, &ops[0]));
  QUINTET_MPI_CHECK(MPI_Op_create(&reduce_16bit<T, ReduceOp::prod>, 1, &ops[1]));
  QUINTET_MPI_CHECK(MPI_Op_create(&reduce_16bit<T, ReduceOp::max>, 1, &ops[2]));
  QUINTET_MPI_CHECK(MPI_Op_create(&reduce_16bit<T, ReduceOp::min>, 1, &ops[3]));
}

// Created once per process and never freed: MPI frees them at MPI_Finalize.
const UserOps& user_ops() {
  static std::once_flag once;
  static UserOps ops;
  std::call_once(once, [] {
    create_ops<BFloat16>(ops.bf16);
    create_ops<Half>(ops.f16);
  });
  return ops;
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return 0;
    case ReduceOp::prod:
      return 1;
    case ReduceOp::max:
      return 2;
    case ReduceOp::min:
      return 3;
  }
  return 0;
}

}  // namespace
}  // namespace quintet::detail

namespace quintet {

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::u16:
    case DType::f16:
    case DType::bf16:
      return MPI_UINT16_T;
  }
  QUINTET_THROW(InvalidArgument, "no MPI datatype for dtype {}", static_cast<int>(dtype));
}

MPI_Op mpi_op(DType dtype, ReduceOp op) {
  if (dtype == DType::bf16) return detail::user_ops().bf16[detail::op_index(op)];
  if (dtype == DType::f16) return detail::user_ops().f16[detail::op_index(op)];
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return MPI_SUM;
    case ReduceOp::prod:
      return MPI_PROD;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace quintet

namespace quintet::detail {

void divide_by(void* data, DType dtype, std::int64_t count, int divisor) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(data);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T d = static_cast<T>(divisor);
      for (std::int64_t i = 0; i < count; ++i) p[i] /= d;
    } else if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      const float d = static_cast<float>(divisor);
      for (std::int64_t i = 0; i < count; ++i)
        p[i] = convert_scalar<T>(convert_scalar<float>(p[i]) / d);
    } else {
      QUINTET_THROW(InvalidArgument, "avg on integer dtype {}", dtype_name(dtype));
    }
  });
}

}  // namespace quintet::detail
