#include "fastgather/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bootstrap/tcp_store.hpp"
#include "core/group_impl.hpp"
#include "transport/shm_channel.hpp"
#include "transport/shm_segment.hpp"

namespace fastgather {

using bootstrap::Clock;

namespace {

// Per member. Big enough that a line is reused only after it has left the
// peers' L2 caches (see shm_channel.hpp); steps are a quarter of it.
constexpr size_t kDefaultRingBytes = 4 << 20;

size_t ring_bytes_from_env() {
  const char* v = std::getenv("FG_RING_BYTES");
  if (v == nullptr || *v == '\0') return kDefaultRingBytes;
  size_t b = std::strtoull(v, nullptr, 10);
  b = std::clamp<size_t>(b, 16384, size_t{1} << 31);
  return (b + 4095) / 4096 * 4096;
}

std::string random_job_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

}  // namespace

Status Config::validate() const {
  if (world_size < 1) return {ErrorKind::kInvalidArgument, fmt::format("world size {} must be at least 1", world_size)};
  if (rank < 0 || rank >= world_size) {
    return {ErrorKind::kInvalidArgument, fmt::format("rank {} is outside world size {}", rank, world_size)};
  }
  if (servers < 1 || world_size % servers != 0) {
    return {ErrorKind::kInvalidArgument,
            fmt::format("world size {} does not divide among {} servers", world_size, servers)};
  }
  if (server_index < 0 || server_index >= servers) {
    return {ErrorKind::kInvalidArgument, fmt::format("server index {} is outside 0..{}", server_index, servers - 1)};
  }
  if (server_of(rank) != server_index) {
    return {ErrorKind::kInvalidArgument,
            fmt::format("rank {} belongs to server {} ({} ranks per server), not server {}", rank,
                        server_of(rank), ranks_per_server(), server_index)};
  }
  if (master_port < 0 || master_port > 65535) {
    return {ErrorKind::kInvalidArgument, fmt::format("port {} is not a TCP port", master_port)};
  }
  return Status::Ok();
}

// ------------------------------------------------------------------ Group

Group::Group(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Group::~Group() = default;
int Group::rank() const { return impl_->me; }
int Group::size() const { return static_cast<int>(impl_->ranks.size()); }
const std::vector<int>& Group::ranks() const { return impl_->ranks; }
std::string Group::describe() const { return impl_->label; }

// ------------------------------------------------------------ Communicator

struct Communicator::Impl {
  Config config;
  std::unique_ptr<bootstrap::TcpStoreServer> server;  // world rank 0 only
  std::unique_ptr<bootstrap::TcpStoreClient> store;
  std::string job_id;
  std::vector<std::unique_ptr<Group>> groups;  // groups[0]: world
  std::map<std::vector<int>, int> created;     // how often each member list was built
  int serial = 0;

  Clock::time_point deadline() const {
    auto t = config.timeout.count() > 0 ? config.timeout : std::chrono::milliseconds(24LL * 3600 * 1000);
    return Clock::now() + t;
  }
  Result<Group*> build_group(std::vector<int> ranks);
};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() {
  impl_->groups.clear();
  impl_->store.reset();  // says BYE
  if (impl_->server) impl_->server->drain(impl_->deadline());
}

int Communicator::rank() const { return impl_->config.rank; }
int Communicator::size() const { return impl_->config.world_size; }
const Config& Communicator::config() const { return impl_->config; }
Group& Communicator::world() { return *impl_->groups.front(); }

Result<std::unique_ptr<Communicator>> Communicator::create(const Config& config) {
  if (Status s = config.validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  transport::ShmSegment::sweep_stale();  // segments of crashed jobs on this host

  const auto deadline = impl->deadline();
  if (config.rank == 0) {
    auto server = bootstrap::TcpStoreServer::start(config.master_addr, config.master_port, config.token);
    if (!server.ok()) return server.status();
    impl->server = std::move(server).value();
  }
  auto client = bootstrap::TcpStoreClient::connect(config.master_addr, config.master_port, config.token, deadline,
                                                   fmt::format("{}/{}", config.rank, config.world_size));
  if (!client.ok()) {
    return Status{client.status().kind(), fmt::format("rank {}: {}", config.rank, client.status().message())};
  }
  impl->store = std::move(client).value();

  if (config.rank == 0) {
    const char* env_job = std::getenv("FG_JOB_ID");
    impl->job_id = (env_job != nullptr && *env_job != '\0') ? env_job : random_job_id();
    if (Status s = impl->store->set("job_id", impl->job_id); !s.ok()) return s;
  } else {
    auto job = impl->store->get("job_id", deadline);
    if (!job.ok()) return Status{job.status().kind(), fmt::format("rank {}: {}", config.rank, job.status().message())};
    impl->job_id = job.value();
  }

  std::vector<int> all(static_cast<size_t>(config.world_size));
  for (int r = 0; r < config.world_size; ++r) all[r] = r;
  auto world = impl->build_group(all);
  if (!world.ok()) return world.status();
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

Result<Group*> Communicator::new_group(std::vector<int> ranks) { return impl_->build_group(std::move(ranks)); }

Result<Group*> Communicator::tp_group_of_dp(int tp, int dp) {
  if (tp < 1 || dp < 1 || tp * dp != size()) {
    return Status{ErrorKind::kInvalidArgument,
                  fmt::format("TP={} x DP={} = {} does not match world size {}", tp, dp, tp * dp, size())};
  }
  std::vector<int> ranks;
  for (int r = rank() % tp; r < size(); r += tp) ranks.push_back(r);
  return new_group(std::move(ranks));
}

Result<Group*> Communicator::Impl::build_group(std::vector<int> ranks) {
  const int me_world = config.rank;
  const std::string label = fmt::format("group [{}]", fmt::join(ranks, ","));
  auto invalid = [&](const std::string& why) {
    return Status{ErrorKind::kInvalidArgument, fmt::format("rank {}: cannot create {}: {}", me_world, label, why)};
  };
  if (ranks.empty()) return invalid("no ranks");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= config.world_size) {
      return invalid(fmt::format("rank {} is outside world size {}", ranks[i], config.world_size));
    }
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      return invalid(std::count(ranks.begin(), ranks.end(), ranks[i]) > 1
                         ? fmt::format("rank {} is listed twice", ranks[i])
                         : std::string("ranks must be in ascending order"));
    }
  }
  auto pos = std::find(ranks.begin(), ranks.end(), me_world);
  if (pos == ranks.end()) return invalid(fmt::format("rank {} is not a member", me_world));
  for (int r : ranks) {
    if (config.server_of(r) != config.server_index) {
      return Status{ErrorKind::kUnsupported,
                    fmt::format("rank {}: {} spans servers (rank {} is on server {}); groups across servers need "
                                "the inter-node transport, which this build does not have yet",
                                me_world, label, r, config.server_of(r))};
    }
  }

  const int n = static_cast<int>(ranks.size());
  const int me = static_cast<int>(pos - ranks.begin());
  const std::string key = fmt::format("g/{}/{}", fmt::join(ranks, ","), created[ranks]++);
  const size_t ring = ring_bytes_from_env();
  const size_t bytes = transport::ShmChannel::segment_bytes(n, ring);
  const auto dl = deadline();
  auto where = [&](const Status& s) {
    return Status{s.kind(), fmt::format("rank {}: creating {}: {}", me_world, label, s.message())};
  };

  Result<transport::ShmSegment> seg = Status{ErrorKind::kSystem, "unset"};
  if (me == 0) {
    std::string name = transport::ShmSegment::segment_name(job_id, ::getpid(), serial++);
    seg = transport::ShmSegment::create(name, bytes);
    if (!seg.ok()) return where(seg.status());
    transport::ShmChannel::format(seg.value().data(), n, ring);
    if (Status s = store->set(key + "/name", name); !s.ok()) return where(s);
  } else {
    auto name = store->get(key + "/name", dl);
    if (!name.ok()) {
      return where({name.status().kind(), fmt::format("rank {} never created the group's segment ({})", ranks[0],
                                                      name.status().message())});
    }
    seg = transport::ShmSegment::open(name.value(), bytes);
    if (!seg.ok()) return where(seg.status());
  }

  auto impl = std::make_unique<Group::Impl>();
  impl->ranks = ranks;
  impl->me = me;
  impl->label = label;
  impl->channel = std::make_unique<transport::ShmChannel>(
      std::move(seg).value(), ranks, me, ring, transport::WaitPolicy::for_members(n, config.timeout), label);
  if (Status s = impl->channel->check_format(); !s.ok()) return where(s);
  impl->channel->publish_pid();
  if (Status s = store->barrier(key + "/attached", n, dl); !s.ok()) return where(s);
  // Every member has mapped the segment: its name is no longer needed, and a
  // crash from here on leaves nothing in /dev/shm.
  impl->channel->unlink_name();
  if (Status s = impl->channel->watch_members(); !s.ok()) return where(s);

  groups.push_back(std::make_unique<Group>(std::move(impl)));
  return groups.back().get();
}

}  // namespace fastgather
