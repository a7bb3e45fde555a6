// Input validation shared by the ops: each failure names the op, the shapes and the dtypes.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace mixprec::ops {

// Defined, non-empty unless `allow_empty`, floating dtype.
void check_floating(const char* op, const Tensor& x, bool allow_empty = false);
// Same dtype and device for every defined tensor.
void check_same_dtype_device(const char* op, std::initializer_list<const Tensor*> xs);
// x has exactly `rank` dimensions.
void check_rank(const char* op, const Tensor& x, int64_t rank, const char* what);
// Defined I32 ids on the device of `like` (the tensor they index), every value in
// [0, upper). `what` names the ids in the message ("labels").
void check_indices(const char* op, const Tensor& ids, int64_t upper, const char* what,
                   const Tensor& like);

}  // namespace mixprec::ops
