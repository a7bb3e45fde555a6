#include "core/ops/checks.h"

#include "core/backend.h"
#include "core/error.h"

namespace mixprec::ops {

void check_floating(const char* op, const Tensor& x, bool allow_empty) {
  MIXPREC_CHECK(x.defined(), op, ": input is an undefined tensor");
  MIXPREC_CHECK(is_floating(x.dtype()), op, ": expected a floating tensor (F32, F16 or BF16), got ",
                describe(x));
  MIXPREC_CHECK(allow_empty || x.numel() > 0, op, ": input ", describe(x), " is empty");
}

void check_same_dtype_device(const char* op, std::initializer_list<const Tensor*> xs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : xs) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    MIXPREC_CHECK(t->dtype() == first->dtype(), op, ": dtype mismatch between ", describe(*first),
                  " and ", describe(*t), " (convert explicitly with .to(dtype))");
    MIXPREC_CHECK(t->device() == first->device(), op, ": device mismatch between ",
                  describe(*first), " on ", first->device(), " and ", describe(*t), " on ",
                  t->device());
  }
}

void check_rank(const char* op, const Tensor& x, int64_t rank, const char* what) {
  MIXPREC_CHECK(x.defined() && x.dim() == rank, op, ": ", what, " must have ", rank,
                " dimensions, got ", describe(x));
}

void check_indices(const char* op, const Tensor& ids, int64_t upper, const char* what,
                   const Tensor& like) {
  MIXPREC_CHECK(ids.defined(), op, ": ", what, " is an undefined tensor");
  MIXPREC_CHECK(ids.dtype() == DType::I32, op, ": ", what, " must be I32 indices, got ",
                describe(ids));
  MIXPREC_CHECK(ids.device() == like.device(), op, ": ", what, " ", describe(ids), " on ",
                ids.device(), " and ", describe(like), " on ", like.device(),
                " are on different devices");
  if (!ids.device().is_cpu()) {
    // Indices copied from the host whose bounds fit need no wait for the device; any others
    // (bounds unknown or outside the range) are searched on the device for the message.
    const std::optional<Storage::IndexBounds> bounds = ids.index_bounds();
    if (bounds && bounds->lowest >= 0 && bounds->highest < upper) return;
  }
  const int64_t bad = backend_for(ids.device()).find_out_of_range(ids, upper);
  if (bad >= 0)
    MIXPREC_FAIL(op, ": ", what, " ", describe(ids), " holds ", ids.get(bad), " at index ", bad,
                 ", outside the valid range [0, ", upper, ")");
}

}  // namespace mixprec::ops
