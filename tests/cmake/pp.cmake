# Pipeline schedules as data: the IR and its text form, the generators, the simulator. Pure and
# fast: one process, no communication. (examples/06_pp_schedule/CMakeLists.txt registers the
# pp_schedule_example_* tests of the 06_pp_schedule tool.)
quintet_unit_test(NAME pp_schedule_test COMPONENT pp SOURCES unit/pp_schedule_test.cpp)
quintet_unit_test(NAME pp_generators_test COMPONENT pp SOURCES unit/pp_generators_test.cpp)
quintet_unit_test(NAME pp_simulator_test COMPONENT pp SOURCES unit/pp_simulator_test.cpp)
