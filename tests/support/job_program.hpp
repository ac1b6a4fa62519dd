// The frame of a command-line program that runs a training job's model once: the Hugging Face
// tools of tests/python (hf_import_tool, hf_export_tool) and scripts/bench/hf_io_bench. Each
// takes a few positional arguments of its own before the job's flags, parses and validates the
// job, and reports an error as "NAME: message" with exit code 2, before the ranks exist or
// (through World::fail, so that no rank waits for one that has failed) after.
#pragma once

#include <cstdio>
#include <exception>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/parallel/layout.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/train/job_config.hpp"

namespace job_program {

// main's body: "usage: PROGRAM usage" and exit 2 when argv holds fewer than `positional`
// arguments after the program's name, else run()'s exit code; an exception out of run() (one
// thrown before the World exists) is printed as "name: message", exit 2.
template <typename Run>
int main_frame(const char* name, int argc, char** argv, int positional, const char* usage,
               Run&& run) {
  try {
    if (argc < 1 + positional) {
      std::fprintf(stderr, "usage: %s %s\n", argv[0], usage);
      return 2;
    }
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
}

// The job of the runtime and job flags after argv's `positional` arguments, on top of `job` (a
// preset): parsed (--help and bad flags give parse_job_args' exit code), then prepare(job) (what
// the program sets or checks before the ranks start: an exception leaves this call), then the
// World, the job validated for its size, a Stream and the job's Mesh, and body(job, world, mesh,
// stream)'s exit code. An exception there is reported by World::fail on every rank: exit 2.
template <typename Prepare, typename Body>
int run_job(const char* name, int argc, char** argv, int positional, quintet::train::JobConfig job,
            Prepare&& prepare, Body&& body) {
  using namespace quintet;
  std::vector<const char*> args{argv[0]};
  for (int i = 1 + positional; i < argc; ++i) args.push_back(argv[i]);
  const RuntimeConfig runtime =
      RuntimeConfig::from_args(static_cast<int>(args.size()), args.data());
  if (auto exit = train::parse_job_args(runtime, name, &job)) return *exit;
  prepare(job);
  World world = init(runtime);
  try {
    job.validate(world.size());
    Stream stream;
    Mesh mesh(Layout(job.parallel, world.size()), world.comm());
    return body(static_cast<const train::JobConfig&>(job), world, mesh, stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    world.fail(e, 2);
    return 2;
  }
}

}  // namespace job_program
