# Data parallelism: gradient buckets overlapped with backward, accumulation, ZeRO-1/2 and the
# global gradient norm, against one-rank training (CPU, under mpirun) and on one and two GPUs.
# The bucket plan (boundaries, groups, ZeRO shard ranges) with no process.
quintet_unit_test(NAME dp_bucket_plan_test COMPONENT dp SOURCES unit/dp_bucket_plan_test.cpp)
quintet_mpi_test(NAME dp_train_test COMPONENT dp RANKS 1 2 3 4 SOURCES mpi/dp_train_test.cpp)
quintet_mpi_test(NAME dp_groups_test COMPONENT dp RANKS 1 2 3 4 SOURCES mpi/dp_groups_test.cpp)
quintet_gpu_test(NAME gpu_dp_train_test COMPONENT dp RANKS 1 2 SOURCES gpu/dp_train_test.cpp)
# The loader configured from the mesh: one replica's ranks read the same batches.
quintet_mpi_test(NAME dp_loader_mesh_test COMPONENT dp RANKS 1 2 3 4
                 SOURCES mpi/dp_loader_mesh_test.cpp)
# The library's trainer parts: TrainingModel against one rank, its refusals, the Checkpointer.
quintet_mpi_test(NAME train_model_test COMPONENT dp RANKS 1 2 3 4 SOURCES mpi/train_model_test.cpp)
