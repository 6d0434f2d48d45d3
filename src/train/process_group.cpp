#include "train/process_group.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "relpos/error.hpp"

#ifdef RELPOS_WITH_MPI
#include <mpi.h>
#endif

namespace relpos::detail {

namespace {

// The process count an MPI launcher announced in the environment (0: not started by one).
int launcher_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  // PMIx (Open MPI 5, Slurm) may announce only a rank
  if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) return 1;
  return 0;
}

#ifdef RELPOS_WITH_MPI
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  RELPOS_FAIL("MPI: " << what << " failed: " << std::string(text, static_cast<std::size_t>(len)));
}
MPI_Request* as_request(void* p) { return static_cast<MPI_Request*>(p); }
#endif

}  // namespace

ProcessGroup& ProcessGroup::world() {
  static ProcessGroup group;
  return group;
}

#ifdef RELPOS_WITH_MPI

bool ProcessGroup::built_with_mpi() { return true; }

ProcessGroup::ProcessGroup() {
  if (launcher_size() == 0) return;  // started alone: a group of one, MPI untouched
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // The thread that trains makes every MPI call, one at a time (the data loader's threads none).
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  }
  launched_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_free(&local);
}

ProcessGroup::~ProcessGroup() {
  if (!launched_ || failed_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    for (void* r : pending_) {
      MPI_Wait(as_request(r), MPI_STATUS_IGNORE);
      delete as_request(r);
    }
    MPI_Finalize();
  }
}

void ProcessGroup::allreduce_sum(double* values, std::size_t n) {
  if (size_ == 1) return;
  check(MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
}

void ProcessGroup::allgather(const double* mine, std::size_t n, double* all) {
  check(MPI_Allgather(mine, static_cast<int>(n), MPI_DOUBLE, all, static_cast<int>(n), MPI_DOUBLE, MPI_COMM_WORLD),
        "MPI_Allgather");
}

void ProcessGroup::allgather(const std::uint64_t* mine, std::size_t n, std::uint64_t* all) {
  check(MPI_Allgather(mine, static_cast<int>(n), MPI_UINT64_T, all, static_cast<int>(n), MPI_UINT64_T, MPI_COMM_WORLD),
        "MPI_Allgather");
}

void ProcessGroup::broadcast(void* data, std::size_t bytes, int root) {
  if (size_ == 1) return;
  // in pieces: MPI counts are ints
  constexpr std::size_t kPiece = std::size_t{1} << 30;
  auto* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < bytes; done += kPiece)
    check(MPI_Bcast(p + done, static_cast<int>(std::min(kPiece, bytes - done)), MPI_BYTE, root, MPI_COMM_WORLD),
          "MPI_Bcast");
}

ProcessGroup::Request ProcessGroup::iallreduce_sum(float* values, std::size_t n) {
  RELPOS_CHECK(n <= static_cast<std::size_t>(INT32_MAX), "all-reduce of " << n << " values: too many for one MPI call");
  auto* r = new MPI_Request;
  check(MPI_Iallreduce(MPI_IN_PLACE, values, static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, r),
        "MPI_Iallreduce");
  pending_.push_back(r);
  return Request{r};
}

void ProcessGroup::progress() {
  // MPI moves non-blocking collectives on only inside MPI calls (no progress thread by default)
  for (void* r : pending_) {
    int done = 0;
    MPI_Test(as_request(r), &done, MPI_STATUS_IGNORE);
  }
}

void ProcessGroup::wait_all() {
  for (void* r : pending_) {
    const int rc = MPI_Wait(as_request(r), MPI_STATUS_IGNORE);
    delete as_request(r);
    check(rc, "MPI_Wait");
  }
  pending_.clear();
}

#else  // built without MPI: a group of one

bool ProcessGroup::built_with_mpi() { return false; }

ProcessGroup::ProcessGroup() {
  const int n = launcher_size();
  launched_ = n > 0;
  size_ = n > 0 ? n : 1;  // what the launcher asked for; data-parallel training refuses more than one
}
ProcessGroup::~ProcessGroup() = default;
void ProcessGroup::allreduce_sum(double*, std::size_t) {}
void ProcessGroup::allgather(const double* mine, std::size_t n, double* all) { std::copy(mine, mine + n, all); }
void ProcessGroup::allgather(const std::uint64_t* mine, std::size_t n, std::uint64_t* all) { std::copy(mine, mine + n, all); }
void ProcessGroup::broadcast(void*, std::size_t, int) {}
ProcessGroup::Request ProcessGroup::iallreduce_sum(float*, std::size_t) { return {}; }
void ProcessGroup::progress() {}
void ProcessGroup::wait_all() {}

#endif

}  // namespace relpos::detail
