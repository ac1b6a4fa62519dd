# Layout and Mesh: Megatron-Core rank groups and one communicator per parallel axis.
# (examples/02_layout/CMakeLists.txt registers the layout_example_* tests of the 02_layout tool.)
quintet_unit_test(NAME layout_test COMPONENT layout SOURCES unit/layout_test.cpp)
quintet_unit_test(NAME layout_all_configs_test COMPONENT layout
                  SOURCES unit/layout_all_configs_test.cpp)
quintet_mpi_test(NAME layout_mesh_test COMPONENT layout RANKS 8 16 SOURCES mpi/layout_mesh_test.cpp)
