# train: the job config (train::JobConfig: its flags, job file and checks); no MPI.
quintet_unit_test(NAME train_job_config_test COMPONENT train SOURCES unit/train_job_config_test.cpp)
# The bound-by verdict (train::bound_by): a pure function of a step's measured times.
quintet_unit_test(NAME train_bound_by_test COMPONENT train SOURCES unit/train_bound_by_test.cpp)
# Hugging Face export: names, shapes, files, config.json, bf16, from a checkpoint's pieces, refusals.
quintet_unit_test(NAME train_hf_export_test COMPONENT train SOURCES unit/train_hf_export_test.cpp)
# The Hugging Face name mapping (train/hf_names.hpp): pieces and tensors cover each other.
quintet_unit_test(NAME train_hf_names_test COMPONENT train SOURCES unit/train_hf_names_test.cpp)
