// Internal: the processes of a data-parallel run, over MPI. A process started by an MPI launcher
// (mpirun: Open MPI, MPICH, Slurm's PMI) joins MPI_COMM_WORLD on first use; one started alone is a
// group of one and never touches MPI. In a build without MPI, a launch of more than one process is
// an error that says so. MPI is finalized at exit, unless a run failed (fail()): the process then
// leaves without MPI_Finalize, which makes mpirun stop the others instead of their waiting forever
// in a collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace relpos::detail {

class ProcessGroup {
 public:
  // This process's group (MPI is initialised on the first call when a launcher started us).
  static ProcessGroup& world();
  static bool built_with_mpi();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the processes on this machine
  bool launched() const { return launched_; }     // started by an MPI launcher (even as one process)

  // Blocking collectives over every process (each must call them in the same order).
  void allreduce_sum(double* values, std::size_t n);
  // Every process's n values, rank after rank, into all (n * size()).
  void allgather(const double* mine, std::size_t n, double* all);
  void allgather(const std::uint64_t* mine, std::size_t n, std::uint64_t* all);
  void broadcast(void* data, std::size_t bytes, int root);

  // Non-blocking float sums in place; finish them with wait_all (progress(): let MPI move them on).
  struct Request {
    void* handle = nullptr;  // an MPI_Request, owned by the group
  };
  Request iallreduce_sum(float* values, std::size_t n);
  void progress();
  void wait_all();

  // A run failed on this process: skip MPI_Finalize at exit (see above).
  void fail() { failed_ = true; }

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

 private:
  ProcessGroup();
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool launched_ = false, failed_ = false;
  std::vector<void*> pending_;  // MPI_Request handles in flight
};

}  // namespace relpos::detail
