// safetensors: files and sharded checkpoints round-trip through the writer and the mmap reader
// (whole tensors, boxes, dtype conversions), and every kind of malformed file or index, built here
// byte by byte, is refused at open with a message naming the file and the tensor.
#include "quintet/data/safetensors.hpp"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/catch.hpp"

using namespace quintet;
using namespace quintet::data;
namespace fs = std::filesystem;

namespace {

// A folder of this process's files, removed at exit.
std::string temp_dir() {
  struct Dir {
    std::string path;
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir = [] {
    const fs::path d =
        fs::temp_directory_path() / ("quintet_safetensors_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return Dir{d.string()};
  }();
  return dir.path;
}

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file built by hand: the header length, header (padded with spaces to 8 bytes when asked), then
// data_bytes bytes counting up from 1.
std::string file_bytes(const std::string& header, std::size_t data_bytes, bool pad = true) {
  std::string h = header;
  if (pad) h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  out += h;
  for (std::size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<char>(i + 1));
  return out;
}
std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = temp_dir() + "/" + name;
  write_all(path, bytes);
  return path;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

std::vector<NamedTensor> sample_tensors() {
  return {
      {"model.embed_tokens.weight", Tensor::randn({7, 5}, 1, DType::bf16)},
      {"model.layers.0.mlp.up_proj.weight", Tensor::randn({6, 3, 2}, 2)},
      {"model.norm.weight", Tensor::randn({5}, 3, DType::f16)},
      {"scale", Tensor::randn({}, 4, DType::f64)},
      {"positions", Tensor::arange(9, DType::i64)},
      {"counts", Tensor::arange(3, DType::i32)},
      {"mask", Tensor::arange(5, DType::u8)},
      {"ids", Tensor::arange(3, DType::u16)},
      {"empty", Tensor::empty({0, 4})},
  };
}

}  // namespace

TEST_CASE("a file round-trips every dtype, bit for bit, in the reference writer's layout") {
  const auto tensors = sample_tensors();
  const std::string path = temp_dir() + "/roundtrip.safetensors";
  write_safetensors(path, tensors, {{"format", "pt"}, {"step", "12"}});

  const auto bytes = read_all(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);  // padded with spaces so the data starts aligned
  CHECK(bytes[8 + n - 1] == ' ');

  const SafetensorsFile f = SafetensorsFile::open(path);
  CHECK(f.metadata() == SafetensorsMetadata{{"format", "pt"}, {"step", "12"}});
  CHECK(f.entries().size() == tensors.size());
  CHECK(f.data_bytes() == bytes.size() - 8 - n);
  // Larger elements first, then by name.
  std::size_t last = 8;
  for (const SafetensorsEntry& e : f.entries()) {
    const std::size_t size = dtype_size(e.dtype);
    CHECK(size <= last);
    CHECK(e.begin % size == 0);
    last = size;
  }
  for (const NamedTensor& t : tensors) {
    INFO(t.name);
    const SafetensorsEntry& e = f.entry(t.name);
    CHECK(e.dtype == t.tensor.dtype());
    CHECK(e.dtype_name == safetensors_dtype_name(t.tensor.dtype()));
    CHECK(e.shape == t.tensor.shape());
    CHECK(same_bytes(f.read(t.name), t.tensor));
  }
  CHECK(f.entry("model.embed_tokens.weight").dtype_name == "BF16");
}

TEST_CASE("reads convert to the dtype asked for, as Tensor::to does") {
  const std::string path = temp_dir() + "/convert.safetensors";
  const Tensor w_bf16 = Tensor::randn({4, 6}, 11, DType::bf16);
  const Tensor w_f32 = Tensor::randn({4, 6}, 12);
  write_safetensors(path, {{"a", w_bf16}, {"b", w_f32}});
  const SafetensorsFile f = SafetensorsFile::open(path);

  const Tensor a = f.read("a", DType::f32);  // BF16 on disk -> f32 master weights
  REQUIRE(a.dtype() == DType::f32);
  const auto bits = w_bf16.to_vector<BFloat16>();
  const auto got = a.to_vector<float>();
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == from_bf16(bits[i]));

  const Tensor b = f.read("b", DType::bf16);  // rounds to nearest even
  const auto want = w_f32.to_vector<float>();
  const auto b_bits = b.to_vector<BFloat16>();
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(b_bits[i].bits == to_bf16(want[i]).bits);
}

TEST_CASE("a box reads the same elements as a slice of the whole tensor") {
  const std::string path = temp_dir() + "/box.safetensors";
  const Tensor w = Tensor::randn({6, 5, 4}, 21);
  const Tensor m = Tensor::randn({8, 10}, 22, DType::bf16);
  write_safetensors(path, {{"w", w}, {"m", m}});
  const SafetensorsFile f = SafetensorsFile::open(path);

  // Rows (one contiguous run), columns (one run per row), and a box of all three dimensions.
  CHECK(same_bytes(f.read_box("m", {{2, 5}}, DType::bf16), m.slice(0, 2, 5)));
  CHECK(same_bytes(f.read_box("m", {{0, 8}, {3, 7}}, DType::bf16), m.slice(1, 3, 7)));
  CHECK(same_bytes(f.read_box("m", {{1, 4}, {9, 10}}, DType::f32),
                   m.slice(0, 1, 4).slice(1, 9, 10).to(DType::f32)));
  CHECK(same_bytes(f.read_box("w", {{1, 5}, {2, 4}, {1, 3}}, DType::f32),
                   w.slice(0, 1, 5).slice(1, 2, 4).slice(2, 1, 3)));
  CHECK(same_bytes(f.read_box("w", {{3, 4}, {0, 5}, {0, 4}}, DType::f32), w.slice(0, 3, 4)));
  CHECK(f.read_box("w", {{2, 2}}, DType::f32).shape() == Shape{0, 5, 4});

  REQUIRE_THROWS_QUINTET(f.read_box("w", {{1, 7}}, DType::f32), InvalidArgument,
                         "range [1, 7) of dimension 0 is outside its shape [6, 5, 4]");
  REQUIRE_THROWS_QUINTET(f.read_box("m", {{0, 1}, {0, 1}, {0, 1}}, DType::f32), InvalidArgument,
                         "3 ranges for a tensor of shape [8, 10]");
  REQUIRE_THROWS_QUINTET(f.read("nope"), InvalidArgument, "has no tensor nope (it holds: m, w)");
}

TEST_CASE("a read in the file's dtype is a copy-on-write view of the mapping") {
  const std::string path = temp_dir() + "/view.safetensors";
  const Tensor w = Tensor::randn({4, 3}, 31);
  write_safetensors(path, {{"w", w}});
  const auto before = read_all(path);

  const SafetensorsFile f = SafetensorsFile::open(path);
  Tensor rows = f.read_box("w", {{1, 3}}, DType::f32);
  rows.at<float>({0, 0}) = 42.0f;
  // The next read of the same mapping sees the write (it was a view, not a copy) ...
  CHECK(f.read("w").at<float>({1, 0}) == 42.0f);
  // ... while a converted read is a copy, and the file itself is untouched.
  Tensor copy = f.read("w", DType::f64);
  copy.at<double>({2, 2}) = -1.0;
  CHECK(f.read("w").at<float>({2, 2}) == w.at<float>({2, 2}));
  CHECK(read_all(path) == before);
  CHECK(SafetensorsFile::open(path).read("w").at<float>({1, 0}) == w.at<float>({1, 0}));
}

TEST_CASE("unaligned data and dtypes Quintet has no type for") {
  // A header left unpadded (some writers do) puts the F32 data at an odd address: read as a copy.
  const float values[3] = {1.5f, -2.25f, 3.0f};
  std::string bytes = file_bytes(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", 0,
                                 /*pad=*/false);
  REQUIRE((bytes.size() - 8) % 4 != 0);
  bytes.append(reinterpret_cast<const char*>(values), sizeof values);
  const std::string path = write_file("unaligned.safetensors", bytes);
  CHECK(SafetensorsFile::open(path).read("x").to_vector<float>() ==
        std::vector<float>(values, values + 3));

  // Every dtype of the format opens; those without a DType fail only when read.
  const std::string other =
      write_file("other.safetensors",
                 file_bytes(R"({"q":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[0,4]},)"
                            R"("n":{"dtype":"F4","shape":[6],"data_offsets":[4,7]},)"
                            R"("u":{"dtype":"U32","shape":[1],"data_offsets":[7,11]}})",
                            11));
  const SafetensorsFile f = SafetensorsFile::open(other);
  CHECK_FALSE(f.entry("q").supported);
  CHECK(f.entry("n").bits == 4);
  REQUIRE_THROWS_QUINTET(f.read("u", DType::f32), InvalidArgument,
                         "unsupported dtype U32 for tensor u in " + other);
  REQUIRE_THROWS_QUINTET(f.read("q"), InvalidArgument, "unsupported dtype F8_E4M3 for tensor q");
}

TEST_CASE("malformed files are refused at open, naming the file and the tensor") {
  struct Case {
    const char* name;
    std::string bytes;
    std::string message;
  };
  const std::string f32_6 = R"("dtype":"F32","shape":[2,3])";
  std::string valid = file_bytes(R"({"t":{)" + f32_6 + R"(,"data_offsets":[0,24]}})", 24);
  const std::vector<Case> cases = {
      {"empty", "", "it has 0 bytes, fewer than the 8 of the header length"},
      {"short", std::string("\x10\0\0", 3), "it has 3 bytes"},
      {"header_past_end", valid.substr(0, 40),
       "header length 64 runs past the end of the file (32 bytes after the length"},
      {"header_too_large",
       file_bytes("", 0).replace(0, 8, std::string("\x01\xe1\xf5\x05\0\0\0\0", 8)),
       "header length 100000001 is above the format's limit of 100000000 bytes"},
      {"truncated_data", valid.substr(0, valid.size() - 4),
       "tensor t: data_offsets [0, 24] lie outside the data region of 20 bytes"},
      {"not_json", file_bytes(R"({"t": {"dtype": )", 0), "the header is not valid JSON"},
      {"not_object", file_bytes("[1, 2]", 0), "the header is array, not a JSON object"},
      {"entry_not_object", file_bytes(R"({"t": 3})", 0), "tensor t: expected an object"},
      {"no_dtype", file_bytes(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 4),
       "tensor t: no \"dtype\""},
      {"unknown_dtype", file_bytes(R"({"t":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", 4),
       "tensor t: unknown dtype \"F17\""},
      {"negative_shape",
       file_bytes(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "tensor t: shape [-1] is not an array of non-negative integers"},
      {"bad_offsets", file_bytes(R"({"t":{)" + f32_6 + R"(,"data_offsets":[0]}})", 24),
       "tensor t: data_offsets [0] is not [begin, end]"},
      {"reversed_offsets",
       file_bytes(R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", 8),
       "tensor t: data_offsets [8, 0] end before they begin"},
      {"outside", file_bytes(R"({"t":{)" + f32_6 + R"(,"data_offsets":[8,32]}})", 24),
       "tensor t: data_offsets [8, 32] lie outside the data region of 24 bytes"},
      {"size_mismatch", file_bytes(R"({"t":{)" + f32_6 + R"(,"data_offsets":[0,20]}})", 20),
       "tensor t: data_offsets [0, 20] hold 20 bytes, but shape [2,3] of F32 needs 24"},
      {"sub_byte", file_bytes(R"({"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2),
       "tensor t: 3 elements of F4 (4 bits each) are not a whole number of bytes"},
      {"overlap",
       file_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                  24),
       "tensors a [0, 16) and b [8, 24) overlap"},
      {"gap",
       file_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"F32","shape":[4],"data_offsets":[20,36]}})",
                  36),
       "bytes [16, 20) of the data region, before tensor b, belong to no tensor"},
      {"trailing", file_bytes(R"({"t":{)" + f32_6 + R"(,"data_offsets":[0,24]}})", 32),
       "bytes [24, 32) at the end of the data region belong to no tensor"},
      {"metadata_not_strings", file_bytes(R"({"__metadata__":{"step":12}})", 0),
       "__metadata__ value of \"step\" is 12, not a string"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const std::string path = write_file(std::string(c.name) + ".safetensors", c.bytes);
    REQUIRE_THROWS_QUINTET(SafetensorsFile::open(path), InvalidArgument,
                           "malformed safetensors file " + path + ": " + c.message);
  }
  CHECK(SafetensorsFile::open(write_file("valid.safetensors", valid)).entry("t").shape ==
        Shape{2, 3});
  REQUIRE_THROWS_QUINTET(SafetensorsFile::open(temp_dir() + "/absent.safetensors"), System,
                         "cannot open safetensors file");
}

TEST_CASE("check_shape names the file, the tensor and both shapes") {
  const std::string path = temp_dir() + "/shape.safetensors";
  write_safetensors(path, {{"model.norm.weight", Tensor::randn({64}, 41)}});
  const auto c = SafetensorsCheckpoint::open(path);
  c.check_shape("model.norm.weight", {64}, "config.json");
  REQUIRE_THROWS_QUINTET(c.check_shape("model.norm.weight", {96}, "config.json (hidden_size 96)"),
                         InvalidArgument,
                         "tensor model.norm.weight in " + path +
                             " has shape [64], but config.json (hidden_size 96) expects [96]");
  REQUIRE_THROWS_QUINTET(c.check_shape("lm_head.weight", {96, 64}), InvalidArgument,
                         "safetensors checkpoint " + path + " has no tensor lm_head.weight");
}

TEST_CASE("shards are planned as Hugging Face plans them") {
  using Plan = std::vector<std::vector<std::size_t>>;
  // huggingface_hub's docstring example: 10 GB limit, [6, 6, 2, 6, 2, 2] -> [6], [6+2], [6+2+2].
  CHECK(plan_safetensors_shards({6, 6, 2, 6, 2, 2}, 10) == Plan{{0}, {1, 2}, {3, 4, 5}});
  // A tensor above the limit gets a file of its own, ahead of the file being filled.
  CHECK(plan_safetensors_shards({1, 10, 1}, 5) == Plan{{1}, {0, 2}});
  CHECK(plan_safetensors_shards({3, 2}, 5) == Plan{{0, 1}});
  CHECK(plan_safetensors_shards({}, 5).empty());
}

TEST_CASE("a sharded checkpoint round-trips through its index, as transformers writes it") {
  const auto tensors = sample_tensors();
  const std::string dir = temp_dir() + "/sharded";
  SafetensorsShardOptions opt;
  opt.max_shard_bytes = 96;
  opt.metadata = {{"format", "pt"}};
  const auto files = write_safetensors_sharded(dir, tensors, opt);
  REQUIRE(files.size() >= 3);
  const std::size_t shards = files.size() - 1;
  CHECK(files.back() == "model.safetensors.index.json");
  CHECK(files[0] == fmt::format("model-00001-of-{:05d}.safetensors", shards));
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.tensor.nbytes();

  for (const std::string& path : {dir, dir + "/model.safetensors.index.json"}) {
    const auto c = SafetensorsCheckpoint::open(path);
    CHECK(c.files().size() == shards);
    CHECK(c.index_metadata().at("total_size") == std::to_string(total));
    CHECK(c.names().size() == tensors.size());
    for (const SafetensorsFile& f : c.files()) {  // within the limit, or one tensor above it
      CHECK((f.data_bytes() <= opt.max_shard_bytes || f.entries().size() == 1));
    }
    for (const NamedTensor& t : tensors) {
      INFO(t.name);
      CHECK(c.contains(t.name));
      CHECK(c.file_of(t.name).metadata().at("format") == "pt");
      CHECK(same_bytes(c.read(t.name), t.tensor));
    }
  }
  // All in one file: model.safetensors and no index.
  const std::string one = temp_dir() + "/one";
  CHECK(write_safetensors_sharded(one, tensors) == std::vector<std::string>{"model.safetensors"});
  CHECK_FALSE(fs::exists(one + "/model.safetensors.index.json"));
  CHECK(SafetensorsCheckpoint::open(one).names().size() == tensors.size());
}

TEST_CASE("malformed indexes and directories are refused, naming the index, tensor and file") {
  const std::string dir = temp_dir() + "/bad_index";
  fs::create_directories(dir);
  write_safetensors(dir + "/a.safetensors", {{"x", Tensor::randn({2}, 51)}});
  const std::string index = dir + "/model.safetensors.index.json";
  const auto open_with = [&](const std::string& text) {
    write_all(index, text);
    return SafetensorsCheckpoint::open(dir);
  };
  REQUIRE_THROWS_QUINTET(
      open_with(R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})"), InvalidArgument,
      "safetensors index " + index + " maps tensor y to file " + dir +
          "/b.safetensors, which does not exist");
  REQUIRE_THROWS_QUINTET(
      open_with(R"({"weight_map": {"z": "a.safetensors"}})"), InvalidArgument,
      "maps tensor z to file " + dir + "/a.safetensors, which has no such tensor");
  REQUIRE_THROWS_QUINTET(open_with(R"({"weight_map": {"x": "a.safe)"), InvalidArgument,
                         "malformed safetensors index " + index + ": not valid JSON");
  REQUIRE_THROWS_QUINTET(open_with(R"({"metadata": {}})"), InvalidArgument,
                         "no \"weight_map\" object");
  REQUIRE_THROWS_QUINTET(open_with(R"({"weight_map": {"x": "../a.safetensors"}})"), InvalidArgument,
                         "tensor x maps to \"../a.safetensors\", not a file beside");
  // A malformed file behind a valid index is named as such.
  write_all(dir + "/c.safetensors", file_bytes("{", 0));
  REQUIRE_THROWS_QUINTET(open_with(R"({"weight_map": {"w": "c.safetensors"}})"), InvalidArgument,
                         "malformed safetensors file " + dir + "/c.safetensors");
  CHECK(open_with(R"({"weight_map": {"x": "a.safetensors"}})").read("x").numel() == 2);

  const std::string empty_dir = temp_dir() + "/empty_dir";
  fs::create_directories(empty_dir);
  REQUIRE_THROWS_QUINTET(SafetensorsCheckpoint::open(empty_dir), InvalidArgument,
                         "holds neither model.safetensors.index.json nor model.safetensors");
  REQUIRE_THROWS_QUINTET(SafetensorsCheckpoint::open(temp_dir() + "/nothing"), InvalidArgument,
                         "no safetensors file, index or directory at");
}

TEST_CASE("the writer refuses bad names before writing anything, and writes any strides") {
  const std::string path = temp_dir() + "/refused.safetensors";
  const Tensor t = Tensor::randn({2, 3}, 61);
  REQUIRE_THROWS_QUINTET(write_safetensors(path, {{"a", t}, {"a", t}}), InvalidArgument,
                         "tensor a is given twice");
  REQUIRE_THROWS_QUINTET(write_safetensors(path, {{"__metadata__", t}}), InvalidArgument,
                         "\"__metadata__\" is the header's metadata key");
  REQUIRE_THROWS_QUINTET(write_safetensors(path, {{"", t}}), InvalidArgument, "needs a name");
  REQUIRE_THROWS_QUINTET(write_safetensors(path, {{"u", Tensor()}}), InvalidArgument,
                         "tensor u is undefined");
  CHECK_FALSE(fs::exists(path));

  write_safetensors(path, {{"t", t.transpose(0, 1)}});
  const Tensor back = SafetensorsFile::open(path).read("t");
  CHECK(back.shape() == Shape{3, 2});
  CHECK(same_bytes(back, t.transpose(0, 1)));
}
