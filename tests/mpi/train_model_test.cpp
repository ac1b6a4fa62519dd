// The library's trainer parts under mpirun (quintet/parallel/train/): a TrainingModel over tp, pp
// and dp layouts trains like the same model on one rank; a loader of the wrong replica or shape
// and bad configs are refused before any communication; the Checkpointer's save and restore
// continue a run bit for bit (parameters, optimizer and loader), refuse a run of another identity,
// and find nothing in an empty directory.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/data/synthetic.hpp"
#include "quintet/parallel/train/checkpointer.hpp"
#include "quintet/parallel/train/training_model.hpp"
#include "tp_support.hpp"  // cpu_world

using namespace quintet;
using tp_test::cpu_world;

namespace {

data::TokenDataset dataset() {
  const auto made = data::ensure_synthetic_dataset("train_model_data", {}, 1, 1 << 14, 1 << 12);
  return data::TokenDataset::open(made.train.front());
}

train::TrainingConfig small_config() {
  train::TrainingConfig c;
  c.model.layers = 4;
  c.model.hidden = 32;
  c.model.heads = 4;
  c.model.vocab = 256;
  c.model.seq_len = 16;
  c.micro_batch = 2;
  c.microbatches = 2;
  c.optimizer.hyper.lr = 3e-3f;
  c.seed = 11;
  return c;
}

data::LoaderConfig loader_base() {
  data::LoaderConfig lc;
  lc.threads = 2;
  lc.seed = 5;
  return lc;
}

// `steps` losses of model trained from loader.
std::vector<double> run_steps(train::TrainingModel& model, data::DataLoader& loader, int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) losses.push_back(model.step(loader).loss);
  return losses;
}

// The layouts of n ranks the cases run: dp n, and with tp, pp and their products where n allows.
std::vector<ParallelConfig> layouts(int n) {
  std::vector<ParallelConfig> out = {ParallelConfig{}};
  if (n > 1) out.push_back(ParallelConfig{.pp = n});
  if (n % 2 == 0) out.push_back(ParallelConfig{.tp = 2});
  if (n == 4) out.push_back(ParallelConfig{.tp = 2, .pp = 2});
  return out;
}

std::string layout_str(const Mesh& mesh) {
  return "tp " + std::to_string(mesh.size(Axis::tp)) + " pp " +
         std::to_string(mesh.size(Axis::pp)) + " dp " + std::to_string(mesh.size(Axis::dp));
}

// A fresh directory for this case, shared by all ranks.
std::string fresh_dir(Communicator& world, const std::string& name) {
  std::string dir = "train_model_ckpt_np" + std::to_string(world.size()) + "_" + name;
  for (char& ch : dir) {
    if (ch == ' ') ch = '_';
  }
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier().wait();
  return dir;
}

}  // namespace

TEST_CASE("train: a TrainingModel over any layout trains like one rank", "[train]") {
  World world = cpu_world();
  const int n = world.size();
  // The reference: the same global batch on a mesh of this rank alone (every rank computes it).
  std::unique_ptr<Communicator> alone = world.comm().split(world.rank(), 0, "alone");
  std::vector<double> want;
  {
    Mesh mesh(Layout(ParallelConfig{}, 1), *alone);
    train::TrainingConfig c = small_config();
    c.microbatches *= n;
    train::TrainingModel model(c, mesh, Stream());
    data::DataLoader loader(dataset(), model.loader_config(loader_base()));
    want = run_steps(model, loader, 3);
  }
  for (const ParallelConfig& pc : layouts(n)) {
    for (int zero : {0, 1}) {
      Mesh mesh(Layout(pc, n), world.comm());
      INFO(layout_str(mesh) << " ZeRO-" << zero);
      train::TrainingConfig c = small_config();
      c.microbatches = 2 * n / mesh.size(Axis::dp);
      c.data_parallel.zero_stage = zero;
      c.model.sequence_parallel = mesh.size(Axis::tp) > 1;
      train::TrainingModel model(c, mesh, Stream());
      REQUIRE(c.global_batch(mesh) == 4 * n);
      data::DataLoader loader(dataset(), model.loader_config(loader_base()));
      const std::vector<double> got = run_steps(model, loader, 3);
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(std::abs(got[i] - want[i]) <= 1e-5 * std::abs(want[i]));  // every rank the same
      }
      CHECK(model.steps() == 3);
    }
  }
}

TEST_CASE("train: a loader of another replica or shape, and bad configs, are refused", "[train]") {
  World world = cpu_world();
  const int n = world.size();
  for (const ParallelConfig& pc : layouts(n)) {
    Mesh mesh(Layout(pc, n), world.comm());
    INFO(layout_str(mesh));
    train::TrainingModel model(small_config(), mesh, Stream());
    // The slip a user makes: the loader split by the world rank and size, not by the replica's.
    // The tp and pp ranks of one replica would read different tokens; step refuses, before any
    // communication (every rank: the world differs from dp whenever tp or pp is not 1).
    if (mesh.size(Axis::dp) != n) {
      data::LoaderConfig wrong = model.loader_config(loader_base());
      wrong.dp_rank = world.rank();
      wrong.dp_size = n;
      data::DataLoader loader(dataset(), wrong);
      REQUIRE_THROWS_QUINTET(model.step(loader), InvalidArgument,
                             "ranks of one replica would train on different data");
    }
    data::LoaderConfig shape = model.loader_config(loader_base());
    shape.batch_size = 3;
    data::DataLoader odd(dataset(), shape);
    REQUIRE_THROWS_QUINTET(model.step(odd), InvalidArgument, "makes [3, 16] batches");
  }
  Mesh mesh(Layout(ParallelConfig{.pp = n}, n), world.comm());
  auto refused = [&](train::TrainingConfig c, const std::string& message) {
    REQUIRE_THROWS_QUINTET(train::TrainingModel(c, mesh, Stream()), InvalidArgument, message);
  };
  train::TrainingConfig c = small_config();
  c.micro_batch = 0;
  refused(c, "micro_batch 0 must be >= 1");
  c = small_config();
  c.microbatches = 0;
  refused(c, "microbatches 0 must be >= 1");
  c = small_config();
  c.vpp = 5;
  refused(c, "cannot fill pp");
  c = small_config();
  c.model.heads = 3;
  refused(c, "heads");
  c = small_config();
  c.schedule = pipeline::ScheduleKind::interleaved;  // needs vpp >= 2
  refused(c, "interleaved");
  c = small_config();
  c.data_parallel.zero_stage = 3;
  refused(c, "zero_stage");
}

TEST_CASE("train: the Checkpointer continues a run bit for bit and refuses another run",
          "[train]") {
  World world = cpu_world();
  const int n = world.size();
  for (const ParallelConfig& pc : layouts(n)) {
    Mesh mesh(Layout(pc, n), world.comm());
    INFO(layout_str(mesh));
    train::TrainingConfig c = small_config();
    c.data_parallel.zero_stage = mesh.size(Axis::dp) > 1 ? 1 : 0;
    std::vector<double> straight;
    {
      train::TrainingModel model(c, mesh, Stream());
      data::DataLoader loader(dataset(), model.loader_config(loader_base()));
      straight = run_steps(model, loader, 4);
    }
    const std::string dir = fresh_dir(world.comm(), layout_str(mesh));
    train::Checkpointer checkpoints(dir, world.comm(), "data=builtin");
    {
      train::TrainingModel model(c, mesh, Stream());
      data::DataLoader loader(dataset(), model.loader_config(loader_base()));
      CHECK_FALSE(checkpoints.restore(model, loader).has_value());  // nothing saved yet
      run_steps(model, loader, 2);
      checkpoints.save(2, model, loader, R"({"note": "two steps"})");
    }
    // A new process's view: a fresh model and loader, restored, continue where the run stopped.
    train::TrainingModel model(c, mesh, Stream());
    data::DataLoader loader(dataset(), model.loader_config(loader_base()));
    REQUIRE(checkpoints.restore(model, loader) == std::optional<std::int64_t>(2));
    CHECK(checkpoints.restored_user_json() == R"({"note":"two steps"})");
    CHECK(model.steps() == 2);
    const std::vector<double> rest = run_steps(model, loader, 2);
    CHECK(rest[0] == straight[2]);
    CHECK(rest[1] == straight[3]);

    // Another run's identity is refused before any tensor is read, naming the field.
    train::TrainingConfig other = c;
    other.seed = 12;
    train::TrainingModel reseeded(other, mesh, Stream());
    REQUIRE_THROWS_QUINTET(checkpoints.restore(reseeded, loader), InvalidArgument,
                           "with seed = 11, this run has seed = 12");
    // Kinds are named as the flags name them.
    train::TrainingConfig rms = c;
    rms.model.norm = nn::NormKind::rmsnorm;
    train::TrainingModel other_norm(rms, mesh, Stream());
    REQUIRE_THROWS_QUINTET(checkpoints.restore(other_norm, loader), InvalidArgument,
                           "with norm = layernorm, this run has norm = rmsnorm");
    train::Checkpointer other_data(dir, world.comm(), "data=mine");
    REQUIRE_THROWS_QUINTET(other_data.restore(model, loader), InvalidArgument,
                           "with data = builtin, this run has data = mine");
  }
  REQUIRE_THROWS_QUINTET(train::Checkpointer("d", world.comm(), "novalue"), InvalidArgument,
                         "not key=value pairs");
}

TEST_CASE("train: activation recompute trains exactly like keeping the activations", "[train]") {
  World world = cpu_world();
  const int n = world.size();
  for (const ParallelConfig& pc : layouts(n)) {
    Mesh mesh(Layout(pc, n), world.comm());
    std::vector<pipeline::ScheduleKind> schedules = {pipeline::ScheduleKind::one_f_one_b};
    if (mesh.size(Axis::pp) > 1) schedules.push_back(pipeline::ScheduleKind::zb_h1);  // deferral
    for (pipeline::ScheduleKind schedule : schedules) {
      INFO(layout_str(mesh) << " " << pipeline::schedule_kind_name(schedule));
      std::vector<double> want;
      for (model::RecomputeKind kind : {model::RecomputeKind::none, model::RecomputeKind::attention,
                                        model::RecomputeKind::full}) {
        INFO("recompute " << static_cast<int>(kind));
        train::TrainingConfig c = small_config();
        c.microbatches = std::max(2, mesh.size(Axis::pp));
        c.schedule = schedule;
        c.model.sequence_parallel = mesh.size(Axis::tp) > 1;
        c.model.recompute = kind;
        train::TrainingModel model(c, mesh, Stream());
        data::DataLoader loader(dataset(), model.loader_config(loader_base()));
        const std::vector<double> got = run_steps(model, loader, 3);
        if (kind == model::RecomputeKind::none) {
          want = got;
        } else {
          CHECK(got == want);
        }
      }
    }
  }
  REQUIRE_THROWS_QUINTET(model::parse_recompute_kind("some"), InvalidArgument,
                         "use none, attention or full");
}

TEST_CASE("train: context parallelism (ring, all-to-all) trains like one rank", "[train][cp]") {
  World world = cpu_world();
  const int n = world.size();
  if (n == 1) return;  // cp needs two ranks; one rank is the reference
  auto config = [] {
    train::TrainingConfig c = small_config();
    c.model.seq_len = 24;  // 2 * cp chunks for cp 2, 3 and 4
    return c;
  };
  std::unique_ptr<Communicator> alone = world.comm().split(world.rank(), 0, "alone");
  std::vector<double> want;
  {
    Mesh mesh(Layout(ParallelConfig{}, 1), *alone);
    train::TrainingConfig c = config();
    train::TrainingModel model(c, mesh, Stream());
    data::DataLoader loader(dataset(), model.loader_config(loader_base()));
    want = run_steps(model, loader, 3);
  }
  std::vector<ParallelConfig> cps = {ParallelConfig{.cp = n, .dp = 1}};
  if (n == 4) {
    cps.push_back(ParallelConfig{.tp = 2, .cp = 2, .dp = 1});
    cps.push_back(ParallelConfig{.cp = 2, .dp = 2});
    cps.push_back(ParallelConfig{.cp = 2, .dp = 1, .pp = 2});
  }
  for (const ParallelConfig& pc : cps) {
    for (auto kind :
         {context::ContextParallelKind::ring, context::ContextParallelKind::all_to_all}) {
      Mesh mesh(Layout(pc, n), world.comm());
      const bool ulysses = kind == context::ContextParallelKind::all_to_all;
      if (ulysses && 4 % (mesh.size(Axis::tp) * mesh.size(Axis::cp)) != 0) continue;  // heads 4
      INFO(layout_str(mesh) << " cp " << mesh.size(Axis::cp) << (ulysses ? " ulysses" : " ring"));
      train::TrainingConfig c = config();
      c.microbatches = 2 / mesh.size(Axis::dp);
      c.model.context_parallel = kind;
      c.model.sequence_parallel = mesh.size(Axis::tp) > 1;
      c.data_parallel.zero_stage = mesh.size(Axis::dp) > 1 ? 1 : 0;
      train::TrainingModel model(c, mesh, Stream());
      data::DataLoader loader(dataset(), model.loader_config(loader_base()));
      const std::vector<double> got = run_steps(model, loader, 3);
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("step " << i + 1);
        CHECK(std::abs(got[i] - want[i]) <= 1e-5 * std::abs(want[i]));
      }
    }
  }
  // A sequence that does not split into 2 * cp chunks, and heads all-to-all cannot split.
  Mesh mesh(Layout(ParallelConfig{.cp = n, .dp = 1}, n), world.comm());
  train::TrainingConfig bad = config();
  bad.model.seq_len = 2 * 2 * n + 2;
  REQUIRE_THROWS_QUINTET(train::TrainingModel(bad, mesh, Stream()), InvalidArgument,
                         "must split into 2 * cp");
  bad = config();
  bad.model.heads = 2 * n + 2;
  bad.model.hidden = 4 * bad.model.heads;
  bad.model.context_parallel = context::ContextParallelKind::all_to_all;
  if ((2 * n + 2) % n != 0) {
    REQUIRE_THROWS_QUINTET(train::TrainingModel(bad, mesh, Stream()), InvalidArgument,
                           "not divisible by tp 1 x cp");
  }
}
