# The library model (parallel/model/): chunks against the whole model, tied embeddings, parameter
# counts and bad inputs in one process; the tp and dp tests build their models from it too.
quintet_unit_test(NAME model_gpt_test COMPONENT model SOURCES unit/model_gpt_test.cpp)
