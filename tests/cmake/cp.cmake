# Context parallelism: ring and all-to-all attention against one attention over the whole
# sequence (CPU, under mpirun, odd cp included).
quintet_mpi_test(NAME cp_attention_test COMPONENT cp RANKS 1 2 3 4 SOURCES mpi/cp_attention_test.cpp)
