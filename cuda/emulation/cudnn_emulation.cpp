// cuDNN's legacy convolution API for the emulated backend, on the host, with the semantics
// that cuda/cuda_conv.cpp relies on (cuDNN 9 API reference and developer guide):
//   - Tensors: cudnnSetTensor4dDescriptor in CUDNN_TENSOR_NCHW format, i.e. fully packed NCHW
//     (the descriptor keeps the strides and the loops index through them). Filters:
//     cudnnSetFilter4dDescriptor in CUDNN_TENSOR_NCHW format, i.e. packed KCRS.
//   - 2-D cross-correlation from cudnnSetConvolution2dDescriptor (padding and stride; the
//     backend's convolutions are ungrouped and undilated). Output extent per spatial axis, as
//     cudnnGetConvolution2dForwardOutputDim gives it: 1 + (in + 2 * pad - filter) / stride.
//     Output pixel p reads input row p * stride - pad + r for filter tap r, zero outside the
//     input, and multiplies it by w[k, c, r, s].
//   - cudnnConvolutionForward gives y from x and w, cudnnConvolutionBackwardData dx from dy and
//     w (the adjoint in x), cudnnConvolutionBackwardFilter dw from x and dy (the adjoint in w).
//     Each blends as alpha * result + beta * prior, alpha and beta host floats; the prior value
//     is not read when beta is 0 (it "may contain uninitialized data (including NaN)").
//   - Data types FLOAT, HALF and BFLOAT16 with compute type FLOAT (FLOAT_CONFIG,
//     PSEUDO_HALF_CONFIG, PSEUDO_BFLOAT16_CONFIG): products summed in FP32, the blend in FP32,
//     one rounding to the data type on store. FP32 data may run on TF32 tensor cores under
//     CUDNN_DEFAULT_MATH and CUDNN_TENSOR_OP_MATH (whether they do depends on the kernel the
//     library picks for the problem), so there both operands are always rounded to TF32, the
//     coarser of the two outcomes; CUDNN_FMA_MATH keeps every bit.
//   - The library documents no summation order; this one is fixed, so results repeat bit for
//     bit: multiply-adds from zero (fused where the host has the instruction), y over
//     (c, r, s), dx over (k, r, s), dw over (n, p, q), each in ascending order.
//   - The heuristics (cudnnGet*Algorithm_v7) rank first the deterministic algorithm needing
//     no workspace that cuDNN 9 ranks first for the backend's problems (IMPLICIT_PRECOMP_GEMM
//     forward, ALGO_1 for both backward passes), then a few others, deterministic or not, with
//     or without workspace (kForwardAlgos and its neighbours below), so that an autotuner has
//     candidates to choose from. All compute the same result. The workspace-size queries
//     answer each algorithm's workspace, and an execution given less fails with BAD_PARAM.
//   - Handles keep their stream; work runs at once on the calling thread, as the emulated
//     runtime's streams do, or is captured into a graph while the stream is being captured. cudnnGetLastErrorString gives the reason of the thread's last
//     refusal.
// Descriptors are checked as cuDNN 9 checks them (its answers measured with 9.19 where they
// differ from the API reference's lists): a descriptor NULL or never set, input channels
// other than the filter's, a filter larger than the padded input, and a y (or dy) whose extents
// are not cudnnGetConvolution2dForwardOutputDim's are CUDNN_STATUS_BAD_PARAM, in every pass;
// x, w and y of different data types are CUDNN_STATUS_NOT_SUPPORTED (the reference says
// BAD_PARAM; the library answers NOT_SUPPORTED, and its heuristics then offer algorithms
// whose status is NOT_SUPPORTED). So a descriptor the backend gets wrong fails here as on a
// GPU.
// Refused with CUDNN_STATUS_NOT_SUPPORTED, so that new use of the library is emulated on
// purpose rather than ignored: other tensor formats (NHWC, NCHW_VECT_C), data types other
// than the three, compute types other than FLOAT (TRUE_HALF_CONFIG, DOUBLE_CONFIG),
// CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, CUDNN_CONVOLUTION mode, a dilation other than 1, and
// running an algorithm the heuristic did not offer; cudnnSetConvolutionGroupCount is not
// defined. The emulation keeps what checks the backend's own use of the library: the
// descriptors it builds, the passes' operands, the blend, the math types and the algorithm
// choice, not the features it never asks for.
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "cuda/emulation/runtime_emulation.h"
#include "cuda/emulation/stream_capture.h"
#include "cuda/emulation/tf32.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

// Extents and element strides of a 4-D NCHW tensor.
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  int64_t stride_n = 0, stride_c = 0, stride_h = 0, stride_w = 0;
};

// A packed KCRS filter.
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, r = 0, s = 0;
};

// A new descriptor has cuDNN's default math type, CUDNN_DEFAULT_MATH.
struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

// An algorithm the emulated heuristic offers, in its ranking order, with how it sums and the
// workspace it asks for. All of them compute the same (the emulation's fixed order): the
// non-deterministic ones are offered so that the backend's refusal of them is exercised, the
// ones with workspace so that its workspace handling is.
template <class Algo>
struct Offered {
  Algo algo;
  cudnnDeterminism_t determinism;
  size_t workspace;
};

constexpr Offered<cudnnConvolutionFwdAlgo_t> kForwardAlgos[] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_DETERMINISTIC, 0},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_DETERMINISTIC, 0},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_DETERMINISTIC, 4096}};
constexpr Offered<cudnnConvolutionBwdDataAlgo_t> kBackwardDataAlgos[] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_DETERMINISTIC, 0},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_NON_DETERMINISTIC, 0},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT, CUDNN_DETERMINISTIC, 2048}};
constexpr Offered<cudnnConvolutionBwdFilterAlgo_t> kBackwardFilterAlgos[] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_DETERMINISTIC, 0},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_NON_DETERMINISTIC, 0},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, CUDNN_NON_DETERMINISTIC, 0},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT, CUDNN_DETERMINISTIC, 2048}};

thread_local std::string last_error;

cudnnStatus_t fail(cudnnStatus_t status, std::string message) {
  last_error = std::move(message);
  return status;
}

std::string type_name(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return "CUDNN_DATA_FLOAT";
    case CUDNN_DATA_HALF: return "CUDNN_DATA_HALF";
    case CUDNN_DATA_BFLOAT16: return "CUDNN_DATA_BFLOAT16";
    case CUDNN_DATA_DOUBLE: return "CUDNN_DATA_DOUBLE";
    default: return "data type " + std::to_string(static_cast<int>(t));
  }
}

bool emulated_type(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16;
}

// A descriptor's data type: BAD_PARAM for a value no enumerant has, NOT_SUPPORTED for one
// that is not emulated.
cudnnStatus_t check_type(const char* fn, const char* what, cudnnDataType_t t) {
  if (static_cast<int>(t) < 0)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(fn) + ": invalid " + what + " " + type_name(t));
  if (!emulated_type(t))
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(fn) + ": " + what + " " + type_name(t) +
                                                " is not emulated (FLOAT, HALF and BFLOAT16 are)");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_format(const char* fn, cudnnTensorFormat_t format) {
  switch (format) {
    case CUDNN_TENSOR_NCHW: return CUDNN_STATUS_SUCCESS;
    case CUDNN_TENSOR_NHWC:
    case CUDNN_TENSOR_NCHW_VECT_C:
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  std::string(fn) + ": only CUDNN_TENSOR_NCHW is emulated, not format " +
                      std::to_string(static_cast<int>(format)));
    default:
      return fail(CUDNN_STATUS_BAD_PARAM, std::string(fn) + ": invalid tensor format " +
                                              std::to_string(static_cast<int>(format)));
  }
}

std::string dims_str(int a, int b, int c, int d) {
  std::string out = "[";
  for (const int v : {a, b, c, d}) {
    if (out.size() > 1) out += ", ";
    out += std::to_string(v);
  }
  return out + "]";
}

std::string dims_str(const cudnnTensorStruct& t) { return dims_str(t.n, t.c, t.h, t.w); }
std::string dims_str(const cudnnFilterStruct& f) { return dims_str(f.k, f.c, f.r, f.s); }

// The four extents of a tensor or filter: each at least 1, the product at most 2^31 - 1
// elements (cuDNN's limit for a descriptor).
cudnnStatus_t check_extents(const char* fn, int a, int b, int c, int d) {
  if (a <= 0 || b <= 0 || c <= 0 || d <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(fn) + ": extents " + dims_str(a, b, c, d) +
                                            " must all be positive");
  if (int64_t{a} * b * c * d > INT32_MAX)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, std::string(fn) + ": extents " + dims_str(a, b, c, d) +
                                                " exceed 2^31 - 1 elements");
  return CUDNN_STATUS_SUCCESS;
}

float load(cudnnDataType_t type, const void* base, int64_t index) {
  switch (type) {
    case CUDNN_DATA_HALF: return float(static_cast<const mixprec::half*>(base)[index]);
    case CUDNN_DATA_BFLOAT16: return float(static_cast<const mixprec::bfloat16*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

void store(cudnnDataType_t type, void* base, int64_t index, float value) {
  switch (type) {
    case CUDNN_DATA_HALF: static_cast<mixprec::half*>(base)[index] = mixprec::half(value); break;
    case CUDNN_DATA_BFLOAT16:
      static_cast<mixprec::bfloat16*>(base)[index] = mixprec::bfloat16(value);
      break;
    default: static_cast<float*>(base)[index] = value;
  }
}

using mixprec::emulation::to_tf32;

// acc + a * b rounded once, as the FFMA instructions of GPU kernels accumulate, where the host
// has the instruction; explicit so that the compiler's contraction choices (which differ
// between a scalar and a vectorized loop) cannot change the bits. Without it std::fma is a
// slow library routine, and no contraction can happen either, so the plain expression is
// used.
inline float madd(float a, float b, float acc) {
#if defined(__FMA__)
  return std::fma(a, b, acc);
#else
  return a * b + acc;
#endif
}

// Output extent of one spatial axis (cudnnGetConvolution2dForwardOutputDim's formula), or 0
// when the dilated filter is larger than the padded input.
int output_extent(int in, int filter, int pad, int stride) {
  const int64_t room = int64_t{in} + 2 * int64_t{pad} - filter;
  return room < 0 ? 0 : static_cast<int>(1 + room / stride);
}

enum class Pass { Forward, BackwardData, BackwardFilter };

// The descriptors of one problem as the function names them.
struct Names {
  const char* fn;
  const char* x;
  const char* w;
  const char* y;
};

Names names(const char* fn, Pass pass) {
  switch (pass) {
    case Pass::Forward: return {fn, "xDesc", "wDesc", "yDesc"};
    case Pass::BackwardData: return {fn, "dxDesc", "wDesc", "dyDesc"};
    case Pass::BackwardFilter: return {fn, "xDesc", "dwDesc", "dyDesc"};
  }
  return {fn, "xDesc", "wDesc", "yDesc"};
}

// The output extents [n, k, p, q] of convolving x by w under conv, after the checks shared by
// every function that takes these three descriptors.
cudnnStatus_t forward_dims(const Names& nm, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                           const cudnnConvolutionStruct* conv, int out[4]) {
  const std::string fn = nm.fn;
  if (x == nullptr || w == nullptr || conv == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, fn + ": a descriptor is NULL");
  if (!x->set || !w->set || !conv->set)
    return fail(CUDNN_STATUS_BAD_PARAM, fn + ": a descriptor was created but never set");
  if (w->c != x->c)
    return fail(CUDNN_STATUS_BAD_PARAM,
                fn + ": " + nm.x + " " + dims_str(*x) + " has " + std::to_string(x->c) +
                    " input channels but " + nm.w + " " + dims_str(*w) + " takes " +
                    std::to_string(w->c));
  const int p = output_extent(x->h, w->r, conv->pad_h, conv->stride_h);
  const int q = output_extent(x->w, w->s, conv->pad_w, conv->stride_w);
  if (p == 0 || q == 0)
    return fail(CUDNN_STATUS_BAD_PARAM,
                fn + ": " + nm.w + " " + dims_str(*w) + " is larger than " + nm.x + " " +
                    dims_str(*x) + " padded by " + std::to_string(conv->pad_h) + "x" +
                    std::to_string(conv->pad_w));
  out[0] = x->n;
  out[1] = w->k;
  out[2] = p;
  out[3] = q;
  return CUDNN_STATUS_SUCCESS;
}

// The problem of three descriptors and a convolution, checked as the API reference lists for
// the pass's execution function.
struct Problem {
  const cudnnTensorStruct* x;
  const cudnnFilterStruct* w;
  const cudnnConvolutionStruct* conv;
  const cudnnTensorStruct* y;
};

cudnnStatus_t validate(const Names& nm, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                       const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y,
                       Problem& out) {
  const std::string fn = nm.fn;
  if (y == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, fn + ": " + nm.y + " is NULL");
  int dims[4];
  const cudnnStatus_t status = forward_dims(nm, x, w, conv, dims);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  if (!y->set) return fail(CUDNN_STATUS_BAD_PARAM, fn + ": " + nm.y + " was never set");
  if (y->n != dims[0] || y->c != dims[1] || y->h != dims[2] || y->w != dims[3])
    return fail(CUDNN_STATUS_BAD_PARAM, fn + ": " + nm.y + " is " + dims_str(*y) + " but " +
                                            nm.x + " " + dims_str(*x) + " convolved by " + nm.w +
                                            " " + dims_str(*w) + " gives " +
                                            dims_str(dims[0], dims[1], dims[2], dims[3]));
  if (x->type != w->type || x->type != y->type)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                fn + ": " + nm.x + ", " + nm.w + " and " + nm.y + " have different data types (" +
                    type_name(x->type) + ", " + type_name(w->type) + ", " + type_name(y->type) +
                    ")");
  out = {x, w, conv, y};
  return CUDNN_STATUS_SUCCESS;
}

int64_t at(const cudnnTensorStruct& t, int n, int c, int h, int w) {
  return n * t.stride_n + c * t.stride_c + h * t.stride_h + w * t.stride_w;
}

// The indices i in [0, count) with first + i * step in [0, extent).
struct Range {
  int lo, hi;
};

Range inside(int first, int extent, int count, int step) {
  const int lo = first < 0 ? (-first + step - 1) / step : 0;
  const int room = extent - 1 - first;
  const int hi = room < 0 ? 0 : std::min(count, room / step + 1);
  return {lo, std::max(lo, hi)};
}

// What every pass shares: the operands as packed float arrays (rounded to TF32 where the
// math type allows it), the geometry and the blend. Output pixel (p, q) reads input row
// p * stride_h - pad_h + r and column q * stride_w - pad_w + s through tap (r, s).
class Pass2d {
 public:
  Pass2d(const Problem& pb, const void* alpha, const void* beta)
      : x(*pb.x), w(*pb.w), y(*pb.y), conv(*pb.conv),
        tf32_(pb.x->type == CUDNN_DATA_FLOAT && pb.conv->math != CUDNN_FMA_MATH),
        alpha_(*static_cast<const float*>(alpha)),
        beta_(*static_cast<const float*>(beta)) {}

  // The tensor described by t, packed NCHW.
  std::vector<float> operand(const cudnnTensorStruct& t, const void* base) const {
    std::vector<float> out(static_cast<size_t>(t.n) * t.c * t.h * t.w);
    size_t i = 0;
    for (int n = 0; n < t.n; ++n)
      for (int c = 0; c < t.c; ++c)
        for (int h = 0; h < t.h; ++h)
          for (int col = 0; col < t.w; ++col)
            out[i++] = round(load(t.type, base, at(t, n, c, h, col)));
    return out;
  }

  // The packed KCRS filter: element (k, c, r, s) multiplies the input that tap (r, s) reads.
  std::vector<float> taps(const void* base) const {
    std::vector<float> out(static_cast<size_t>(w.k) * w.c * w.r * w.s);
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = round(load(w.type, base, static_cast<int64_t>(i)));
    return out;
  }

  // The first input row output row p reads, and the taps r whose row lies inside the input.
  int row0(int p) const { return p * conv.stride_h - conv.pad_h; }
  Range rows(int p) const { return inside(row0(p), x.h, w.r, 1); }
  // The input column output column q reads through tap s is q * stride_w + offset(s); the
  // output columns whose column lies inside the input.
  int offset(int s) const { return s - conv.pad_w; }
  Range cols(int s) const { return inside(offset(s), x.w, y.w, conv.stride_w); }

  void blend(cudnnDataType_t type, void* base, int64_t index, float result) const {
    const float scaled = alpha_ * result;
    store(type, base, index, beta_ != 0.0f ? madd(beta_, load(type, base, index), scaled) : scaled);
  }

  const cudnnTensorStruct& x;
  const cudnnFilterStruct& w;
  const cudnnTensorStruct& y;
  const cudnnConvolutionStruct& conv;

 private:
  float round(float v) const { return tf32_ ? to_tf32(v) : v; }

  bool tf32_;
  float alpha_, beta_;
};

// y[n, k, p, q] = sum over the channels c and the taps (r, s) that land inside the input, in
// that order, of x[n, c, row, column] * w[k, c, r, s]. One output row at a time, so that the
// innermost loop runs along it.
void run_forward(const Pass2d& ps, const void* x_data, const void* w_data, void* y_data) {
  const cudnnTensorStruct &x = ps.x, &y = ps.y;
  const cudnnFilterStruct& w = ps.w;
  const int sw = ps.conv.stride_w;
  const std::vector<float> xf = ps.operand(x, x_data), wf = ps.taps(w_data);
  std::vector<float> acc(y.w);
  for (int n = 0; n < y.n; ++n) {
    for (int k = 0; k < y.c; ++k) {
      for (int p = 0; p < y.h; ++p) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        const Range rows = ps.rows(p);
        for (int c = 0; c < w.c; ++c) {
          for (int r = rows.lo; r < rows.hi; ++r) {
            const float* xrow =
                &xf[((static_cast<size_t>(n) * x.c + c) * x.h + ps.row0(p) + r) * x.w];
            const float* wr = &wf[((static_cast<size_t>(k) * w.c + c) * w.r + r) * w.s];
            for (int s = 0; s < w.s; ++s) {
              const Range cols = ps.cols(s);
              const int off = ps.offset(s);
              const float tap = wr[s];
              for (int q = cols.lo; q < cols.hi; ++q)
                acc[q] = madd(xrow[q * sw + off], tap, acc[q]);
            }
          }
        }
        for (int q = 0; q < y.w; ++q) ps.blend(y.type, y_data, at(y, n, k, p, q), acc[q]);
      }
    }
  }
}

// The adjoint of run_forward in x: dx[n, c, h, col] sums dy[n, k, p, q] * w[k, c, r, s] over
// the output channels k and the taps (r, s), in that order (as the forward sums over c, r, s),
// where (p, q) is the output pixel that reads input (h, col) through tap (r, s). One input row
// at a time.
void run_backward_data(const Pass2d& ps, const void* w_data, const void* dy_data,
                       void* dx_data) {
  const cudnnTensorStruct &x = ps.x, &y = ps.y;
  const cudnnFilterStruct& w = ps.w;
  const int ph = ps.conv.pad_h, sh = ps.conv.stride_h;
  const int sw = ps.conv.stride_w;
  const std::vector<float> dyf = ps.operand(y, dy_data), wf = ps.taps(w_data);
  std::vector<float> acc(x.w);
  for (int n = 0; n < x.n; ++n) {
    for (int c = 0; c < x.c; ++c) {
      for (int h = 0; h < x.h; ++h) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int k = 0; k < w.k; ++k) {
          for (int r = 0; r < w.r; ++r) {
            // Output row p reads input row p * sh - ph + r.
            const int t = h + ph - r;
            if (t < 0 || t % sh != 0 || t / sh >= y.h) continue;
            const float* g = &dyf[((static_cast<size_t>(n) * y.c + k) * y.h + t / sh) * y.w];
            const float* wr = &wf[((static_cast<size_t>(k) * w.c + c) * w.r + r) * w.s];
            for (int s = 0; s < w.s; ++s) {
              const Range cols = ps.cols(s);
              const int off = ps.offset(s);
              const float tap = wr[s];
              for (int q = cols.lo; q < cols.hi; ++q)
                acc[q * sw + off] = madd(g[q], tap, acc[q * sw + off]);
            }
          }
        }
        for (int col = 0; col < x.w; ++col)
          ps.blend(x.type, dx_data, at(x, n, c, h, col), acc[col]);
      }
    }
  }
}

// The adjoint of run_forward in w: tap (r, s) of (k, c) sums dy[n, k, p, q] times the input
// it read, over (n, p, q) in order.
void run_backward_filter(const Pass2d& ps, const void* x_data, const void* dy_data,
                         void* dw_data) {
  const cudnnTensorStruct &x = ps.x, &y = ps.y;
  const cudnnFilterStruct& w = ps.w;
  const int sw = ps.conv.stride_w;
  const std::vector<float> xf = ps.operand(x, x_data), dyf = ps.operand(y, dy_data);
  std::vector<float> acc(static_cast<size_t>(w.k) * w.c * w.r * w.s, 0.0f);
  for (int n = 0; n < y.n; ++n) {
    for (int k = 0; k < y.c; ++k) {
      for (int p = 0; p < y.h; ++p) {
        const float* g = &dyf[((static_cast<size_t>(n) * y.c + k) * y.h + p) * y.w];
        const Range rows = ps.rows(p);
        for (int c = 0; c < w.c; ++c) {
          for (int r = rows.lo; r < rows.hi; ++r) {
            const float* xrow =
                &xf[((static_cast<size_t>(n) * x.c + c) * x.h + ps.row0(p) + r) * x.w];
            float* ar = &acc[((static_cast<size_t>(k) * w.c + c) * w.r + r) * w.s];
            for (int s = 0; s < w.s; ++s) {
              const Range cols = ps.cols(s);
              const int off = ps.offset(s);
              float sum = ar[s];
              for (int q = cols.lo; q < cols.hi; ++q) sum = madd(g[q], xrow[q * sw + off], sum);
              ar[s] = sum;
            }
          }
        }
      }
    }
  }
  for (size_t i = 0; i < acc.size(); ++i)
    ps.blend(w.type, dw_data, static_cast<int64_t>(i), acc[i]);
}

// The algorithm queries: a BAD_PARAM problem is the call's status; otherwise the first
// `requested` offered algorithms, each with the status the execution function would answer
// (NOT_SUPPORTED for mismatched data types, as the library's heuristics give it).
template <class Perf, class Algo, size_t N>
cudnnStatus_t offer(const Names& nm, cudnnHandle_t handle, const cudnnTensorStruct* x,
                    const cudnnFilterStruct* w, const cudnnConvolutionStruct* conv,
                    const cudnnTensorStruct* y, int requested, int* returned, Perf* perfs,
                    const Offered<Algo> (&offered)[N]) {
  const std::string fn = nm.fn;
  if (handle == nullptr || returned == nullptr || perfs == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, fn + ": handle, returnedAlgoCount or perfResults is NULL");
  *returned = 0;
  if (requested <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM,
                fn + ": requestedAlgoCount " + std::to_string(requested) + " is not positive");
  Problem pb{};
  const cudnnStatus_t status = validate(nm, x, w, conv, y, pb);
  if (status == CUDNN_STATUS_BAD_PARAM) return status;
  const int count = std::min(requested, static_cast<int>(N));
  for (int i = 0; i < count; ++i) {
    std::memset(&perfs[i], 0, sizeof perfs[i]);
    perfs[i].algo = offered[i].algo;
    perfs[i].status = status;
    perfs[i].time = 0.0f;
    perfs[i].memory = offered[i].workspace;
    perfs[i].determinism = offered[i].determinism;
    perfs[i].mathType = conv->math;
  }
  *returned = count;
  return CUDNN_STATUS_SUCCESS;
}

// The offered entry of `algo`, or null for an algorithm the heuristic does not offer (any
// other value, a valid enumerant or not, is CUDNN_STATUS_NOT_SUPPORTED: what the library
// answers for a value no enumerant has).
template <class Algo, size_t N>
const Offered<Algo>* find_offered(const std::string& fn, Algo algo,
                                  const Offered<Algo> (&offered)[N]) {
  for (const Offered<Algo>& o : offered) {
    if (o.algo == algo) return &o;
  }
  fail(CUDNN_STATUS_NOT_SUPPORTED,
       fn + ": algorithm " + std::to_string(static_cast<int>(algo)) + " is not emulated");
  return nullptr;
}

template <class Algo, size_t N>
cudnnStatus_t workspace(const Names& nm, cudnnHandle_t handle, const cudnnTensorStruct* x,
                        const cudnnFilterStruct* w, const cudnnConvolutionStruct* conv,
                        const cudnnTensorStruct* y, Algo algo, const Offered<Algo> (&offered)[N],
                        size_t* bytes) {
  const std::string fn = nm.fn;
  if (handle == nullptr || bytes == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, fn + ": handle or sizeInBytes is NULL");
  Problem pb{};
  const cudnnStatus_t status = validate(nm, x, w, conv, y, pb);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  const Offered<Algo>* entry = find_offered(fn, algo, offered);
  if (entry == nullptr) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = entry->workspace;
  return CUDNN_STATUS_SUCCESS;
}

// Everything an execution function checks before it computes: also that the workspace
// given holds what the algorithm asked for (CUDNN_STATUS_BAD_PARAM otherwise).
template <class Algo, size_t N>
cudnnStatus_t prepare(const Names& nm, cudnnHandle_t handle, const void* alpha,
                      const void* beta, std::initializer_list<const void*> data,
                      const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                      const cudnnConvolutionStruct* conv, const cudnnTensorStruct* y, Algo algo,
                      const Offered<Algo> (&offered)[N], const void* workspace,
                      size_t workspace_bytes, Problem& pb) {
  const std::string fn = nm.fn;
  if (handle == nullptr || alpha == nullptr || beta == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, fn + ": handle, alpha or beta is NULL");
  for (const void* p : data) {
    if (p == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, fn + ": a data pointer is NULL");
  }
  const cudnnStatus_t status = validate(nm, x, w, conv, y, pb);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  const Offered<Algo>* entry = find_offered(fn, algo, offered);
  if (entry == nullptr) return CUDNN_STATUS_NOT_SUPPORTED;
  if (entry->workspace > 0 && (workspace == nullptr || workspace_bytes < entry->workspace))
    return fail(CUDNN_STATUS_BAD_PARAM,
                fn + ": algorithm " + std::to_string(static_cast<int>(algo)) + " needs " +
                    std::to_string(entry->workspace) + " bytes of workspace, given " +
                    std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  return CUDNN_STATUS_SUCCESS;
}

// Runs `run` (a function of the Pass2d) on the handle's stream: now, or, while the stream is
// being captured (stream_capture.h), as a node that holds copies of the descriptors and of
// alpha and beta, as cuDNN bakes them into the kernels it queues.
template <class Run>
cudnnStatus_t queue_pass(const char* fn, cudnnHandle_t handle, const Problem& pb,
                         const void* alpha, const void* beta, Run run) {
  struct Copies {
    cudnnTensorStruct x;
    cudnnFilterStruct w;
    cudnnConvolutionStruct conv;
    cudnnTensorStruct y;
  };
  const auto copies = std::make_shared<const Copies>(Copies{*pb.x, *pb.w, *pb.conv, *pb.y});
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  const cudaError_t queued =
      mixprec::emulation::enqueue(handle->stream, [copies, a, b, run] {
        if (mixprec::emulation::host_only()) return;
        const Problem local{&copies->x, &copies->w, &copies->conv, &copies->y};
        run(Pass2d(local, &a, &b));
      });
  if (queued != cudaSuccess)
    return fail(CUDNN_STATUS_EXECUTION_FAILED,
                std::string(fn) + ": the capture of the handle's stream was invalidated");
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

// ---- handle, version, errors ----------------------------------------------------------------

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: handle is NULL");
  *handle = new cudnnContext;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  if (handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: handle is NULL");
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: handle is NULL");
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr || stream == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: handle or streamId is NULL");
  *stream = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

// The enumerator's name, as cuDNN 9 gives it.
const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH:
      return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case CUDNN_STATUS_DEPRECATED: return "CUDNN_STATUS_DEPRECATED";
    case CUDNN_STATUS_LICENSE_ERROR: return "CUDNN_STATUS_LICENSE_ERROR";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
      return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    case CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED:
      return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_UNKNOWN_STATUS";
  }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  const size_t n = std::min(last_error.size(), max_size - 1);
  std::memcpy(message, last_error.data(), n);
  message[n] = '\0';
}

// ---- descriptors ----------------------------------------------------------------------------

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) {
  if (desc == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateTensorDescriptor: tensorDesc is NULL");
  *desc = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  constexpr const char* kFn = "cudnnSetTensor4dDescriptor";
  if (desc == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(kFn) + ": tensorDesc is NULL");
  cudnnStatus_t status = check_extents(kFn, n, c, h, w);
  if (status == CUDNN_STATUS_SUCCESS) status = check_format(kFn, format);
  if (status == CUDNN_STATUS_SUCCESS) status = check_type(kFn, "dataType", type);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  // CUDNN_TENSOR_NCHW: packed, w fastest.
  *desc = {true, type, n, c, h, w, int64_t{c} * h * w, int64_t{h} * w, w, 1};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) {
  if (desc == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateFilterDescriptor: filterDesc is NULL");
  *desc = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  constexpr const char* kFn = "cudnnSetFilter4dDescriptor";
  if (desc == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(kFn) + ": filterDesc is NULL");
  cudnnStatus_t status = check_extents(kFn, k, c, h, w);
  if (status == CUDNN_STATUS_SUCCESS) status = check_format(kFn, format);
  if (status == CUDNN_STATUS_SUCCESS) status = check_type(kFn, "dataType", type);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  *desc = {true, type, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) {
  if (desc == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, "cudnnCreateConvolutionDescriptor: convDesc is NULL");
  *desc = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) {
  delete desc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h,
                                              int pad_w, int u, int v, int dilation_h,
                                              int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  const std::string fn = "cudnnSetConvolution2dDescriptor";
  if (desc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, fn + ": convDesc is NULL");
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
    return fail(CUDNN_STATUS_BAD_PARAM,
                fn + ": padding " + std::to_string(pad_h) + "x" + std::to_string(pad_w) +
                    ", stride " + std::to_string(u) + "x" + std::to_string(v) + ", dilation " +
                    std::to_string(dilation_h) + "x" + std::to_string(dilation_w) +
                    ": padding must be at least 0, stride and dilation at least 1");
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return fail(CUDNN_STATUS_BAD_PARAM,
                fn + ": invalid mode " + std::to_string(static_cast<int>(mode)));
  if (mode == CUDNN_CONVOLUTION)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                fn + ": CUDNN_CONVOLUTION is not emulated (CUDNN_CROSS_CORRELATION is)");
  if (dilation_h != 1 || dilation_w != 1)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, fn + ": dilation " + std::to_string(dilation_h) +
                                                "x" + std::to_string(dilation_w) +
                                                " is not emulated (1x1 is)");
  if (static_cast<int>(compute) < 0)
    return fail(CUDNN_STATUS_BAD_PARAM, fn + ": invalid computeType " + type_name(compute));
  if (compute != CUDNN_DATA_FLOAT)
    return fail(CUDNN_STATUS_NOT_SUPPORTED,
                fn + ": computeType " + type_name(compute) + " is not emulated (FLOAT is)");
  desc->set = true;
  desc->pad_h = pad_h;
  desc->pad_w = pad_w;
  desc->stride_h = u;
  desc->stride_w = v;
  desc->compute = compute;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t math) {
  const std::string fn = "cudnnSetConvolutionMathType";
  if (desc == nullptr) return fail(CUDNN_STATUS_BAD_PARAM, fn + ": convDesc is NULL");
  switch (math) {
    case CUDNN_DEFAULT_MATH:
    case CUDNN_TENSOR_OP_MATH:
    case CUDNN_FMA_MATH: desc->math = math; return CUDNN_STATUS_SUCCESS;
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return fail(CUDNN_STATUS_NOT_SUPPORTED,
                  fn + ": CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION (down-conversion of FP32 data) "
                       "is not emulated");
    default:
      return fail(CUDNN_STATUS_BAD_PARAM,
                  fn + ": invalid mathType " + std::to_string(static_cast<int>(math)));
  }
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t conv,
                                                    const cudnnTensorDescriptor_t x,
                                                    const cudnnFilterDescriptor_t w, int* n,
                                                    int* c, int* h, int* width) {
  const Names nm{"cudnnGetConvolution2dForwardOutputDim", "inputTensorDesc", "filterDesc", ""};
  if (n == nullptr || c == nullptr || h == nullptr || width == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM, std::string(nm.fn) + ": an output pointer is NULL");
  int dims[4];
  const cudnnStatus_t status = forward_dims(nm, x, w, conv, dims);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  *n = dims[0];
  *c = dims[1];
  *h = dims[2];
  *width = dims[3];
  return CUDNN_STATUS_SUCCESS;
}

// ---- algorithm and workspace queries --------------------------------------------------------

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t y, const int requested,
    int* returned, cudnnConvolutionFwdAlgoPerf_t* perfs) {
  return offer(names("cudnnGetConvolutionForwardAlgorithm_v7", Pass::Forward), handle, x, w,
               conv, y, requested, returned, perfs, kForwardAlgos);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnTensorDescriptor_t dx, const int requested,
    int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perfs) {
  return offer(names("cudnnGetConvolutionBackwardDataAlgorithm_v7", Pass::BackwardData), handle,
               dx, w, conv, dy, requested, returned, perfs, kBackwardDataAlgos);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw, const int requested,
    int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perfs) {
  return offer(names("cudnnGetConvolutionBackwardFilterAlgorithm_v7", Pass::BackwardFilter),
               handle, x, dw, conv, dy, requested, returned, perfs, kBackwardFilterAlgos);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
                                                      const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t conv,
                                                      const cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t algo,
                                                      size_t* bytes) {
  return workspace(names("cudnnGetConvolutionForwardWorkspaceSize", Pass::Forward), handle, x,
                   w, conv, y, algo, kForwardAlgos, bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle,
                                                           const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t conv,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo,
                                                           size_t* bytes) {
  return workspace(names("cudnnGetConvolutionBackwardDataWorkspaceSize", Pass::BackwardData),
                   handle, dx, w, conv, dy, algo, kBackwardDataAlgos, bytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t conv, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
  return workspace(names("cudnnGetConvolutionBackwardFilterWorkspaceSize", Pass::BackwardFilter),
                   handle, x, dw, conv, dy, algo, kBackwardFilterAlgos, bytes);
}

// ---- the convolutions -----------------------------------------------------------------------

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                      const cudnnTensorDescriptor_t x_desc, const void* x,
                                      const cudnnFilterDescriptor_t w_desc, const void* w,
                                      const cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t algo, void* ws, size_t ws_bytes,
                                      const void* beta, const cudnnTensorDescriptor_t y_desc,
                                      void* y) {
  Problem pb{};
  const cudnnStatus_t status =
      prepare(names("cudnnConvolutionForward", Pass::Forward), handle, alpha, beta,
              {x, w, y}, x_desc, w_desc, conv, y_desc, algo, kForwardAlgos, ws, ws_bytes, pb);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  return queue_pass("cudnnConvolutionForward", handle, pb, alpha, beta,
                    [x, w, y](const Pass2d& ps) { run_forward(ps, x, w, y); });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                           const cudnnFilterDescriptor_t w_desc, const void* w,
                                           const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           const cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* ws,
                                           size_t ws_bytes,
                                           const void* beta, const cudnnTensorDescriptor_t dx_desc,
                                           void* dx) {
  Problem pb{};
  const cudnnStatus_t status =
      prepare(names("cudnnConvolutionBackwardData", Pass::BackwardData),
              handle, alpha, beta, {w, dy, dx}, dx_desc, w_desc, conv, dy_desc, algo,
              kBackwardDataAlgos, ws, ws_bytes, pb);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  return queue_pass("cudnnConvolutionBackwardData", handle, pb, alpha, beta,
                    [w, dy, dx](const Pass2d& ps) { run_backward_data(ps, w, dy, dx); });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t x_desc, const void* x,
                                             const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             const cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* ws,
                                             size_t ws_bytes,
                                             const void* beta,
                                             const cudnnFilterDescriptor_t dw_desc, void* dw) {
  Problem pb{};
  const cudnnStatus_t status =
      prepare(names("cudnnConvolutionBackwardFilter", Pass::BackwardFilter),
              handle, alpha, beta, {x, dy, dw}, x_desc, dw_desc, conv, dy_desc, algo,
              kBackwardFilterAlgos, ws, ws_bytes, pb);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  return queue_pass("cudnnConvolutionBackwardFilter", handle, pb, alpha, beta,
                    [x, dy, dw](const Pass2d& ps) { run_backward_filter(ps, x, dy, dw); });
}

}  // extern "C"
