// The system MPI as a comparator (optional: built when CMake finds MPI).
// Runs in the same processes as fastgather when fg-bench is started by
// mpirun, so both are measured on the same ranks, cores and buffers sizes.
#pragma once

#include <memory>
#include <string>

#include "cases.hpp"

namespace fastgather::bench::mpi {

bool built();     // fg-bench was compiled against MPI
bool launched();  // this process was started by mpirun (Open MPI or PMI variables)
std::string library_version();
// MPI_Init, and a communicator per TP group (color = rank % tp).
Status init(int tp);
void finalize();
// MPI_Allgather of the same bytes on this rank's group communicator.
std::unique_ptr<Case> make_all_gather(const CaseShape& s, int group_rank_of_world0);
// MPI_Alltoall of the same bytes (equal parts); MPI_Sendrecv of the same
// ring shift as make_send_recv's.
std::unique_ptr<Case> make_all_to_all(const CaseShape& s);
std::unique_ptr<Case> make_send_recv(const CaseShape& s);
// MPI_Allreduce and MPI_Reduce_scatter_block (MPI_SUM) of the same elements,
// for the dtypes MPI has (fp32, fp64; it has no fp16 or bf16): null otherwise.
std::unique_ptr<Case> make_all_reduce(const CaseShape& s);
std::unique_ptr<Case> make_reduce_scatter(const CaseShape& s);

}  // namespace fastgather::bench::mpi
