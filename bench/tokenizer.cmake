# tokenizer_bench: load time and encode throughput of the tokenizer.json tokenizers (issue 3).
# Included from engine/tokenizer/CMakeLists.txt when TANDEM_BUILD_BENCH is on.
add_executable(tokenizer_bench ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cc)
target_link_libraries(tokenizer_bench PRIVATE tandem_hf_tokenizer)
target_compile_definitions(tokenizer_bench PRIVATE
  TANDEM_SHARED_DIR="${TANDEM_SHARED_DIR}"
  TANDEM_BENCH_RESULTS_DIR="${CMAKE_CURRENT_LIST_DIR}/results")
