// The ranks of a data-parallel run and the collectives they run together.
//
// A Communicator joins the processes that `mpirun -np N mixprec ...` started (N = size(),
// this one is rank()); without mpirun there is one rank and every collective returns its
// input. Collectives are called by every rank in the same order with tensors of one dtype
// and (except all_gather) one numel; the tensors live on device() (the host for MPI, the GPU
// for NCCL).
//
// Every collective runs under the watchdog (dist/watchdog.h): one that has not finished
// after the timeout prints the rank, the operation, its sequence number and the step (see
// set_step), and ends every rank with a non-zero exit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace mixprec::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "none" (one process), "mpi" or "nccl".
  virtual std::string backend() const = 0;
  // Where the collectives' tensors live.
  virtual Device device() const = 0;

  // F32 `values` becomes, on every rank, the sum over ranks in rank order, each addition
  // rounded to FP32: ((+0 + x_0) + x_1) + ... + x_{N-1}. Every rank holds the same bits, those
  // of a serial left-to-right sum, whatever N is and however the work is split.
  virtual void sum_in_rank_order(Tensor& values) = 0;
  // F32 or I32 `values` becomes the elementwise maximum over ranks (for F32, NaN wins over
  // any number, so a NaN flag on one rank is a NaN flag on all).
  virtual void max(Tensor& values) = 0;
  // Every rank's `mine` (any dtype, 1-D, any numel including 0, the dtype the same on every
  // rank) concatenated in rank order, on every rank.
  virtual Tensor all_gather(const Tensor& mine) = 0;
  // `values` (any dtype) becomes root's on every rank.
  virtual void broadcast(Tensor& values, int root) = 0;
  // Host bytes: root's `bytes` on every rank (sizes may differ before the call).
  virtual std::vector<uint8_t> broadcast_bytes(const std::vector<uint8_t>& bytes, int root) = 0;
  // Every rank's `value` in rank order, on every rank (agreement checks, sizes).
  virtual std::vector<int64_t> all_gather_int(int64_t value) = 0;
  virtual void barrier() = 0;

  // The training step a collective belongs to, for the watchdog's message.
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

 private:
  int64_t step_ = 0;
};

// One rank: every collective leaves its input as it is (the sum of one value, +0 + x, turns a
// -0 into +0, as a serial sum does).
std::unique_ptr<Communicator> make_single_process();

// True when this process was started by mpirun (Open MPI's environment says so).
bool launched_by_mpirun();

// Ends every rank of the job with exit code `code` (MPI_Abort) when MPI is running in this
// process; returns otherwise. For a rank that fails on its own: without it, the other ranks
// would wait in their next collective until the watchdog's timeout.
void end_every_rank(int code);

// The communicator of `backend` (distributed.backend): "none" one rank; "mpi" the MPI ranks,
// for tensors on the host; "nccl" the MPI ranks with NCCL carrying tensors on `device`, a GPU;
// "auto" nccl when `device` is a GPU and NCCL is built in, mpi under mpirun, else none.
// `timeout_s` (> 0) is every collective's watchdog limit. Throws mixprec::Error with one
// clear line for a backend this build lacks (mpi or nccl), nccl without a GPU, and mpi or nccl
// requested without mpirun (one rank) is fine: it runs as one rank.
std::unique_ptr<Communicator> make_communicator(const std::string& backend, double timeout_s,
                                                Device device);

}  // namespace mixprec::dist
