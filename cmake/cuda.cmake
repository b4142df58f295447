# The CUDA backend is its own shared library (libtandem_cuda.so) behind a plain C header
# (kernels/cuda/cuda_api.h). Binaries never link it: kernels/backend_loader.cc dlopen()s it at
# run time, so they start on machines with no GPU, no driver and no CUDA runtime.
set(TANDEM_HAVE_CUDA OFF)
if(TANDEM_CUDA STREQUAL "AUTO" OR TANDEM_CUDA STREQUAL "ON")
  find_program(TANDEM_NVCC nvcc)
  if(NOT TANDEM_NVCC AND EXISTS /usr/local/cuda/bin/nvcc)
    set(TANDEM_NVCC /usr/local/cuda/bin/nvcc)
  endif()
  if(TANDEM_NVCC)
    set(CMAKE_CUDA_COMPILER ${TANDEM_NVCC})
    # CMake 3.25 does not know nvcc 13's C++20 dialect. Its compiler checks run with the
    # default dialect; the CUDA20 flags are set by hand once the language is enabled.
    # "native" fails where there is no GPU: name the targets (A100, H100/H200).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_EXTENSIONS OFF)
    find_package(CUDAToolkit REQUIRED)
    set(TANDEM_HAVE_CUDA ON)
  elseif(TANDEM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TANDEM_CUDA=ON but nvcc was not found")
  endif()
endif()
message(STATUS "Tandem CUDA backend: ${TANDEM_HAVE_CUDA}")
