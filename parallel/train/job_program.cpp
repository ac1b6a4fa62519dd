// The frame of a one-job command-line program (see job_program.hpp).
#include "quintet/parallel/train/job_program.hpp"

#include <cstdio>
#include <exception>
#include <vector>

#include "quintet/parallel/layout.hpp"

namespace quintet::train {

int job_program_main(const char* name, int argc, char** argv, int positional, const char* usage,
                     const std::function<int()>& run) {
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

int run_job_program(const char* name, int argc, char** argv, int positional, JobConfig job,
                    const std::function<void(JobConfig&)>& prepare,
                    const std::function<int(const JobConfig&, World&, Mesh&, Stream&)>& body) {
  std::vector<const char*> args{argv[0]};
  for (int i = 1 + positional; i < argc; ++i) args.push_back(argv[i]);
  const RuntimeConfig runtime =
      RuntimeConfig::from_args(static_cast<int>(args.size()), args.data());
  if (auto exit = parse_job_args(runtime, name, &job)) return *exit;
  prepare(job);
  World world = init(runtime);
  try {
    job.validate(world.size());
    // On the World's device, as a trainer's: the model's store and the mesh's communicators
    // must be on one device (a CPU stream beside NCCL is refused by DataParallel).
    const Device device = world.device();
    Stream stream = device.is_cuda() ? Stream::create(device) : Stream();
    Mesh mesh(Layout(job.parallel, world.size()), world.comm());
    return body(job, world, mesh, stream);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    world.fail(e, 2);
    return 2;
  }
}

}  // namespace quintet::train
