# Finds cuDNN 9 and defines the imported target mixprec::cudnn (once; later includes return at
# once). Needs find_package(CUDAToolkit) first. Where cuDNN is missing or too old, configuring
# fails, unless MIXPREC_CUDNN_OPTIONAL is set: then it says so and defines no target.
#
# cuDNN ships no CMake config. It is looked for, in order, under CUDNN_ROOT (cache or
# environment), next to the CUDA toolkit (NVIDIA's tarball layout and this project's Debian
# machines), in the `nvidia-cudnn` Python wheel that PyTorch installs (the layout on the lent
# GPU machines, where the library has only a versioned name, libcudnn.so.9), and last in the
# system paths (Debian/Ubuntu packages).
if(TARGET mixprec::cudnn)
  return()
endif()

set(CUDNN_ROOT "$ENV{CUDNN_ROOT}" CACHE PATH "cuDNN install prefix (include/cudnn.h, lib/libcudnn.so)")

set(_mixprec_cudnn_hints ${CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
find_package(Python3 QUIET COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import nvidia.cudnn as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _mixprec_cudnn_wheel OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _mixprec_cudnn_wheel_rc ERROR_QUIET)
  if(_mixprec_cudnn_wheel_rc EQUAL 0 AND _mixprec_cudnn_wheel)
    list(APPEND _mixprec_cudnn_hints ${_mixprec_cudnn_wheel})
  endif()
endif()

find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${_mixprec_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.8
  HINTS ${_mixprec_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)

if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
  string(CONCAT _mixprec_cudnn_missing
    "cuDNN not found (cudnn.h: ${CUDNN_INCLUDE_DIR}; libcudnn: ${CUDNN_LIBRARY}). "
    "The CUDA backend needs cuDNN 9 (convolutions): install it (NVIDIA's cudnn9-cuda-13 "
    "Debian package, or pip's nvidia-cudnn-cu13 wheel) and, if it is elsewhere, pass "
    "-DCUDNN_ROOT=<prefix holding include/cudnn.h and lib/libcudnn.so*>; or build without "
    "the CUDA backend: -DMIXPREC_CUDA=OFF.")
  if(MIXPREC_CUDNN_OPTIONAL)
    message(STATUS "mixprec: ${_mixprec_cudnn_missing}")
    return()
  endif()
  # Also under AUTO: where nvcc exists the backend must build, so a half-installed toolkit
  # is reported instead of silently producing a CPU-only build.
  message(FATAL_ERROR "${_mixprec_cudnn_missing}")
endif()

set(_mixprec_cudnn_version "unknown")
foreach(_header cudnn_version.h cudnn.h)
  if(EXISTS "${CUDNN_INCLUDE_DIR}/${_header}")
    file(STRINGS "${CUDNN_INCLUDE_DIR}/${_header}" _defines REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
    if(_defines)
      string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*" "\\1" _major "${_defines}")
      string(REGEX REPLACE ".*CUDNN_MINOR ([0-9]+).*" "\\1" _minor "${_defines}")
      string(REGEX REPLACE ".*CUDNN_PATCHLEVEL ([0-9]+).*" "\\1" _patch "${_defines}")
      set(_mixprec_cudnn_version "${_major}.${_minor}.${_patch}")
      break()
    endif()
  endif()
endforeach()
if(_major AND _major LESS 9)
  if(MIXPREC_CUDNN_OPTIONAL)
    message(STATUS "mixprec: cuDNN ${_mixprec_cudnn_version} is too old (9 or newer needed)")
    return()
  endif()
  message(FATAL_ERROR "cuDNN ${_mixprec_cudnn_version} at ${CUDNN_INCLUDE_DIR} is too old: "
    "the CUDA backend needs cuDNN 9 or newer (set CUDNN_ROOT to another install)")
endif()
message(STATUS "mixprec: CUDA ${CUDAToolkit_VERSION}, cuDNN ${_mixprec_cudnn_version} "
  "(${CUDNN_LIBRARY}), architectures ${CMAKE_CUDA_ARCHITECTURES}")

add_library(mixprec::cudnn UNKNOWN IMPORTED GLOBAL)
set_target_properties(mixprec::cudnn PROPERTIES
  IMPORTED_LOCATION "${CUDNN_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")

