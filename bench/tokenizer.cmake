# tokenizer_bench: load time and encode throughput of the tokenizer.json tokenizers.
# Included from text/tokenizer/CMakeLists.txt when TANDEM_BUILD_BENCH is on.
add_executable(tokenizer_bench ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cc)
target_link_libraries(tokenizer_bench PRIVATE tandem_hf_tokenizer)
target_compile_definitions(tokenizer_bench PRIVATE
  TANDEM_SHARED_DIR="${TANDEM_SHARED_DIR}"
  TANDEM_BENCH_RESULTS_DIR="${CMAKE_CURRENT_LIST_DIR}/results")

# regex_bench: the tokenizer's regex engine against Oniguruma (Debian libonig-dev), the engine
# Hugging Face tokenizers uses: same matches, and throughput.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(ONIGURUMA IMPORTED_TARGET oniguruma)
endif()
if(ONIGURUMA_FOUND)
  add_executable(regex_bench ${CMAKE_CURRENT_LIST_DIR}/regex_bench.cc)
  target_link_libraries(regex_bench PRIVATE tandem_hf_tokenizer PkgConfig::ONIGURUMA)
  target_compile_definitions(regex_bench PRIVATE
    TANDEM_SHARED_DIR="${TANDEM_SHARED_DIR}"
    TANDEM_BENCH_RESULTS_DIR="${CMAKE_CURRENT_LIST_DIR}/results")
endif()
