#include "cuda/gemm_plan.h"

namespace mixprec {

LtGemmMapping map_gemm_to_cublaslt(const GemmDesc& desc) {
  const bool batched = desc.batch > 1;
  LtGemmMapping map;
  map.batch = desc.batch;
  // cuBLASLt's A: B's bytes. B is stored k x n row-major (n x k when trans_b), which is the
  // column-major n x k matrix (k x n); op(B)^T = B^T then needs no transpose.
  map.a.source = GemmOperand::B;
  map.a.transpose = desc.trans_b;
  map.a.layout = {.rows = desc.trans_b ? desc.k : desc.n,
                  .cols = desc.trans_b ? desc.n : desc.k,
                  .ld = desc.trans_b ? desc.k : desc.n,
                  .stride = batched ? desc.stride_b : 0};
  // cuBLASLt's B: A's bytes, by the same reasoning with m in place of n.
  map.b.source = GemmOperand::A;
  map.b.transpose = desc.trans_a;
  map.b.layout = {.rows = desc.trans_a ? desc.m : desc.k,
                  .cols = desc.trans_a ? desc.k : desc.m,
                  .ld = desc.trans_a ? desc.m : desc.k,
                  .stride = batched ? desc.stride_a : 0};
  map.c = {.rows = desc.n, .cols = desc.m, .ld = desc.n, .stride = batched ? desc.stride_c : 0};
  return map;
}

}  // namespace mixprec
