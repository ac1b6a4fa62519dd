// The token file writers of quintet/data/shard_writer.hpp, taking tokens as any integer NumPy
// array or sequence. A value outside [0, 2^32) is refused here; one too wide for the token type
// by the writer, before anything is written.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/data/shard_writer.hpp"
#include "quintet/data/synthetic.hpp"
#include "quintet_data/module_parts.hpp"

namespace py = pybind11;

namespace quintet::python {
namespace {

data::TokenType token_type_from(const std::string& name) {
  using data::TokenType;
  for (TokenType t : {TokenType::u8, TokenType::i8, TokenType::i16, TokenType::u16, TokenType::i32,
                      TokenType::u32, TokenType::i64, TokenType::f32, TokenType::f64}) {
    if (data::token_type_name(t) == name) return t;
  }
  QUINTET_CHECK(false,
                "unknown token_type '{}' (expected u8, i8, i16, u16, i32, u32, i64, f32 or f64)",
                name);
  return TokenType::u16;
}

template <class T>
void append_checked(const py::array& a, std::vector<std::uint32_t>* out) {
  const auto typed = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(a);
  const T* p = typed.data();
  out->reserve(static_cast<std::size_t>(typed.size()));
  for (py::ssize_t i = 0; i < typed.size(); ++i) {
    const T v = p[i];
    QUINTET_CHECK(
        v >= 0 && static_cast<std::uint64_t>(v) <= std::numeric_limits<std::uint32_t>::max(),
        "token {} at index {} is outside [0, 2^32)", static_cast<long long>(v), i);
    out->push_back(static_cast<std::uint32_t>(v));
  }
}

// Tokens as uint32 from an integer array or sequence (one dimension, or flattened).
std::vector<std::uint32_t> tokens_from(const py::object& tokens) {
  const py::array a = py::array::ensure(tokens);
  QUINTET_CHECK(a, "tokens must be an array or a sequence of integers");
  const char kind = a.dtype().kind();
  QUINTET_CHECK(kind == 'i' || kind == 'u' || (kind == 'O' && a.size() == 0),
                "tokens must be integers, got an array of dtype {}",
                std::string(py::str(a.dtype())));
  std::vector<std::uint32_t> out;
  if (a.size() == 0) return out;
  if (kind == 'u') {
    append_checked<std::uint64_t>(a, &out);
  } else {
    append_checked<std::int64_t>(a, &out);
  }
  return out;
}

}  // namespace

void bind_writers(py::module_& m) {
  m.def(
      "make_synthetic_dataset",
      [](const std::string& dir, int order, std::uint64_t seed, int train_shards,
         std::int64_t tokens_per_shard, std::int64_t val_tokens) {
        data::SyntheticConfig config;
        config.order = order;
        config.seed = seed;
        data::SyntheticDataset made;
        {
          py::gil_scoped_release release;
          made = data::ensure_synthetic_dataset(dir + "/" + config.describe(), config, train_shards,
                                                tokens_per_shard, val_tokens);
        }
        py::dict out;
        out["train"] = made.train;
        out["val"] = made.val;
        out["entropy_nats"] = made.entropy_nats;
        return out;
      },
      py::arg("dir"), py::arg("order") = 2, py::arg("seed") = 1234, py::arg("train_shards") = 4,
      py::arg("tokens_per_shard") = std::int64_t{1} << 23,
      py::arg("val_tokens") = std::int64_t{1} << 20,
      "Makes (or finds, when already made) the trainers' built-in synthetic dataset under "
      "dir/<its description>, the folder 04_gpt_train --data-dir dir uses: a dict of the train "
      "and val shard paths and the entropy floor in nats per token. Safe to call from several "
      "processes at once.");
  m.def(
      "write_quintet_shard",
      [](const std::string& path, const py::object& tokens, const std::string& token_type,
         const std::vector<std::int64_t>& document_offsets,
         const std::map<std::string, std::string>& metadata) {
        const std::vector<std::uint32_t> t = tokens_from(tokens);
        data::QuintetShardOptions options{token_type_from(token_type), document_offsets, metadata};
        py::gil_scoped_release release;
        data::write_quintet_shard(path, t.data(), static_cast<std::int64_t>(t.size()), options);
      },
      py::arg("path"), py::arg("tokens"), py::arg("token_type") = "u16",
      py::arg("document_offsets") = std::vector<std::int64_t>{},
      py::arg("metadata") = std::map<std::string, std::string>{},
      "Writes a Quintet shard (.qts) with its checksum. token_type 'u16' or 'u32'; "
      "document_offsets: the token index of each document start followed by the token count "
      "(empty: one document); metadata: str to str.");
  m.def(
      "write_llmc_shard",
      [](const std::string& path, const py::object& tokens, const std::string& token_type) {
        const std::vector<std::uint32_t> t = tokens_from(tokens);
        const data::TokenType type = token_type_from(token_type);
        py::gil_scoped_release release;
        data::write_llmc_shard(path, t.data(), static_cast<std::int64_t>(t.size()), type);
      },
      py::arg("path"), py::arg("tokens"), py::arg("token_type") = "u16",
      "Writes an llm.c shard: 'u16' the GPT-2 layout, 'u32' the Llama-3 one.");
  m.def(
      "write_megatron_dataset",
      [](const std::string& prefix, const py::object& tokens,
         const std::vector<std::int64_t>& document_offsets, const std::string& token_type) {
        const std::vector<std::uint32_t> t = tokens_from(tokens);
        const data::TokenType type = token_type_from(token_type);
        py::gil_scoped_release release;
        data::write_megatron_dataset(prefix, t.data(), static_cast<std::int64_t>(t.size()),
                                     document_offsets, type);
      },
      py::arg("prefix"), py::arg("tokens"),
      py::arg("document_offsets") = std::vector<std::int64_t>{}, py::arg("token_type") = "u16",
      "Writes <prefix>.bin and <prefix>.idx (a Megatron indexed dataset), one sequence per "
      "document.");
}

}  // namespace quintet::python
