#include "mpi_comparator.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "pattern.hpp"
#include "sums.hpp"

#if FG_HAVE_MPI
#include <mpi.h>
#endif

namespace fastgather::bench::mpi {

bool launched() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr; }

#if FG_HAVE_MPI

namespace {
MPI_Comm g_group = MPI_COMM_NULL;
int g_world_rank = 0;

// A case on this rank's group communicator, which knows its members' world ranks.
class MpiCase : public Case {
 protected:
  MpiCase(const char* name, const CaseShape& s) {
    op = name;
    impl = "mpi";
    m = s.m;
    dtype = s.dtype;
    MPI_Comm_size(g_group, &size_);
    MPI_Comm_rank(g_group, &rank_);
    members_.resize(static_cast<size_t>(size_));
    MPI_Allgather(&g_world_rank, 1, MPI_INT, members_.data(), 1, MPI_INT, g_group);
  }
  // One input and one output of these shapes per variant; the derived
  // constructor then fills the inputs (prepare() is theirs).
  void allocate(const CaseShape& s, const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
    for (int v = 0; v < std::max(s.variants, 1); ++v) {
      ins_.push_back(Tensor::empty(s.dtype, in));
      outs_.push_back(Tensor::empty(s.dtype, out));
    }
    bytes_per_rank = ins_.front().nbytes();
  }
  int size_ = 0, rank_ = 0;
  std::vector<int> members_;
  std::vector<Tensor> ins_, outs_;
};

class MpiAllGatherCase : public MpiCase {
 public:
  explicit MpiAllGatherCase(const CaseShape& s) : MpiCase("all_gather", s) {
    allocate(s, {s.m, s.hidden}, {s.m * size_, s.hidden});
    for (size_t v = 0; v < ins_.size(); ++v) prepare(v);
  }
  Status run(uint64_t it) override {
    const size_t v = it % ins_.size();
    const int count = static_cast<int>(bytes_per_rank);  // sizes here stay below 2 GiB
    int rc = MPI_Allgather(ins_[v].data(), count, MPI_BYTE, outs_[v].data(), count, MPI_BYTE, g_group);
    if (rc != MPI_SUCCESS) return {ErrorKind::kSystem, fmt::format("MPI_Allgather returned {}", rc)};
    return Status::Ok();
  }
  void prepare(uint64_t it) override {
    pattern::fill(ins_[it % ins_.size()].data(), bytes_per_rank, g_world_rank, it);
  }
  std::string verify(uint64_t it) override {
    const Tensor& out = outs_[it % outs_.size()];
    for (int i = 0; i < size_; ++i) {
      long long bad = pattern::find_mismatch(out.data_as<char>() + static_cast<size_t>(i) * bytes_per_rank,
                                             bytes_per_rank, members_[i], it);
      if (bad >= 0) return fmt::format("all_gather/mpi: block of rank {} wrong at byte {}", members_[i], bad);
    }
    return {};
  }
};
class MpiAllToAllCase : public MpiCase {
 public:
  explicit MpiAllToAllCase(const CaseShape& s) : MpiCase("all_to_all", s) {
    allocate(s, {s.m, s.hidden}, {s.m, s.hidden});
    for (size_t v = 0; v < ins_.size(); ++v) prepare(v);
  }
  Status run(uint64_t it) override {
    const size_t v = it % ins_.size();
    const int count = static_cast<int>(part());  // sizes here stay below 2 GiB
    int rc = MPI_Alltoall(ins_[v].data(), count, MPI_BYTE, outs_[v].data(), count, MPI_BYTE, g_group);
    if (rc != MPI_SUCCESS) return {ErrorKind::kSystem, fmt::format("MPI_Alltoall returned {}", rc)};
    return Status::Ok();
  }
  void prepare(uint64_t it) override {
    pattern::fill_parts(ins_[it % ins_.size()].data(), part(), size_, g_world_rank, members_.data(), it);
  }
  std::string verify(uint64_t it) override {
    return check_all_to_all(outs_[it % outs_.size()].data(), part(), members_, g_world_rank, it, "all_to_all/mpi");
  }

 private:
  size_t part() const { return bytes_per_rank / static_cast<size_t>(size_); }
};

class MpiSendRecvCase : public MpiCase {
 public:
  explicit MpiSendRecvCase(const CaseShape& s) : MpiCase("send_recv", s) {
    allocate(s, {s.m, s.hidden}, {s.m, s.hidden});
    for (size_t v = 0; v < ins_.size(); ++v) prepare(v);
  }
  Status run(uint64_t it) override {
    const size_t v = it % ins_.size();
    const int count = static_cast<int>(bytes_per_rank);  // sizes here stay below 2 GiB
    int rc = MPI_Sendrecv(ins_[v].data(), count, MPI_BYTE, (rank_ + 1) % size_, 0, outs_[v].data(), count, MPI_BYTE,
                          (rank_ + size_ - 1) % size_, 0, g_group, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return {ErrorKind::kSystem, fmt::format("MPI_Sendrecv returned {}", rc)};
    return Status::Ok();
  }
  void prepare(uint64_t it) override { pattern::fill(ins_[it % ins_.size()].data(), bytes_per_rank, g_world_rank, it); }
  std::string verify(uint64_t it) override {
    const int from = members_[static_cast<size_t>((rank_ + size_ - 1) % size_)];
    const long long bad = pattern::find_mismatch(outs_[it % outs_.size()].data(), bytes_per_rank, from, it);
    return bad < 0 ? std::string() : fmt::format("send_recv/mpi: rank {}'s message wrong at byte {}", from, bad);
  }
};

class MpiReduceCase : public MpiCase {
 public:
  MpiReduceCase(const CaseShape& s, MPI_Datatype type, bool scatter)
      : MpiCase(scatter ? "reduce_scatter" : "all_reduce", s), type_(type), scatter_(scatter) {
    count_ = static_cast<size_t>(s.m * s.hidden);
    out_count_ = scatter ? count_ / static_cast<size_t>(size_) : count_;
    allocate(s, {static_cast<int64_t>(count_)}, {static_cast<int64_t>(out_count_)});
    for (size_t v = 0; v < ins_.size(); ++v) prepare(v);
  }
  Status run(uint64_t it) override {
    const size_t v = it % ins_.size();
    const int count = static_cast<int>(out_count_);  // sizes here stay below 2^31 elements
    const int rc = scatter_ ? MPI_Reduce_scatter_block(ins_[v].data(), outs_[v].data(), count, type_, MPI_SUM, g_group)
                            : MPI_Allreduce(ins_[v].data(), outs_[v].data(), count, type_, MPI_SUM, g_group);
    if (rc != MPI_SUCCESS) return {ErrorKind::kSystem, fmt::format("MPI {} returned {}", op, rc)};
    return Status::Ok();
  }
  void prepare(uint64_t it) override { fill_exact(dtype, ins_[it % ins_.size()].data(), count_, g_world_rank, it); }
  void rewrite(uint64_t it) override { rewrite_lines(ins_[it % ins_.size()].data(), ins_[it % ins_.size()].nbytes()); }
  std::string verify(uint64_t it) override {
    const size_t first = scatter_ ? static_cast<size_t>(rank_) * out_count_ : 0;
    return check_exact_sums(dtype, outs_[it % outs_.size()].data(), first, out_count_, members_, it, op + "/" + impl);
  }

 private:
  MPI_Datatype type_;
  bool scatter_;
  size_t count_ = 0, out_count_ = 0;
};

std::unique_ptr<Case> make_reduce(const CaseShape& s, bool scatter) {
  if (s.dtype == DType::kF32) return std::make_unique<MpiReduceCase>(s, MPI_FLOAT, scatter);
  if (s.dtype == DType::kF64) return std::make_unique<MpiReduceCase>(s, MPI_DOUBLE, scatter);
  return nullptr;
}

}  // namespace

bool built() { return true; }

std::string library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<size_t>(len));
  if (auto nl = s.find_first_of(",\n"); nl != std::string::npos) s.resize(nl);
  return s;
}

Status init(int tp) {
  int ok = 0;
  MPI_Initialized(&ok);
  if (!ok && MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return {ErrorKind::kSystem, "MPI_Init failed"};
  MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
  MPI_Comm_split(MPI_COMM_WORLD, g_world_rank % tp, g_world_rank, &g_group);
  return Status::Ok();
}

void finalize() {
  if (g_group != MPI_COMM_NULL) MPI_Comm_free(&g_group);
  MPI_Finalize();
}

std::unique_ptr<Case> make_all_gather(const CaseShape& s, int) { return std::make_unique<MpiAllGatherCase>(s); }
std::unique_ptr<Case> make_all_to_all(const CaseShape& s) { return std::make_unique<MpiAllToAllCase>(s); }
std::unique_ptr<Case> make_send_recv(const CaseShape& s) { return std::make_unique<MpiSendRecvCase>(s); }
std::unique_ptr<Case> make_all_reduce(const CaseShape& s) { return make_reduce(s, false); }
std::unique_ptr<Case> make_reduce_scatter(const CaseShape& s) { return make_reduce(s, true); }

#else

bool built() { return false; }
std::string library_version() { return "none"; }
Status init(int) { return {ErrorKind::kUnsupported, "fg-bench was built without MPI (apt-get install libopenmpi-dev)"}; }
void finalize() {}
std::unique_ptr<Case> make_all_gather(const CaseShape&, int) { return nullptr; }
std::unique_ptr<Case> make_all_to_all(const CaseShape&) { return nullptr; }
std::unique_ptr<Case> make_send_recv(const CaseShape&) { return nullptr; }
std::unique_ptr<Case> make_all_reduce(const CaseShape&) { return nullptr; }
std::unique_ptr<Case> make_reduce_scatter(const CaseShape&) { return nullptr; }

#endif

}  // namespace fastgather::bench::mpi
