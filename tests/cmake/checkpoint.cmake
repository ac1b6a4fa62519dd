# Checkpoints: per-rank shards, atomic commit, verified load.
quintet_mpi_test(NAME checkpoint_test COMPONENT example RANKS 1 3 SOURCES mpi/checkpoint_test.cpp)
