#include "cuda/cuda_check.h"

#include <string>
#include <string_view>

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

// `what`: "in `expr`" or "in the launch of kernel"; `hint` is appended after the location.
[[noreturn]] void throw_status(const char* library, const std::string& name,
                               const std::string& description, const std::string& what,
                               const char* file, int line, const char* function,
                               const std::string& hint = "") {
  std::string message = std::string(library) + " error " + name;
  if (!description.empty() && description != name) message += " (" + description + ")";
  message += " " + what;
  if (function != nullptr) {
    const std::string op = function_name(function);
    if (!op.empty()) message += " in " + op;
  }
  message += std::string(" at ") + base_name(file) + ":" + std::to_string(line);
  if (!hint.empty()) message += "; " + hint;
  throw Error(message);
}

// Errors that a running kernel raises. The runtime reports them at the next call that
// waits for the device, which may belong to another op than the faulty kernel.
bool raised_by_a_running_kernel(cudaError_t status) {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
      return true;
    default:
      return false;
  }
}

std::string cuda_hint(cudaError_t status) {
  if (!raised_by_a_running_kernel(status)) return "";
  return "a kernel queued before this call failed while running (the device is unusable for "
         "the rest of this process); run again with CUDA_LAUNCH_BLOCKING=1 to have the failing "
         "kernel's own launch report it";
}

// Drops "::"-separated parts that name no namespace a reader can look up: anonymous
// namespaces as GCC ("{anonymous}"), Clang ("(anonymous namespace)") and nvcc's front end
// ("_GLOBAL__N__<hash>") spell them.
std::string without_anonymous_namespaces(std::string text) {
  for (const char* spelling : {"{anonymous}::", "(anonymous namespace)::"}) {
    for (size_t at = text.find(spelling); at != std::string::npos; at = text.find(spelling)) {
      text.erase(at, std::string(spelling).size());
    }
  }
  for (size_t at = text.find("_GLOBAL__N_"); at != std::string::npos;
       at = text.find("_GLOBAL__N_")) {
    const size_t end = text.find("::", at);
    text.erase(at, end == std::string::npos ? std::string::npos : end + 2 - at);
  }
  return text;
}

std::string or_unknown(const char* text, long status) {
  return text != nullptr ? std::string(text) : "unknown status " + std::to_string(status);
}

std::string in_expression(const char* expr) { return std::string("in `") + expr + "`"; }

}  // namespace

std::string function_name(const char* pretty_function) {
  if (pretty_function == nullptr) return "";
  const std::string text = without_anonymous_namespaces(pretty_function);
  // The name ends where its parameter list starts; a return type, if any, ends at the last
  // space before it. A lambda's name continues after its enclosing function's parameters
  // ("f(int)::<lambda()>"), so the enclosing function is what remains.
  const size_t open = text.find('(');
  std::string name = text.substr(0, open);
  const size_t space = name.rfind(' ');
  if (space != std::string::npos) name = name.substr(space + 1);
  if (name.size() >= 8 && name.compare(name.size() - 8, 8, "operator") == 0) name += "()";
  constexpr std::string_view kOwn = "mixprec::";
  if (name.compare(0, kOwn.size(), kOwn) == 0) name = name.substr(kOwn.size());
  return name;
}

void throw_cuda_error(cudaError_t status, const char* expr, const char* file, int line,
                      const char* function) {
  // Both functions are table look-ups in the runtime: they work without a driver or device.
  throw_status("CUDA", or_unknown(cudaGetErrorName(status), status),
               or_unknown(cudaGetErrorString(status), status), in_expression(expr), file, line,
               function, cuda_hint(status));
}

void throw_launch_error(cudaError_t status, const char* kernel, const char* file, int line,
                        const char* function) {
  const std::string what = kernel != nullptr && *kernel != '\0'
                               ? std::string("in the launch of ") + kernel
                               : std::string("in a kernel launch");
  throw_status("CUDA", or_unknown(cudaGetErrorName(status), status),
               or_unknown(cudaGetErrorString(status), status), what, file, line, function,
               cuda_hint(status));
}

void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line,
                        const char* function) {
  throw_status("cuBLAS", or_unknown(cublasGetStatusName(status), status),
               or_unknown(cublasGetStatusString(status), status), in_expression(expr), file,
               line, function);
}

void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line,
                       const char* function) {
  // cuDNN has one function, which returns the enumerator's name; the detail of the most
  // recent failure is kept by cuDNN 9 per thread.
  std::string detail;
  char buffer[512] = {};
  cudnnGetLastErrorString(buffer, sizeof buffer);
  detail = buffer;
  throw_status("cuDNN", or_unknown(cudnnGetErrorString(status), status), detail,
               in_expression(expr), file, line, function);
}

}  // namespace mixprec::detail
