#include "cuda/cuda_check.h"

#include <string>

namespace mixprec::detail {
namespace {

// Only the base name: __FILE__ is an absolute path under CMake, which makes messages long
// without telling the reader anything the base name and line do not.
const char* base_name(const char* path) {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p == '/' || *p == '\\') base = p + 1;
  }
  return base;
}

[[noreturn]] void throw_status(const char* library, const std::string& name,
                               const std::string& description, const char* expr,
                               const char* file, int line) {
  std::string message = std::string(library) + " error " + name;
  if (!description.empty() && description != name) message += " (" + description + ")";
  message += std::string(" in `") + expr + "` at " + base_name(file) + ":" + std::to_string(line);
  throw Error(message);
}

std::string or_unknown(const char* text, long status) {
  return text != nullptr ? std::string(text) : "unknown status " + std::to_string(status);
}

}  // namespace

void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line) {
  // Both functions are table look-ups in the runtime: they work without a driver or device.
  throw_status("CUDA", or_unknown(cudaGetErrorName(status), status),
               or_unknown(cudaGetErrorString(status), status), expr, file, line);
}

void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  throw_status("cuBLAS", or_unknown(cublasGetStatusName(status), status),
               or_unknown(cublasGetStatusString(status), status), expr, file, line);
}

void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
  // cuDNN has one function, which returns the enumerator's name; the detail of the most
  // recent failure is kept by cuDNN 9 per thread.
  std::string detail;
  char buffer[512] = {};
  cudnnGetLastErrorString(buffer, sizeof buffer);
  detail = buffer;
  throw_status("cuDNN", or_unknown(cudnnGetErrorString(status), status), detail, expr, file,
               line);
}

}  // namespace mixprec::detail
