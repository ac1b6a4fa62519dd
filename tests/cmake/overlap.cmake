# Overlap: the meter of communication and exposed time (one process).
quintet_unit_test(NAME overlap_meter_test COMPONENT overlap SOURCES unit/overlap_meter_test.cpp)
