#include "cuda/emulation/runtime_emulation.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <cuda_runtime_api.h>

#include "cuda/emulation/stream_capture.h"
#include "cuda/emulation/thread_scheduler.h"

namespace mixprec::emulation {
namespace {

// Allocations by start address, for the bounds checks of copies and for cudaFree.
// Page-locked host allocations (cudaHostAlloc) are kept apart: they are host memory, which
// copies do not check, and cudaFreeHost accepts only them.
struct Memory {
  std::mutex mutex;
  std::map<const char*, size_t> blocks;
  size_t bytes = 0;
  std::map<const char*, size_t> host_blocks;
};

// Never destroyed: backends free their memory from static destructors at exit, in an order
// relative to this one that nothing fixes (as the real runtime outlives them).
Memory& memory() {
  static Memory* m = new Memory;
  return *m;
}

// The runtime keeps the last error per host thread; cudaGetLastError returns and clears it.
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

cudaError_t record(cudaError_t status) {
  if (status != cudaSuccess) last_error = status;
  return status;
}

// Checks a potentially unsafe call against the captures in progress (stream_capture.h).
cudaError_t unsafe_call() { return record(check_unsafe_call()); }

// True when [p, p + n) lies inside one live allocation.
bool inside_allocation(const void* p, size_t n) {
  Memory& m = memory();
  const std::lock_guard<std::mutex> lock(m.mutex);
  const auto* c = static_cast<const char*>(p);
  auto it = m.blocks.upper_bound(c);
  if (it == m.blocks.begin()) return false;
  --it;
  return c >= it->first && c + n <= it->first + it->second;
}

// Frees `p`, one of `blocks` (cudaFree's device blocks or cudaFreeHost's host blocks), and
// takes its size off `*bytes` when given; null is a no-op, and a pointer not listed is
// cudaErrorInvalidValue.
cudaError_t release(std::map<const char*, size_t>& blocks, void* p, size_t* bytes) {
  if (p == nullptr) return cudaSuccess;
  {
    const std::lock_guard<std::mutex> lock(memory().mutex);
    const auto it = blocks.find(static_cast<const char*>(p));
    if (it == blocks.end()) return record(cudaErrorInvalidValue);
    if (bytes != nullptr) *bytes -= it->second;
    blocks.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

bool valid_configuration(dim3 grid, dim3 block) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  return grid.x > 0 && grid.y > 0 && grid.z > 0 && grid.x <= 2147483647u && grid.y <= 65535 &&
         grid.z <= 65535 &&
         threads > 0 && threads <= 1024 && block.z <= 64;
}

// cudaSuccess when the device side of a copy lies inside one live allocation (host-to-host
// and cudaMemcpyDefault copies are not checked), cudaErrorInvalidValue otherwise.
cudaError_t check_copy(const void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  const bool device_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool device_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if ((device_src && !inside_allocation(src, count)) || (device_dst && !inside_allocation(dst, count)))
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

// A checked copy; in host_only() mode only copies to the host move their bytes.
cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  if (const cudaError_t status = check_copy(dst, src, count, kind); status != cudaSuccess)
    return record(status);
  const bool to_host = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost ||
                       kind == cudaMemcpyDefault;
  if (!to_host && host_only()) return cudaSuccess;
  std::memmove(dst, src, count);
  return cudaSuccess;
}

// A checked memset (nothing moves in host_only() mode).
cudaError_t fill(void* dev_ptr, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  if (!inside_allocation(dev_ptr, count)) return record(cudaErrorInvalidValue);
  if (!host_only()) std::memset(dev_ptr, value, count);
  return cudaSuccess;
}

// Queues `work`, checked first by `check` (a status), on `stream`: a failing check is
// recorded (and invalidates a capture of the stream) and nothing is queued.
template <class Work>
cudaError_t queue_checked(cudaStream_t stream, cudaError_t check, const Work& work) {
  if (check != cudaSuccess) {
    invalidate_capture(stream);
    return record(check);
  }
  return record(enqueue(stream, work));
}

}  // namespace

bool host_only() {
  static const bool enabled = [] {
    const char* value = std::getenv("MIXPREC_EMULATION_HOST_ONLY");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return enabled;
}

namespace {
std::atomic<int> refusing_epilogues{0};  // a cublasStatus_t; 0: none
std::atomic<int64_t> refused_epilogues{0};
}  // namespace

void set_refuse_epilogue_matmuls(int status) { refusing_epilogues.store(status); }
int refuse_epilogue_matmuls() { return refusing_epilogues.load(); }
int64_t refused_epilogue_matmuls() { return refused_epilogues.load(); }
void count_refused_epilogue_matmul() { refused_epilogues.fetch_add(1); }

void launch_on_cpu(dim3 grid, dim3 block, const std::function<void()>& body) {
  if (!valid_configuration(grid, block)) {
    record(cudaErrorInvalidConfiguration);
    return;
  }
  if (!host_only()) run_grid(grid, block, body);
}

void capture_launch(cudaStream_t stream, dim3 grid, dim3 block, std::function<void()> body) {
  const cudaError_t check =
      valid_configuration(grid, block) ? cudaSuccess : cudaErrorInvalidConfiguration;
  queue_checked(stream, check, [grid, block, body = std::move(body)] {
    if (!host_only()) run_grid(grid, block, body);
  });
}

void refuse_stateful_capture(cudaStream_t stream) {
  invalidate_capture(stream);
  record(cudaErrorStreamCaptureUnsupported);
}

bool stream_capturing(cudaStream_t stream) { return capturing(stream); }

cudaError_t record_error(cudaError_t status) { return record(status); }

size_t live_allocations() {
  const std::lock_guard<std::mutex> lock(memory().mutex);
  return memory().blocks.size();
}

size_t live_bytes() {
  const std::lock_guard<std::mutex> lock(memory().mutex);
  return memory().bytes;
}

}  // namespace mixprec::emulation

using mixprec::emulation::kEmulatedDeviceBytes;
using mixprec::emulation::memory;
using mixprec::emulation::record;
using mixprec::emulation::release;
using mixprec::emulation::unsafe_call;

extern "C" {

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  if (dev_ptr == nullptr) return record(cudaErrorInvalidValue);
  *dev_ptr = nullptr;
  if (const cudaError_t status = unsafe_call(); status != cudaSuccess) return status;
  if (size == 0) return cudaSuccess;
  auto& m = memory();
  {
    // The bytes are reserved before the host allocation, so that threads allocating at once
    // cannot together pass the device's size.
    const std::lock_guard<std::mutex> lock(m.mutex);
    if (size > kEmulatedDeviceBytes - m.bytes) return record(cudaErrorMemoryAllocation);
    m.bytes += size;
  }
  // Exact size, so that a host memory checker sees an access one past the end.
  void* p = nullptr;
  if (posix_memalign(&p, 256, size) != 0) {
    const std::lock_guard<std::mutex> lock(m.mutex);
    m.bytes -= size;
    return record(cudaErrorMemoryAllocation);
  }
  std::memset(p, mixprec::emulation::host_only() ? 0 : 0xFF, size);
  const std::lock_guard<std::mutex> lock(m.mutex);
  m.blocks.emplace(static_cast<const char*>(p), size);
  *dev_ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* dev_ptr) {
  if (const cudaError_t status = unsafe_call(); status != cudaSuccess) return status;
  auto& m = memory();
  return release(m.blocks, dev_ptr, &m.bytes);
}

// Page-locked host memory is plain host memory here, aligned to a page as the driver's is; it
// does not count against the device's memory. A request above kEmulatedPinnedBytes fails with
// cudaErrorMemoryAllocation before any host memory is asked for, as the driver refuses what
// it cannot pin (and a sanitizer's allocator would abort on an absurd size instead).
cudaError_t cudaHostAlloc(void** host_ptr, size_t size, unsigned int flags) {
  if (host_ptr == nullptr) return record(cudaErrorInvalidValue);
  *host_ptr = nullptr;
  constexpr unsigned int kValidFlags =
      cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if ((flags & ~kValidFlags) != 0) return record(cudaErrorInvalidValue);
  if (const cudaError_t status = unsafe_call(); status != cudaSuccess) return status;
  if (size == 0) return cudaSuccess;
  if (size > mixprec::emulation::kEmulatedPinnedBytes) return record(cudaErrorMemoryAllocation);
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size) != 0) return record(cudaErrorMemoryAllocation);
  auto& m = memory();
  const std::lock_guard<std::mutex> lock(m.mutex);
  m.host_blocks.emplace(static_cast<const char*>(p), size);
  *host_ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* host_ptr) {
  if (const cudaError_t status = unsafe_call(); status != cudaSuccess) return status;
  return release(memory().host_blocks, host_ptr, nullptr);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return record(cudaErrorInvalidValue);
  *total_bytes = kEmulatedDeviceBytes;
  *free_bytes = kEmulatedDeviceBytes - mixprec::emulation::live_bytes();
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (const cudaError_t status = unsafe_call(); status != cudaSuccess) return status;
  return mixprec::emulation::copy(dst, src, count, kind);
}

// Captured, the copy reads its source when the graph runs, not when it is captured.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return mixprec::emulation::queue_checked(
      stream, mixprec::emulation::check_copy(dst, src, count, kind),
      [=] { mixprec::emulation::copy(dst, src, count, kind); });
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  if (const cudaError_t status = unsafe_call(); status != cudaSuccess) return status;
  return mixprec::emulation::fill(dev_ptr, value, count);
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const bool inside = mixprec::emulation::inside_allocation(dev_ptr, count);
  return mixprec::emulation::queue_checked(stream, inside ? cudaSuccess : cudaErrorInvalidValue,
                                           [=] { mixprec::emulation::fill(dev_ptr, value, count); });
}

// Streams are distinct non-null handles; work on them has finished when the call queuing it
// returned.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (stream == nullptr) return record(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return record(mixprec::emulation::check_stream_synchronize(stream));
}
cudaError_t cudaDeviceSynchronize(void) { return unsafe_call(); }

// Work queued before it on the stream has finished already, so the host function runs now;
// the stream's later work waits for it, as on a GPU, because it is queued after it returns.
// Captured, it runs at each launch of the graph.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return record(cudaErrorInvalidValue);
  return record(mixprec::emulation::enqueue(stream, [fn, user_data] { fn(user_data); }));
}

// Events: work on an emulated stream has finished when the call queuing it returns, so an
// event completes when it is recorded and its timestamp is the host's clock at that moment.
// The time between two events is the host time the work between them took; an event never
// recorded has no time (cudaErrorInvalidResourceHandle, as on a GPU).
// An event recorded on a stream being captured is `captured` until a later record (or the
// graph's replay of that record) outside a capture: querying, synchronizing or timing it
// meanwhile is cudaErrorCapturedEvent.
struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
  bool captured = false;
};

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return record(cudaErrorInvalidValue);
  *event = new CUevent_st;
  return cudaSuccess;
}

// The flags change nothing here: timing is always taken, and synchronising never blocks.
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return record(cudaErrorInvalidValue);
  constexpr unsigned int kValidFlags =
      cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if ((flags & ~kValidFlags) != 0) return record(cudaErrorInvalidValue);
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return record(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return record(cudaErrorInvalidResourceHandle);
  const auto mark = [event] {
    event->at = std::chrono::steady_clock::now();
    event->recorded = true;
    event->captured = false;
  };
  if (mixprec::emulation::capturing(stream)) event->captured = true;
  return record(mixprec::emulation::enqueue(stream, mark));
}

// An event that may be waited for or asked about now: a valid handle, not recorded in a
// capture, and no capture prohibiting the call (stream_capture.h).
static cudaError_t check_event_call(cudaEvent_t event) {
  if (event == nullptr) return record(cudaErrorInvalidResourceHandle);
  if (event->captured) return record(cudaErrorCapturedEvent);
  return unsafe_call();
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return check_event_call(event); }

// Every recorded event has completed (and one never recorded marks no work, as on a GPU), so
// the query never answers cudaErrorNotReady.
cudaError_t cudaEventQuery(cudaEvent_t event) { return check_event_call(event); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return record(cudaErrorInvalidValue);
  if (start == nullptr || end == nullptr || !start->recorded || !end->recorded) {
    return record(cudaErrorInvalidResourceHandle);
  }
  if (start->captured || end->captured) return record(cudaErrorCapturedEvent);
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return record(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return record(cudaErrorInvalidDevice);
  mixprec::emulation::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return record(cudaErrorInvalidValue);
  *device = mixprec::emulation::current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return record(cudaErrorInvalidValue);
  if (device != 0) return record(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "CPU emulation of a CUDA device", sizeof prop->name - 1);
  prop->totalGlobalMem = kEmulatedDeviceBytes;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->sharedMemPerBlock = 48 << 10;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t status = mixprec::emulation::last_error;
  mixprec::emulation::last_error = cudaSuccess;
  return status;
}

cudaError_t cudaPeekAtLastError(void) { return mixprec::emulation::last_error; }

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return record(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return record(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define MIXPREC_EMULATION_ERROR_NAME(code) \
  case code:                               \
    return #code;
    MIXPREC_EMULATION_ERROR_NAME(cudaSuccess)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorInvalidValue)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorMemoryAllocation)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorInvalidConfiguration)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorInvalidDevice)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorInvalidResourceHandle)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorNotReady)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorNoDevice)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorLaunchFailure)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorIllegalAddress)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorMisalignedAddress)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorAssert)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorIllegalState)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorNotSupported)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorStreamCaptureUnsupported)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorStreamCaptureInvalidated)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorCapturedEvent)
    MIXPREC_EMULATION_ERROR_NAME(cudaErrorStreamCaptureWrongThread)
#undef MIXPREC_EMULATION_ERROR_NAME
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    default: return "unknown error";
  }
}

}  // extern "C"
