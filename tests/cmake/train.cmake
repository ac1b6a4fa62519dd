# train: the job config (train::JobConfig: its flags, job file and checks); no MPI.
quintet_unit_test(NAME train_job_config_test COMPONENT train SOURCES unit/train_job_config_test.cpp)
