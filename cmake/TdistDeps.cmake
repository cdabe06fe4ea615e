# Optional dependencies. Each TDIST_WITH_X is AUTO (use it when found), ON (fail when missing)
# or OFF. The result is TDIST_HAVE_X, which src/ uses to add the matching sources.
find_package(Threads REQUIRED)
# libcrypto (OpenSSL) is required: connection handshakes prove the job secret with HMAC-SHA256
# (src/net/auth.c). Debian: libssl-dev.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)

function(tdist_resolve_option opt found)
  if(${opt} STREQUAL "ON" AND NOT ${found})
    message(FATAL_ERROR "${opt}=ON but the dependency was not found")
  endif()
endfunction()

set(TDIST_HAVE_MPI OFF)
if(NOT TDIST_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS C QUIET)
  if(MPI_C_FOUND)
    set(TDIST_HAVE_MPI ON)
  endif()
  tdist_resolve_option(TDIST_WITH_MPI TDIST_HAVE_MPI)
endif()

# CUDA: the library never links the CUDA runtime or driver (src/device/cuda.c loads libcuda.so.1
# at run time, in every build). The toolkit only provides nvcc, which compiles the device kernels
# (src/device/kernels.cu) into a fatbin embedded in the library: TDIST_HAVE_CUDA. Without nvcc,
# or with TDIST_WITH_CUDA=OFF, the library still drives GPUs but has no kernels (fill, strided
# copy, add and sleep fail with TD_ERR_UNSUPPORTED). nvcc is not always on PATH: the toolkit's own
# bin directory and /usr/local/cuda/bin are searched too.
set(TDIST_HAVE_CUDA OFF)
set(TDIST_NVCC "")
if(NOT TDIST_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_NVCC_EXECUTABLE AND EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
    set(TDIST_NVCC "${CUDAToolkit_NVCC_EXECUTABLE}")
  else()
    find_program(TDIST_NVCC_PROGRAM nvcc HINTS ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
    if(TDIST_NVCC_PROGRAM)
      set(TDIST_NVCC "${TDIST_NVCC_PROGRAM}")
    endif()
  endif()
  if(TDIST_NVCC)
    set(TDIST_HAVE_CUDA ON)
  endif()
  tdist_resolve_option(TDIST_WITH_CUDA TDIST_HAVE_CUDA)
endif()

set(TDIST_HAVE_NCCL OFF)
if(NOT TDIST_WITH_NCCL STREQUAL "OFF" AND TDIST_HAVE_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(TDIST_HAVE_NCCL ON)
  endif()
endif()
if(TDIST_WITH_NCCL STREQUAL "ON")
  tdist_resolve_option(TDIST_WITH_NCCL TDIST_HAVE_NCCL)
endif()
