// make_dataset: writes token shards (Quintet .qts) for the loader and the trainer.
//
//   make_dataset text --out data/mytext a.txt b.txt ...   byte-level tokens (vocabulary 256):
//                                                        one document per file, shards of
//                                                        --shard-tokens tokens
//   make_dataset synthetic --out data/synthetic          the built-in dataset (see
//                                                        quintet/data/synthetic.hpp) with its
//                                                        exact entropy floor in the metadata
//   add --json for one JSON object per written shard.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/data/shard_writer.hpp"
#include "quintet/data/synthetic.hpp"

using namespace quintet;
using namespace quintet::data;

namespace {

void announce(bool json, const std::string& path, std::int64_t tokens, std::size_t docs,
              const std::string& extra = "") {
  if (json) {
    fmt::print("{}\n",
               nlohmann::json{{"path", path}, {"tokens", tokens}, {"documents", docs}}.dump());
  } else {
    fmt::print("wrote {} ({} tokens, {} documents{})\n", path, tokens, docs, extra);
  }
}

void make_text(const std::vector<std::string>& inputs, const std::string& out,
               std::int64_t shard_tokens, bool json) {
  QUINTET_CHECK(shard_tokens >= 2, "--shard-tokens {} must be >= 2", shard_tokens);
  std::filesystem::create_directories(out);
  std::vector<std::uint32_t> tokens;
  std::vector<std::int64_t> docs{0};
  int shard = 0;
  auto flush = [&] {
    if (tokens.empty()) return;
    if (docs.back() != static_cast<std::int64_t>(tokens.size())) {
      docs.push_back(static_cast<std::int64_t>(tokens.size()));
    }
    QuintetShardOptions opt;
    opt.document_offsets = docs;
    opt.metadata = {{"tokenizer", "bytes"}, {"vocab_size", "256"}, {"source", "text"}};
    const std::string path = fmt::format("{}/train_{:03d}.qts", out, shard++);
    write_quintet_shard(path, tokens.data(), static_cast<std::int64_t>(tokens.size()), opt);
    announce(json, path, static_cast<std::int64_t>(tokens.size()), docs.size() - 1);
    tokens.clear();
    docs = {0};
  };
  for (const std::string& in : inputs) {
    std::ifstream f(in, std::ios::binary);
    if (!f) QUINTET_THROW(System, "cannot read {}: {}", in, std::strerror(errno));
    char c;
    while (f.get(c)) {
      tokens.push_back(static_cast<unsigned char>(c));
      if (static_cast<std::int64_t>(tokens.size()) == shard_tokens) flush();
    }
    if (!tokens.empty() && docs.back() != static_cast<std::int64_t>(tokens.size())) {
      docs.push_back(static_cast<std::int64_t>(tokens.size()));  // the file is one document
    }
  }
  flush();
  QUINTET_CHECK(shard > 0, "the input files hold no bytes: nothing written");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"make_dataset: token shards for Quintet"};
  app.require_subcommand(1);
  bool json = false;
  app.add_flag("--json", json, "one JSON object per written shard");

  auto* text = app.add_subcommand("text", "byte-level shards (vocabulary 256) from text files");
  std::string text_out = "data/text";
  std::int64_t text_shard_tokens = std::int64_t{1} << 26;
  std::vector<std::string> inputs;
  text->add_option("--out", text_out, "output directory");
  text->add_option("--shard-tokens", text_shard_tokens, "tokens per shard");
  text->add_option("files", inputs, "text files, one document each")->required();
  text->add_flag("--json", json, "one JSON object per written shard");

  auto* synth = app.add_subcommand("synthetic", "the built-in synthetic dataset");
  SyntheticConfig cfg;
  std::string synth_out = "data/synthetic";
  int shards = 4;
  std::int64_t shard_tokens = std::int64_t{1} << 23, val_tokens = std::int64_t{1} << 20;
  synth->add_option("--out", synth_out, "output directory");
  synth->add_option("--shards", shards, "training shards");
  synth->add_option("--shard-tokens", shard_tokens, "tokens per training shard");
  synth->add_option("--val-tokens", val_tokens, "tokens of the validation shard");
  synth->add_option("--seed", cfg.seed, "seed");
  synth->add_option("--vocab", cfg.vocab_size, "vocabulary size (the last token is the marker)");
  synth->add_option("--order", cfg.order, "Markov order");
  synth->add_option("--classes", cfg.context_classes, "context classes");
  synth->add_option("--branches", cfg.branches, "successors per context");
  synth->add_option("--zipf", cfg.zipf_exponent, "successor probabilities ~ (i+1)^-zipf");
  synth->add_option("--copy-prob", cfg.copy_prob, "probability of a copy event");
  synth->add_option("--copy-len", cfg.copy_len, "tokens per copy");
  synth->add_option("--offsets", cfg.num_offsets, "number of copy distances");
  synth->add_option("--min-distance", cfg.min_distance, "shortest copy distance");
  synth->add_option("--distance-step", cfg.distance_step, "spacing of copy distances");
  synth->add_flag("--json", json, "one JSON object per written shard");
  CLI11_PARSE(app, argc, argv);

  try {
    if (*text) {
      make_text(inputs, text_out, text_shard_tokens, json);
    } else {
      const SyntheticDataset d =
          ensure_synthetic_dataset(synth_out, cfg, shards, shard_tokens, val_tokens);
      const std::string floor = fmt::format(", entropy floor {:.6f} bits = {:.6f} nats per token",
                                            d.entropy_bits, d.entropy_nats);
      for (const auto& p : d.train) announce(json, p, shard_tokens, 1, floor);
      for (const auto& p : d.val) announce(json, p, val_tokens, 1, floor);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_dataset: %s\n", e.what());
    return 1;
  }
  return 0;
}
