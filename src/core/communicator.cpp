#include "fastgather/communicator.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/env.hpp"
#include "bootstrap/store_values.hpp"
#include "bootstrap/tcp_store.hpp"
#include "core/group_impl.hpp"
#include "core/tensor_access.hpp"
#include "engine/driver.hpp"
#include "engine/waits.hpp"
#include "transport/net_channel.hpp"
#include "transport/shm_channel.hpp"
#include "transport/shm_segment.hpp"

namespace fastgather {

using bootstrap::Clock;

namespace {

// Settings::ring_bytes in whole pages.
size_t ring_bytes_of(const Settings& s) { return (s.ring_bytes + 4095) / 4096 * 4096; }

// A segment larger than what /dev/shm has free would be killed by SIGBUS
// while it is faulted in, not refused: refuse it here, by name.
Status check_shm_room(size_t bytes, int members, size_t ring) {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return Status::Ok();  // nothing to go by
  const unsigned long long avail = static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize;
  if (bytes <= avail) return Status::Ok();
  return {ErrorKind::kResourceExhausted,
          fmt::format("a group of {} members on this server needs a {} MiB shared-memory segment ({} x FG_RING_BYTES={}) "
                      "but /dev/shm has {} MiB free; use fewer ranks per server or a smaller FG_RING_BYTES",
                      members, bytes >> 20, members, ring, avail >> 20)};
}

// Once per process: the fallback is no error, but who measures should know.
void say_single_copy_refused(const std::string& why) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  std::fprintf(stderr, "fastgather: single copy is not possible here (%s); large messages go through the "
               "shared-memory ring\n", why.empty() ? "another member of the group cannot read its peers' memory" : why.c_str());
}

std::string random_job_id() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

}  // namespace

// ------------------------------------------------------------------ Group

Group::Group(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Group::~Group() = default;
int Group::rank() const { return impl_->me; }
int Group::size() const { return static_cast<int>(impl_->ranks.size()); }
const std::vector<int>& Group::ranks() const { return impl_->ranks; }
std::string Group::describe() const { return impl_->label; }
bool Group::has_symmetric_heap() const { return impl_->heap != nullptr; }

Result<Tensor> Group::empty(DType dtype, std::vector<int64_t> shape) {
  auto bytes = TensorAccess::bytes_of(dtype, shape);
  if (!bytes.ok()) return Status{bytes.status().kind(), fmt::format("{}: empty: {}", impl_->label, bytes.status().message())};
  if (impl_->heap == nullptr) {
    try {
      return Tensor::empty(dtype, std::move(shape));
    } catch (const std::bad_alloc&) {
      return Status{ErrorKind::kResourceExhausted, fmt::format("{}: empty: out of memory for {} bytes", impl_->label, bytes.value())};
    }
  }
  auto block = impl_->heap->allocate(bytes.value());
  if (!block.ok()) return Status{block.status().kind(), fmt::format("{}: empty: {}", impl_->label, block.status().message())};
  return TensorAccess::adopt(block.value(), dtype, std::move(shape), impl_->heap_owner);
}

namespace {

// Gives blocks back to the heap it keeps alive.
class HeapOwner final : public Tensor::Owner {
 public:
  explicit HeapOwner(std::shared_ptr<transport::ShmHeap> heap) : heap_(std::move(heap)) {}
  void release(void* block) noexcept override { heap_->release(static_cast<std::byte*>(block)); }

 private:
  std::shared_ptr<transport::ShmHeap> heap_;
};

// Settings::symmetric_bytes in whole heap blocks.
size_t symmetric_bytes_of(const Settings& s) {
  return s.symmetric_bytes / transport::ShmHeap::kBlockAlign * transport::ShmHeap::kBlockAlign;
}

}  // namespace

// ------------------------------------------------------------ Communicator

struct Communicator::Impl {
  Config config;
  Settings settings;  // config.settings, or the environment's
  std::unique_ptr<bootstrap::TcpStoreServer> server;  // world rank 0 only
  std::shared_ptr<Store> store;  // ours (TcpStoreClient) or the caller's
  std::string job_id;
  std::unique_ptr<transport::UcxContext> ucx;  // several servers only; outlives the groups
  // The store client is not thread-safe; groups that fail in different
  // threads publish and read failure reasons through it.
  std::mutex store_mu;
  bool loopback = false;                       // all servers on this one host (simulated)
  std::vector<std::unique_ptr<Group>> groups;  // groups[0]: world
  // Guards `groups` against the other groups' wait loops (progress_others),
  // which may run on other threads. Never taken while holding store_mu.
  std::mutex groups_mu;
  // One non-blocking round for every group's queue that nobody else is
  // driving; true when any has work pending.
  bool progress_others();
  // abort() sets the flag and reaches every group's shared memory through
  // this table, which it can read from any thread or a signal handler
  // (build_group fills a slot, destroy_group empties it).
  std::atomic<int> aborted{0};
  static constexpr size_t kMaxGroups = 4096;
  std::array<std::atomic<transport::ShmChannel*>, kMaxGroups> channels{};
  bool finalized = false;
  Status finalize();
  // Drives the requests handed over to it and runs their completion
  // callbacks (Request::on_complete); stopped by finalize(), after the
  // queues are drained.
  // Shared with the requests, which may outlive the communicator (a torch
  // Work dropped after destroy_process_group asks for its callback then).
  std::shared_ptr<engine::Progress> progress = std::make_shared<engine::Progress>();
  std::map<std::vector<int>, int> created;     // how often each member list was built
  int serial = 0;

  Clock::time_point deadline() const {
    auto t = config.timeout.count() > 0 ? config.timeout : std::chrono::milliseconds(24LL * 3600 * 1000);
    return Clock::now() + t;
  }
  Result<Group*> build_group(std::vector<int> ranks);
  // one_host_possible: servers were given (SERVER_INDEX), so two of them may
  // be this very host (simulated); found from host identities, they are not.
  Status start_network(Clock::time_point deadline, bool one_host_possible);
  // Communicator::create after connecting to the store.
  Status finish_create();
  Status find_servers(Clock::time_point deadline);
  void close_network();
};

// Flushing closes of every group's endpoints, then a fence that keeps the
// worker progressing until every rank has closed: a rank that left early
// would otherwise strand a peer's last flush. After a failure nothing is
// waited for: the group's endpoints were force-closed already.
void Communicator::Impl::close_network() {
  bool healthy = aborted.load(std::memory_order_acquire) == 0;
  for (auto& g : groups) {
    if (auto* net = impl_of(*g)->net.get()) {
      healthy &= net->broken().ok();
      net->begin_close();
    }
  }
  const auto until = deadline();
  auto all_closed = [&] {
    for (auto& g : groups) {
      if (auto* net = impl_of(*g)->net.get(); net != nullptr && !net->closed()) return false;
    }
    return true;
  };
  auto progress_all = [&] {
    for (auto& g : groups) {
      if (auto* net = impl_of(*g)->net.get()) net->progress();
    }
  };
  while (!all_closed() && Clock::now() < until) progress_all();
  // Counted even when failed, so that healthy ranks do not wait for us.
  if (!store->add("ucx/closed", 1).ok() || !healthy) return;
  while (Clock::now() < until) {
    auto done = store->add("ucx/closed", 0);
    if (!done.ok() || done.value() >= config.world_size) return;
    for (int i = 0; i < 50; ++i) {
      progress_all();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

namespace {

// What tells two hosts apart, for UCX: the host name, the kernel's boot id
// and the network namespace. Containers, network namespaces and VMs cloned
// from one image share a host name and may share a boot id; only ranks in
// the same kernel *and* the same network namespace reach each other over
// loopback. (Whether two ranks share memory is not decided here: ranks of
// different servers never do; see architecture.md.)
std::string host_identity() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string id = name;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char boot[64] = {};
    if (std::fgets(boot, sizeof(boot), f) != nullptr) {
      std::string b = boot;
      while (!b.empty() && (b.back() == '\n' || b.back() == ' ')) b.pop_back();
      id += "/" + b;
    }
    std::fclose(f);
  }
  struct stat ns {};
  if (::stat("/proc/self/ns/net", &ns) == 0) id += fmt::format("/netns:{}:{}", ns.st_dev, ns.st_ino);
  // Another /dev/shm (a container's own tmpfs) cannot share segments with ours.
  struct stat shm {};
  if (::stat("/dev/shm", &shm) == 0) id += fmt::format("/shm:{}:{}", shm.st_dev, shm.st_ino);
  return id;
}

}  // namespace

// Several servers: a UCX context per rank (a worker per group). When
// another server turns out to be this very host (servers simulated on one
// machine), UCX is kept to TCP on loopback so that nothing between servers
// goes through shared memory.
Status Communicator::Impl::start_network(Clock::time_point dl, bool one_host_possible) {
  const std::string host = one_host_possible ? host_identity() : std::string();
  if (one_host_possible) {
    if (Status s = store->set(fmt::format("host/{}", config.rank), host); !s.ok()) return s;
  }
  for (int srv = 0; one_host_possible && srv < config.servers; ++srv) {
    if (srv == config.server_index) continue;
    auto other = store->get(fmt::format("host/{}", config.first_rank_on(srv)), dl);
    if (!other.ok()) return other.status();
    if (other.value() == host) loopback = true;
  }
  auto context = transport::UcxContext::create({.loopback = loopback});
  if (!context.ok()) return context.status();
  ucx = std::move(context).value();
  return Status::Ok();
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() { (void)impl_->finalize(); }

Status Communicator::finalize() { return impl_->finalize(); }

void Communicator::abort() noexcept {
  impl_->aborted.store(1, std::memory_order_release);
  for (auto& slot : impl_->channels) {
    if (transport::ShmChannel* ch = slot.load(std::memory_order_acquire)) ch->abort_now();
  }
}

// Orderly: what was started completes (or fails on its deadline), UCX
// endpoints are flushed, and the store host waits for everyone's goodbye.
//
// A rank leaving with a broken group (a timeout, a lost peer, an abort) ends
// the job: it says why in the store, so that nobody waits on it there, and
// rank 0 holds its exit for the others' goodbyes at most 500 ms (they may
// be the very ranks that never came). Healthy, rank 0 waits for them as before.
Status Communicator::Impl::finalize() {
  if (finalized) return Status::Ok();
  finalized = true;
  for (auto& g : groups) {
    for (engine::Queue* q : impl_of(*g)->queues()) {
      engine::Queue::Hold hold(*q);
      q->drain();
    }
  }
  progress->shutdown();  // the callbacks of what was drained run now
  Status broken;
  if (aborted.load(std::memory_order_acquire) != 0) {
    broken = {ErrorKind::kAborted, fmt::format("rank {} aborted its communicator", config.rank), config.rank};
  }
  for (auto& g : groups) {
    const Group::Impl& gi = *impl_of(*g);
    if (broken.ok() && !gi.channel->broken().ok()) broken = gi.channel->broken();
    if (broken.ok() && gi.net && !gi.net->broken().ok()) broken = gi.net->broken();
  }
  if (ucx) close_network();
  if (!broken.ok() && store) (void)store->set(bootstrap::kJobAbortKey, bootstrap::job_abort_value(broken, config.rank));
  for (auto& slot : channels) slot.store(nullptr, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(groups_mu);
    groups.clear();
  }
  store.reset();  // says BYE
  // The store host stays up while the others still read from it (failure
  // reasons, the abort); after a failure only briefly, since the rank that
  // broke the group may never say goodbye.
  if (server) server->drain(broken.ok() ? deadline() : Clock::now() + std::chrono::milliseconds(500));
  server.reset();
  return broken;
}

int Communicator::rank() const { return impl_->config.rank; }
int Communicator::size() const { return impl_->config.world_size; }
const Config& Communicator::config() const { return impl_->config; }
const Settings& Communicator::settings() const { return impl_->settings; }
Group& Communicator::world() { return *impl_->groups.front(); }

bool Communicator::simulated_servers() const { return impl_->loopback; }

std::string Communicator::transport() const {
  if (!impl_->ucx) return "shared memory";
  return fmt::format("shared memory within a server; between servers {}", impl_->ucx->describe());
}

Result<std::unique_ptr<Communicator>> Communicator::create(const Config& config) { return create(config, nullptr); }

Result<std::unique_ptr<Communicator>> Communicator::create(const Config& config, std::shared_ptr<Store> store) {
  // With the caller's store there is no address to check, and servers may
  // be 0: found from the ranks' host identities.
  Config checked = config;
  if (store) {
    checked.master_port = 1;
    if (checked.servers == 0) checked.servers = 1, checked.server_index = 0;
  }
  if (Status s = checked.validate(); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  transport::ShmSegment::sweep_stale();  // segments of crashed jobs on this host

  const auto deadline = impl->deadline();
  if (Status s = base::check_environment(); !s.ok()) {
    return Status{s.kind(), fmt::format("rank {}: {}", config.rank, s.message())};
  }
  if (config.settings) {
    if (Status s = config.settings->validate(); !s.ok()) {
      return Status{s.kind(), fmt::format("rank {}: {}", config.rank, s.message())};
    }
    impl->settings = *config.settings;
  } else {
    auto from_env = Settings::from_environment();
    if (!from_env.ok()) return Status{from_env.status().kind(), fmt::format("rank {}: {}", config.rank, from_env.status().message())};
    impl->settings = from_env.value();
  }
  // The machine-derived defaults, resolved once: calls read them as numbers.
  impl->settings.pipeline_bytes = impl->settings.effective_pipeline_bytes();
  impl->settings.stream_out_bytes = impl->settings.effective_stream_out_bytes();
  if (config.rank == 0 && base::env_flag("FG_LOG_SETTINGS")) {
    std::fprintf(stderr, "fastgather: settings: %s\n", impl->settings.describe().c_str());
  }
  if (store) {
    impl->store = std::move(store);
  } else {
    if (config.rank == 0) {
      if (config.token.empty() && config.servers != 1) {
        // Nothing else tells ranks of this job from anyone who reaches the
        // port before they all have joined (see docs/reliability.md).
        std::fprintf(stderr,
                     "fastgather: warning: FG_TOKEN is not set: until all %d ranks have joined, anyone who reaches "
                     "%s:%d can join this job or stop it; set FG_TOKEN to the same secret on every server\n",
                     config.world_size, config.master_addr.c_str(), config.master_port);
      }
      bootstrap::StoreAdmission admission;
      admission.token = config.token;
      auto server = bootstrap::TcpStoreServer::start(config.master_addr, config.master_port, std::move(admission),
                                                     config.store_listen_fd);
      if (!server.ok()) return server.status();
      impl->server = std::move(server).value();
    }
    auto client = bootstrap::TcpStoreClient::connect(config.master_addr, config.master_port, config.token, deadline,
                                                     fmt::format("{}/{}", config.rank, config.world_size));
    if (!client.ok()) {
      return Status{client.status().kind(), fmt::format("rank {}: {}", config.rank, client.status().message())};
    }
    impl->store = std::move(client).value();
  }
  // From here on a failure of this rank ends the job's start-up for all:
  // the others learn why at once (not at their timeout), and rank 0 keeps
  // the store up until they have read it.
  if (Status s = impl->finish_create(); !s.ok()) {
    (void)impl->store->set(bootstrap::kJobAbortKey, bootstrap::job_abort_value(s, config.rank));
    impl->groups.clear();
    impl->store.reset();
    if (impl->server) impl->server->drain(deadline, config.world_size);
    return s;
  }
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

// servers == 0: which ranks share this host (and so memory) is found from
// every rank's host identity. Hosts must hold consecutive blocks of ranks,
// the first ones one rank more when the world does not divide evenly (the
// layout every launcher here produces); anything else is refused by name.
Status Communicator::Impl::find_servers(Clock::time_point dl) {
  const std::string mine = host_identity();
  if (Status s = store->set(fmt::format("host/{}", config.rank), mine); !s.ok()) return s;
  std::vector<std::string> hosts;
  std::vector<int> first;  // first rank of each distinct host, in rank order
  for (int r = 0; r < config.world_size; ++r) {
    auto h = store->get(fmt::format("host/{}", r), dl);
    if (!h.ok()) return h.status();
    if (hosts.empty() || hosts.back() != h.value()) {
      if (std::find(hosts.begin(), hosts.end(), h.value()) != hosts.end()) {
        return {ErrorKind::kUnsupported,
                fmt::format("rank {} shares a host with ranks before it but not with rank {}: fastgather needs each "
                            "host's ranks to be consecutive", r, r - 1)};
      }
      hosts.push_back(h.value());
      first.push_back(r);
    }
  }
  const int servers = static_cast<int>(hosts.size());
  for (int srv = 0; srv < servers; ++srv) {
    if (first[srv] != Config::first_rank_on_server(config.world_size, servers, srv)) {
      return {ErrorKind::kUnsupported,
              fmt::format("{} ranks on {} hosts are not in even consecutive blocks (host {} starts at rank {}, expected "
                          "{}); fastgather needs that layout",
                          config.world_size, servers, srv, first[srv],
                          Config::first_rank_on_server(config.world_size, servers, srv))};
    }
  }
  config.servers = servers;
  config.server_index = config.server_of(config.rank);
  return Status::Ok();
}

Status Communicator::Impl::finish_create() {
  const auto deadline = this->deadline();

  if (config.rank == 0) {
    job_id = !config.job_id.empty() ? config.job_id : random_job_id();
    if (Status s = bootstrap::check_job_id("Config::job_id", job_id); !s.ok()) return s;
    if (Status s = store->set("job_id", job_id); !s.ok()) return s;
  } else {
    auto job = store->get("job_id", deadline);
    if (!job.ok()) return Status{job.status().kind(), fmt::format("rank {}: {}", config.rank, job.status().message())};
    // Segment names are made of it: a path or another job's id must not get in.
    if (Status s = bootstrap::check_job_id("store key 'job_id'", job.value()); !s.ok()) {
      return Status{s.kind(), fmt::format("rank {}: {}", config.rank, s.message())};
    }
    job_id = job.value();
  }

  // Servers told apart by host identity are different hosts by construction:
  // no need to publish and compare the identities again.
  const bool by_identity = config.servers == 0;
  if (by_identity) {
    if (Status s = find_servers(deadline); !s.ok()) {
      return Status{s.kind(), fmt::format("rank {}: finding which ranks share a host: {}", config.rank, s.message())};
    }
  }
  if (config.servers > 1) {
    if (Status s = start_network(deadline, /*one_host_possible=*/!by_identity); !s.ok()) {
      return Status{s.kind(), fmt::format("rank {}: starting the inter-server transport: {}", config.rank, s.message())};
    }
  }

  std::vector<int> all(static_cast<size_t>(config.world_size));
  for (int r = 0; r < config.world_size; ++r) all[r] = r;
  auto world = build_group(all);
  return world.status();
}

Status Communicator::destroy_group(Group* group) {
  auto& gs = impl_->groups;
  if (group == gs.front().get()) {
    return {ErrorKind::kInvalidArgument, fmt::format("rank {}: the world group cannot be destroyed", rank())};
  }
  auto it = std::find_if(gs.begin() + 1, gs.end(), [&](const auto& g) { return g.get() == group; });
  if (it == gs.end()) {
    return {ErrorKind::kInvalidArgument, fmt::format("rank {}: that group is not one of this communicator's", rank())};
  }
  for (engine::Queue* q : impl_of(**it)->queues()) {
    engine::Queue::Hold hold(*q);
    q->drain();  // what was started on it completes first
  }
  for (engine::Queue* q : impl_of(**it)->queues()) impl_->progress->forget(q);
  for (auto& slot : impl_->channels) {
    if (slot.load() == impl_of(**it)->channel.get()) slot.store(nullptr);
  }
  if (auto* net = impl_of(**it)->net.get()) {
    net->begin_close();
    const auto until = impl_->deadline();
    while (!net->closed() && Clock::now() < until) net->progress();
  }
  std::lock_guard<std::mutex> lock(impl_->groups_mu);
  gs.erase(it);
  return Status::Ok();
}

bool Communicator::Impl::progress_others() {
  std::unique_lock<std::mutex> lock(groups_mu, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  bool pending = false;
  // The caller's own group is held by the caller: try_progress skips it.
  for (auto& g : groups) {
    for (engine::Queue* q : impl_of(*g)->queues()) pending |= q->try_progress();
  }
  return pending;
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

namespace {

// Building one group, step by step (Communicator::Impl::build_group runs
// them in order; each returns the group's failure, in the words of the rank
// and group). Every key a member may be waiting on for this rank is in
// `awaited`: a rank that fails writes its reason under each instead
// (fail()), so that the others fail at once with it rather than at their
// timeout; a reason it read from another member is not said again.
class GroupBuilder {
 public:
  GroupBuilder(Communicator::Impl& c, std::vector<int> ranks, int me, std::string key, std::string label)
      : c_(c), ranks_(std::move(ranks)), me_(me), key_(std::move(key)), label_(std::move(label)), dl_(c.deadline()) {
    // The members on this server share memory; the others are reached over UCX.
    for (int r : ranks_) {
      server_of_member_.push_back(c_.config.server_of(r));
      if (server_of_member_.back() == c_.config.server_index) local_.push_back(r);
    }
    spans_ = local_.size() != ranks_.size();
    local_me_ = static_cast<int>(std::find(local_.begin(), local_.end(), c_.config.rank) - local_.begin());
    local_n_ = static_cast<int>(local_.size());
    local_key_ = spans_ ? fmt::format("{}/s{}", key_, c_.config.server_index) : key_;
    ring_ = ring_bytes_of(c_.settings);
    bytes_ = transport::ShmChannel::segment_bytes(local_n_, ring_);
    prefix_ = transport::ShmSegment::job_prefix(c_.job_id);
    awaited_ = {local_key_ + "/name", local_key_ + "/heap", local_key_ + "/attached/open"};
    if (spans_) {
      awaited_.push_back(key_ + "/id");
      awaited_.push_back(fmt::format("{}/ucx/{}", key_, c_.config.rank));
      awaited_.push_back(fmt::format("{}/ucx/{}/read", key_, c_.config.rank));
    }
  }

  // Nothing is made for a group across servers without UCX (and nobody told:
  // every member finds the same).
  Status check_layout() {
    if (spans_ && c_.ucx == nullptr) {
      return where({ErrorKind::kUnsupported, "it spans servers, and this communicator has no UCX worker"});
    }
    return Status::Ok();
  }

  // The first member here creates the ring's segment and the heap's and
  // names them in the store; the others open them.
  Status map_segments() {
    if (local_me_ == 0) {
      if (Status s = check_shm_room(bytes_, local_n_, ring_); !s.ok()) return fail(s);
      const std::string name = transport::ShmSegment::segment_name(c_.job_id, ::getpid(), c_.serial++);
      seg_ = transport::ShmSegment::create(name, bytes_);
      if (!seg_.ok()) return fail(seg_.status());
      transport::ShmChannel::format(seg_.value().data(), local_n_, ring_, c_.settings.effective_pipeline_bytes());
      // The heap's segment is named after the ring's; its region size travels
      // with the name, so that every member lays it out as the creator did.
      const size_t region = local_n_ > 1 ? symmetric_bytes_of(c_.settings) : 0;
      std::string heap_value = "-";
      if (region != 0) {
        auto hs = transport::ShmSegment::create(name + "h", transport::ShmHeap::segment_bytes(local_n_, region),
                                                transport::ShmSegment::Pages::kOnDemand);
        if (!hs.ok()) return fail(heap_failed(hs.status(), region));
        heap_ = std::make_shared<transport::ShmHeap>(std::move(hs).value(), local_me_, region);
        heap_value = fmt::format("{} {}", name + "h", region);
      }
      if (Status s = c_.store->set(local_key_ + "/heap", heap_value); !s.ok()) return fail(s);
      if (Status s = c_.store->set(local_key_ + "/name", name); !s.ok()) return fail(s);
      return Status::Ok();
    }
    auto name = read(local_key_ + "/name");
    if (!name.ok()) {
      if (heard_) return fail(name.status());
      return fail({name.status().kind(),
                   fmt::format("rank {} never created the group's segment ({} MiB: {} members x FG_RING_BYTES={}): {}",
                               local_[0], (bytes_ + (1 << 20) - 1) >> 20, local_n_, ring_, name.status().message())});
    }
    if (Status s = bootstrap::check_segment_name(local_key_ + "/name", name.value(), prefix_); !s.ok()) return fail(s);
    seg_ = transport::ShmSegment::open(name.value(), bytes_);
    if (!seg_.ok()) return fail(earlier_failure_or(seg_.status()));
    auto heap_value = read(local_key_ + "/heap");  // set before the name
    if (!heap_value.ok()) return fail(heap_value.status());
    auto parsed = bootstrap::parse_heap_value(local_key_ + "/heap", heap_value.value(), prefix_,
                                              base::find_env("FG_SYMMETRIC_BYTES")->max);
    if (!parsed.ok()) return fail(parsed.status());
    if (const auto& h = parsed.value()) {
      auto hs = transport::ShmSegment::open(h->name, transport::ShmHeap::segment_bytes(local_n_, h->region),
                                            transport::ShmSegment::Pages::kOnDemand);
      if (!hs.ok()) return fail(earlier_failure_or(heap_failed(hs.status(), h->region)));
      heap_ = std::make_shared<transport::ShmHeap>(std::move(hs).value(), local_me_, h->region);
    }
    return Status::Ok();
  }

  // The group's insides: its channel over the segment, its heap, how it waits.
  Status make_channel() {
    impl = std::make_unique<Group::Impl>();
    impl->ranks = ranks_;
    impl->me = me_;
    impl->label = label_;
    impl->settings = c_.settings;
    impl->copy_in = algo::CopyInChooser(c_.settings.copy_in);
    impl->copy_in_fused = algo::CopyInChooser(c_.settings.copy_in);
    // Waiting policy by how many processes compete for this host's cores.
    const int on_host = c_.loopback ? c_.config.world_size : c_.config.ranks_on(c_.config.server_index);
    const int own_on_host = std::max(on_host, local_n_);
    impl->policy = transport::WaitPolicy::for_members(spans_ ? own_on_host : local_n_, c_.config.timeout, c_.settings);
    impl->policy.own_on_host = own_on_host;
    impl->aborted = &c_.aborted;
    impl->channel = std::make_unique<transport::ShmChannel>(std::move(seg_).value(), local_, local_me_, ring_, label_);
    if (Status s = impl->channel->check_format(); !s.ok()) return fail(s);
    if (local_n_ > 1) impl->mail = std::make_unique<transport::ShmMail>(*impl->channel);
    impl->make_queues(ranks_.size());
    if (heap_ != nullptr) {
      impl->channel->set_heap(heap_.get());
      impl->heap_owner = std::make_shared<HeapOwner>(heap_);
      impl->heap = std::move(heap_);
    }
    return Status::Ok();
  }

  // Every member has mapped the segment (a barrier whose opening a failed
  // member answers with its reason): then its name is no longer needed, a
  // crash from here on leaves nothing in /dev/shm, and each member watches
  // the others' processes.
  Status attach() {
    impl->channel->publish_pid();
    try_single_copy_ = c_.settings.single_copy != Settings::SingleCopy::kOff && local_n_ > 1;
    if (try_single_copy_) impl->channel->publish_probe();
    auto arrived = c_.store->add(local_key_ + "/attached/arrived", 1);
    if (!arrived.ok()) return fail(arrived.status());
    if (arrived.value() == local_n_) {
      if (Status s = c_.store->set(local_key_ + "/attached/open", "1"); !s.ok()) return fail(s);
    }
    if (auto open = read(local_key_ + "/attached/open"); !open.ok()) {
      if (heard_) return fail(open.status());
      return fail({open.status().kind(), fmt::format("{} of {} members on this server mapped the group's segment ({})",
                                                     arrived.value(), local_n_, open.status().message())});
    }
    impl->channel->unlink_name();
    if (impl->heap != nullptr) impl->heap->unlink_name();
    if (Status s = impl->channel->watch_members(); !s.ok()) return fail(s);
    return Status::Ok();
  }

  // Single copy only if every member can read every other (one verdict for
  // all): each probes its peers, then waits in the engine for every verdict.
  // Then the group's shape, which every call's plan is made from.
  Status agree_on_single_copy() {
    if (local_n_ > 1) {
      std::string why;
      bool all = impl->channel->probe_peers(try_single_copy_, &why);
      auto agree = [](transport::ShmChannel& ch, bool* all) -> engine::Task<Status> {
        for (int m = 0; m < ch.members(); ++m) {
          auto v = co_await engine::verdict(ch, m);
          if (!v.ok()) co_return v.status();
          *all = *all && v.value();
        }
        co_return Status::Ok();
      };
      engine::DriveOptions o = impl->drive_options();
      o.policy.timeout = std::max(std::chrono::milliseconds(1),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(dl_ - Clock::now()));
      if (Status s = engine::Driver::run(agree(*impl->channel, &all), o); !s.ok()) return fail(s);
      impl->channel->set_single_copy(all);
      if (!all && try_single_copy_) say_single_copy_refused(why);
    }
    impl->shape = algo::GroupShape::of(*impl->channel, algo::Topology::of(server_of_member_, me_),
                                       transport::ranks_outnumber_cores(impl->policy.own_on_host));
    impl->channel->set_own_on_host(impl->policy.own_on_host);
    return Status::Ok();
  }

  // Across servers: a group id for the tags of its messages, the group's own
  // UCX worker, an endpoint to every member on another server (direct sends
  // reach them all), how members tell each other why a call failed, and a
  // barrier across the group, so that a member that cannot be reached fails
  // the creation rather than the first call.
  Status connect_servers() {
    if (!spans_) return Status::Ok();
    const int me_world = c_.config.rank;
    std::string id;
    if (me_ == 0) {
      auto next = c_.store->add("net_group_ids", 1);
      if (!next.ok()) return fail(next.status());
      id = std::to_string(next.value() & 0xffff);
      if (Status s = c_.store->set(key_ + "/id", id); !s.ok()) return fail(s);
    } else {
      auto got = read(key_ + "/id");
      if (!got.ok()) return fail(got.status());
      id = got.value();
    }
    auto net_id = bootstrap::parse_number(fmt::format("store key '{}/id'", key_), id, 0xffff);
    if (!net_id.ok()) return fail(net_id.status());
    auto worker = transport::UcxWorker::create(*c_.ucx);
    if (!worker.ok()) return fail(worker.status());
    if (Status s = c_.store->set(fmt::format("{}/ucx/{}", key_, me_world), worker.value()->address()); !s.ok()) {
      return fail(s);
    }
    std::vector<std::string> addresses(ranks_.size());
    for (size_t m = 0; m < ranks_.size(); ++m) {
      if (server_of_member_[m] == c_.config.server_index) continue;
      const std::string addr_key = fmt::format("{}/ucx/{}", key_, ranks_[m]);
      auto addr = read(addr_key);
      if (!addr.ok()) return fail(addr.status());
      // UCX unpacks a worker address itself: it is opaque to us, but an
      // empty or outsized one is no address at all.
      if (Status s = bootstrap::check_blob(addr_key, addr.value(), bootstrap::kMaxWorkerAddress); !s.ok()) return fail(s);
      addresses[m] = std::move(addr).value();
    }
    // Nobody connects until every member on another server has taken every
    // address it needs: one that refused an address fails the group through
    // the store (its failure under this key), instead of leaving while its
    // peers' connections are on their way to it. A connection refused in the
    // middle of UCX 1.13's wire-up can end in an assertion inside UCX, a
    // SIGABRT in the peer (seen: UntrustedStore.AnEmptyOrOutsizedWorkerAddressIsRefused).
    if (Status s = c_.store->set(fmt::format("{}/ucx/{}/read", key_, me_world), "1"); !s.ok()) return fail(s);
    for (size_t m = 0; m < ranks_.size(); ++m) {
      if (server_of_member_[m] == c_.config.server_index) continue;
      if (auto ready = read(fmt::format("{}/ucx/{}/read", key_, ranks_[m])); !ready.ok()) return fail(ready.status());
    }
    auto net = transport::NetChannel::connect(std::move(worker).value(), static_cast<uint16_t>(net_id.value()), ranks_,
                                              me_, addresses, label_);
    if (!net.ok()) return fail(net.status());
    impl->net = std::move(net).value();
    impl->shape.net = impl->net->capabilities();
    Store* st = c_.store.get();
    std::mutex* mu = &c_.store_mu;
    const std::string fail_key = key_ + "/failure";
    impl->publish_failure = [st, mu, fail_key](const Status& s) {
      std::lock_guard<std::mutex> lock(*mu);
      (void)st->set(fail_key, bootstrap::encode_status(s));
    };
    impl->published_failure = [st, mu, fail_key]() -> std::optional<Status> {
      std::lock_guard<std::mutex> lock(*mu);
      // Published before that member closed its endpoints; but on a busy
      // machine the endpoint may be seen lost first (UCX's own timeout), or
      // the store be slow to answer: 10 ms was too short under ctest -j2 (a
      // Mismatch reported as the lost peer it caused, once). The get waits
      // for the key up to 250 ms, which only a member that left without a
      // word (a crash) costs. A job-abort (another rank has left) answers a
      // missing key at once: keep asking until the time is up.
      const auto until = Clock::now() + std::chrono::milliseconds(250);
      auto v = st->get(fail_key, until);
      while (!v.ok() && v.status().message().rfind(bootstrap::kJobAbortedPrefix, 0) == 0 && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(500));
        v = st->get(fail_key, until);
      }
      if (!v.ok()) return std::nullopt;  // nobody said why: a crash, most likely
      return bootstrap::decode_status(v.value());
    };
    algo::GatherCall hello;
    hello.op = algo::OpCode::kBarrier;
    auto nothing = [](int, size_t, const std::byte*, size_t) {};
    const algo::CallPlan plan = algo::plan_call(impl->shape, hello);
    if (Status s = engine::Driver::run(
            algo::gather_across(*impl->channel, *impl->net, impl->shape.topo, hello, plan, nothing), impl->drive_options());
        !s.ok()) {
      return fail(s);
    }
    if (impl->shape.topo.one_per_server()) {
      // The schedules written for one server run between the servers, a
      // UCX message per step of at most member 0's FG_NET_PIECE_BYTES (as
      // the shared-memory pipeline step is the segment creator's): members
      // whose settings differ still cut every call into the same steps.
      const std::string step_key = key_ + "/steps";
      std::string step_text = std::to_string(algo::net_piece_bytes(0, 64, c_.settings.net_piece_bytes, impl->shape.net.max_pieces));
      if (me_ == 0) {
        if (Status s = c_.store->set(step_key, step_text); !s.ok()) return fail(s);
      } else {
        auto got = read(step_key);
        if (!got.ok()) return fail(got.status());
        step_text = got.value();
      }
      auto step = bootstrap::parse_number(fmt::format("store key '{}'", step_key), step_text, size_t{1} << 30);
      if (!step.ok()) return fail(step.status());
      if (step.value() < 64) return fail({ErrorKind::kInvalidArgument, fmt::format("store key '{}': a step of {} bytes", step_key, step.value())});
      impl->steps = std::make_unique<transport::NetSteps>(*impl->net, static_cast<int>(ranks_.size()), step.value());
      impl->shape.steps = impl->steps->capabilities();
    }
    return Status::Ok();
  }

  std::unique_ptr<Group::Impl> impl;  // made by make_channel()

 private:
  Status where(const Status& s) const {
    return Status{s.kind(), fmt::format("rank {}: creating {}: {}", c_.config.rank, label_, s.message())};
  }

  // Where this rank failed because another member did first - a segment
  // gone because its creator gave up, a wait that outlasted the member that
  // had failed - that member's reason (under the barrier's key, which every
  // failure writes) is the news.
  Status earlier_failure_or(const Status& s) {
    auto earlier = c_.store->get(local_key_ + "/attached/open", Clock::now() + std::chrono::milliseconds(200));
    if (auto f = earlier.ok() ? bootstrap::failure_in(earlier.value()) : std::nullopt) {
      heard_ = true;
      return Status{f->kind(), fmt::format("{} (then here: {})", f->message(), s.message())};
    }
    return s;
  }

  Status fail(Status s) {
    // A timeout here may be the shadow of a member that failed first (and
    // said so while this rank was busy): its reason is the news.
    if (!heard_ && s.kind() == ErrorKind::kTimeout) s = earlier_failure_or(s);
    Status w = where(s);
    if (!heard_) {
      const std::string v = bootstrap::failure_value(w);
      for (const auto& k : awaited_) (void)c_.store->set(k, v);
    }
    return w;
  }

  // What a member wrote under k, or the failure it wrote there instead.
  Result<std::string> read(const std::string& k) {
    auto v = c_.store->get(k, dl_);
    if (!v.ok()) return v.status();
    if (auto f = bootstrap::failure_in(v.value())) {
      heard_ = true;
      return *f;
    }
    return v;
  }

  // The symmetric heap needs address space for every member's region: say
  // which setting that is where it cannot be had.
  Status heap_failed(const Status& s, size_t region) const {
    if (s.message().find(std::strerror(ENOMEM)) == std::string::npos) return s;
    return Status{s.kind(), fmt::format("{} (the symmetric heap: {} members x FG_SYMMETRIC_BYTES={} of shared memory, "
                                        "reserved as address space; set FG_SYMMETRIC_BYTES smaller, or 0 for no heap)",
                                        s.message(), local_n_, region)};
  }

  Communicator::Impl& c_;
  const std::vector<int> ranks_;
  const int me_;
  const std::string key_, label_;
  const Clock::time_point dl_;
  std::vector<int> local_, server_of_member_;
  bool spans_ = false;
  int local_me_ = 0, local_n_ = 0;
  std::string local_key_, prefix_;
  size_t ring_ = 0, bytes_ = 0;
  std::vector<std::string> awaited_;
  bool heard_ = false;  // the failure at hand is another member's, already said
  Result<transport::ShmSegment> seg_ = Status{ErrorKind::kSystem, "no segment mapped"};
  std::shared_ptr<transport::ShmHeap> heap_;
  bool try_single_copy_ = false;
};

}  // namespace

Result<Group*> Communicator::Impl::build_group(std::vector<int> ranks) {
  std::unique_lock<std::mutex> store_lock(store_mu);
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
  // Before any resource is made: abort() reaches groups through a table this long.
  if (groups.size() >= kMaxGroups) {
    return Status{ErrorKind::kResourceExhausted,
                  fmt::format("rank {}: cannot create {}: this rank already has {} groups", me_world, label, kMaxGroups)};
  }

  const int me = static_cast<int>(pos - ranks.begin());
  const std::string key = fmt::format("g/{}/{}", fmt::join(ranks, ","), created[ranks]++);
  GroupBuilder b(*this, std::move(ranks), me, key, label);
  for (auto step : {&GroupBuilder::check_layout, &GroupBuilder::map_segments, &GroupBuilder::make_channel,
                    &GroupBuilder::attach, &GroupBuilder::agree_on_single_copy, &GroupBuilder::connect_servers}) {
    if (Status s = (b.*step)(); !s.ok()) return s;
  }
  std::unique_ptr<Group::Impl> impl = std::move(b.impl);

  for (auto& slot : channels) {
    transport::ShmChannel* none = nullptr;
    if (slot.compare_exchange_strong(none, impl->channel.get())) break;
  }
  impl->others = [this] { return progress_others(); };
  impl->progress = progress;
  store_lock.unlock();  // groups_mu is never taken under store_mu (see progress_others)
  std::lock_guard<std::mutex> lock(groups_mu);
  groups.push_back(GroupAccess::make(std::move(impl)));
  return groups.back().get();
}

}  // namespace fastgather
