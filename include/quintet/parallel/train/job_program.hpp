// The frame of a command-line program that runs one job's model once, without a training loop:
// a tool (tests/python's hf_import_tool and hf_export_tool) or a benchmark
// (scripts/bench/hf_io_bench). It takes a few positional arguments of its own, then the runtime's
// and the job's flags (parse_job_args), and reports an error as "NAME: message" with exit status
// 2, before the ranks exist or after (through World::fail, so that no rank waits for one that has
// failed). Implemented by parallel/train/job_program.cpp.
//
//   int main(int argc, char** argv) {      // mpirun -np 2 my_tool FILE --init-from-hf DIR --tp 2
//     return train::job_program_main("my_tool", argc, argv, 1, "FILE [job flags]", [&] {
//       const std::string file = argv[1];  // there: the arguments are counted
//       return train::run_job_program(
//           "my_tool", argc, argv, 1, train::JobConfig(), [](train::JobConfig&) {},
//           [&](const train::JobConfig& job, World& world, Mesh& mesh, Stream& stream) {
//             train::TrainingModel model(job, mesh, stream);
//             ...
//             return 0;
//           });
//     });
//   }
#pragma once

#include <functional>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/train/job_config.hpp"

namespace quintet::train {

// main's body: prints "usage: PROGRAM usage" and returns 2 when argv holds fewer than
// `positional` arguments after the program's name, else run()'s exit status; an exception out of
// run() (one thrown before the World exists) is printed as "name: message" on stderr, status 2.
int job_program_main(const char* name, int argc, char** argv, int positional, const char* usage,
                     const std::function<int()>& run);

// The job of the runtime and job flags after argv's `positional` arguments, on top of `job` (a
// preset): parsed (--help and a bad flag return parse_job_args' status), then prepare(job) (what
// the program sets or checks before the ranks start: an exception leaves this call), then the
// World, the job validated for its size, a Stream on the World's device (a GPU's with --device
// cuda, as a trainer's: a TrainingModel builds its parameters there, beside the mesh's
// communicators), the job's Mesh, and body's exit status. An exception out of validate or body is
// printed by its rank and passed to the others through World::fail: status 2.
int run_job_program(const char* name, int argc, char** argv, int positional, JobConfig job,
                    const std::function<void(JobConfig&)>& prepare,
                    const std::function<int(const JobConfig&, World&, Mesh&, Stream&)>& body);

}  // namespace quintet::train
