# Flags of the TANDEM_FUZZ build (see the option in the top-level CMakeLists.txt): every
# object gets ASan + UBSan (UB aborts) and libFuzzer's coverage instrumentation; the fuzz
# targets link libFuzzer itself (fuzz/CMakeLists.txt), the unit tests link GoogleTest's main.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "TANDEM_FUZZ needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14")
endif()
set(TANDEM_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
  -fno-omit-frame-pointer)
add_compile_options(${TANDEM_SANITIZE_FLAGS} -fsanitize=fuzzer-no-link)
add_link_options(-fsanitize=address,undefined)
# -O1 compiles much faster than -O2 and keeps the stack traces readable.
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -g1")
set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O1 -g1")
