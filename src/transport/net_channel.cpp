#include "transport/net_channel.hpp"

#include <algorithm>

#include <poll.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "base/env.hpp"
#include "transport/ucx_api.hpp"

namespace fastgather::transport {
namespace {

using Clock = std::chrono::steady_clock;

Status ucx_error(const std::string& what, ucs_status_t st) {
  return {ErrorKind::kSystem, fmt::format("{}: UCX: {}", what, ucx().ucs_status_string(st))};
}

bool env_set(const char* name) { return base::env_text(name).has_value(); }

constexpr const char* kTcpSegment = "256k";

// Whether TCP alone carries the bytes between servers: the user chose it
// (UCX_TLS=tcp, or simulated servers, where fastgather does), or UCX chooses
// and this host has no RDMA device, so that TCP is all it can find.
bool tcp_alone(const std::string& tls) {
  if (tls == "tcp") return true;
  if (tls != "default") return false;
  std::error_code ec;
  const std::filesystem::directory_iterator devices("/sys/class/infiniband", ec);
  return ec || devices == std::filesystem::directory_iterator();
}

// Statuses that mean the peer (or the way to it) is gone.
bool peer_gone(ucs_status_t st) {
  return st == UCS_ERR_ENDPOINT_TIMEOUT || st == UCS_ERR_CONNECTION_RESET || st == UCS_ERR_UNREACHABLE ||
         st == UCS_ERR_REJECTED || st == UCS_ERR_NOT_CONNECTED || st == UCS_ERR_CANCELED;
}

uint64_t make_tag(uint16_t group, int owner, uint32_t call, uint32_t piece) {
  return (uint64_t{group} << 48) | (uint64_t(owner & (kMaxNetMembers - 1)) << 36) | (uint64_t(call & 0xfffff) << 16) |
         (piece & 0xffff);
}

}  // namespace

// ------------------------------------------------------------- UcxWorker

struct UcxContext::Impl {
  ucp_context_h context = nullptr;
  std::string describe;
  ~Impl() {
    if (context != nullptr) ucx().ucp_cleanup(context);
  }
};

UcxContext::UcxContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxContext::~UcxContext() = default;
const std::string& UcxContext::describe() const { return impl_->describe; }

struct UcxWorker::Impl {
  ucp_worker_h worker = nullptr;
  int efd = -1;
  std::string address;
  ~Impl() {
    if (worker != nullptr) ucx().ucp_worker_destroy(worker);
  }
};

UcxWorker::UcxWorker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxWorker::~UcxWorker() = default;
const std::string& UcxWorker::address() const { return impl_->address; }

Result<std::unique_ptr<UcxWorker>> UcxWorker::create(UcxContext& context) {
  auto impl = std::make_unique<Impl>();
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one thread at a time, not always the same (NetChannel::mu_)
  ucs_status_t st = ucx().ucp_worker_create(context.impl()->context, &wp, &impl->worker);
  if (st != UCS_OK) return ucx_error("creating a UCX worker", st);
  if (st = ucx().ucp_worker_get_efd(impl->worker, &impl->efd); st != UCS_OK) return ucx_error("getting the UCX worker's event fd", st);
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (st = ucx().ucp_worker_get_address(impl->worker, &addr, &len); st != UCS_OK) return ucx_error("getting the UCX worker address", st);
  impl->address.assign(reinterpret_cast<const char*>(addr), len);
  ucx().ucp_worker_release_address(impl->worker, addr);
  return std::unique_ptr<UcxWorker>(new UcxWorker(std::move(impl)));
}

Result<std::unique_ptr<UcxContext>> UcxContext::create(const Options& options) {
  if (auto api = load_ucx(); !api.ok()) return api.status();
  auto impl = std::make_unique<Impl>();
  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucx().ucp_config_read(nullptr, nullptr, &config); st != UCS_OK) return ucx_error("reading the UCX configuration", st);
  std::string tls = base::env_text("UCX_TLS").value_or("default");
  std::string devices = base::env_text("UCX_NET_DEVICES").value_or("default");
  std::string extra;
  if (options.loopback) {
    // Simulated servers share this host; UCX would otherwise pick shared
    // memory between them, and the simulation would measure nothing of the network.
    if (!env_set("UCX_TLS")) {
      ucx().ucp_config_modify(config, "TLS", "tcp");
      tls = "tcp";
    }
    if (!env_set("UCX_NET_DEVICES")) {
      ucx().ucp_config_modify(config, "NET_DEVICES", "lo");
      devices = "lo";
    }
  }
  // Between servers over TCP, UCX's defaults (rendezvous past a few KiB, 8
  // KiB segments) measured 2-3.5x slower than eager sends in 256 KiB segments,
  // on loopback and between two hosts on a veth link alike: rendezvous saves
  // no copy over TCP and costs round trips, and each segment is a system call
  // (docs/multinode.md). So where TCP alone carries the bytes, and unless the
  // user set them, fastgather asks for both.
  if (tcp_alone(tls)) {
    if (!env_set("UCX_RNDV_THRESH")) {
      ucx().ucp_config_modify(config, "RNDV_THRESH", "inf");
      extra += ", UCX_RNDV_THRESH=inf";
    }
    // The segments are a transport setting that ucp_config_modify() does not
    // reach (UCX 1.13: it says yes and changes nothing); UCX reads them from
    // the environment alone, when a worker opens its interfaces. So they are
    // set there, in this process, where the user set neither.
    if (!env_set("UCX_TCP_TX_SEG_SIZE") && !env_set("UCX_TCP_RX_SEG_SIZE")) {
      ::setenv("UCX_TCP_TX_SEG_SIZE", kTcpSegment, 0);
      ::setenv("UCX_TCP_RX_SEG_SIZE", kTcpSegment, 0);
    }
  }
  if (const auto tx = base::env_text("UCX_TCP_TX_SEG_SIZE"), rx = base::env_text("UCX_TCP_RX_SEG_SIZE"); tx && rx && *tx == *rx) {
    extra += ", UCX_TCP_TX/RX_SEG_SIZE=" + *tx;
  } else {
    if (tx) extra += ", UCX_TCP_TX_SEG_SIZE=" + *tx;
    if (rx) extra += ", UCX_TCP_RX_SEG_SIZE=" + *rx;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.name = "fastgather";
  ucs_status_t st = ucx().init(&params, config, &impl->context);
  ucx().ucp_config_release(config);
  if (st != UCS_OK) return ucx_error("initialising UCX", st);

  impl->describe = fmt::format("UCX {}, UCX_TLS={}, UCX_NET_DEVICES={}{}{}", ucx().ucp_get_version_string(), tls, devices,
                               extra, options.loopback ? " (simulated servers on one host: loopback)" : "");
  return std::unique_ptr<UcxContext>(new UcxContext(std::move(impl)));
}

// ------------------------------------------------------------ NetChannel

namespace {

struct Endpoint {
  ucp_ep_h ep = nullptr;
  ucs_status_t error = UCS_OK;  // set by UCX's error callback
};

void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) { static_cast<Endpoint*>(arg)->error = status; }

// One operation in flight. The iov array must outlive it: UCX keeps a pointer to it.
struct Op {
  void* request = nullptr;  // null once completed
  int peer = -1;
  int token = -1;
  uint64_t id = 0;  // a point-to-point message's (0: a collective's)
  uint64_t seq = 0;  // a send's number on the channel (from 1: start_flush's marks)
  bool reported = false;
  ucs_status_t status = UCS_INPROGRESS;
  ucp_tag_recv_info_t info{};
  std::vector<ucp_dt_iov_t> iov;
};

}  // namespace

struct NetChannel::Impl {
  std::unique_ptr<UcxWorker> owned;  // destroyed after the endpoints (see ~NetChannel)
  UcxWorker::Impl* w = nullptr;
  uint16_t group = 0;
  std::vector<Endpoint> eps;  // sized once: UCX holds pointers to its elements
  std::vector<std::unique_ptr<Op>> recvs, sends;
  uint64_t last_id = 0;
  uint64_t send_seq = 0;  // sends posted so far
  // Point-to-point messages numbered so far, to and from each member; the
  // member a receive from any source looks at first.
  std::vector<uint32_t> messages_sent, messages_received;
  size_t any_first = 0;

  // Polls the sends posted before `mark`; true once none of them is in
  // flight (each poll is idempotent: the send's owner still finds it,
  // complete, with its status).
  bool sends_done(uint64_t mark) {
    bool done = true;
    for (auto& op : sends) {
      if (op->seq < mark) done &= poll(*op, false);
    }
    return done;
  }

  // Polls one op; true once complete.
  bool poll(Op& op, bool is_recv) {
    if (op.request == nullptr) return true;
    ucs_status_t st = is_recv ? ucx().ucp_tag_recv_request_test(op.request, &op.info) : ucx().ucp_request_check_status(op.request);
    if (st == UCS_INPROGRESS) return false;
    op.status = st;
    ucx().ucp_request_free(op.request);
    op.request = nullptr;
    return true;
  }

  std::vector<void*> closing;  // endpoint close requests

  void close_endpoints(bool graceful) {
    for (auto& e : eps) {
      if (e.ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = graceful && e.error == UCS_OK ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucx().ucp_ep_close_nbx(e.ep, &p);
      if (r != nullptr && UCS_PTR_IS_PTR(r)) closing.push_back(r);
      e.ep = nullptr;
    }
  }

  // Polls everything in flight once; true when nothing is.
  bool settled() {
    bool busy = false;
    for (auto& op : recvs) busy |= !poll(*op, true);
    for (auto& op : sends) busy |= !poll(*op, false);
    for (void*& r : closing) {
      if (r != nullptr && ucx().ucp_request_check_status(r) != UCS_INPROGRESS) {
        ucx().ucp_request_free(r);
        r = nullptr;
      }
      busy |= r != nullptr;
    }
    return !busy;
  }

  // Progresses until nothing is in flight or `bound` passes, then hands back
  // whatever is left (UCX completes it internally; no callback will touch our
  // memory, as none was registered).
  void drain(std::chrono::milliseconds bound) {
    const auto until = Clock::now() + bound;
    while (!settled() && Clock::now() < until) ucx().ucp_worker_progress(w->worker);
    for (auto* list : {&recvs, &sends}) {
      for (auto& op : *list) {
        if (op->request != nullptr) ucx().ucp_request_free(op->request);
      }
      list->clear();
    }
    for (void* r : closing) {
      if (r != nullptr) ucx().ucp_request_free(r);
    }
    closing.clear();
  }

  // After an error: cancel receives, force-close endpoints (which completes
  // their sends with an error), and let UCX let go of every buffer.
  void abandon() {
    for (auto& op : recvs) {
      if (op->request != nullptr) ucx().ucp_request_cancel(w->worker, op->request);
    }
    close_endpoints(false);
    drain(std::chrono::milliseconds(500));
  }
};

Result<std::unique_ptr<NetChannel>> NetChannel::connect(std::unique_ptr<UcxWorker> worker, uint16_t group_id,
                                                        std::vector<int> world_ranks, int me,
                                                        const std::vector<std::string>& addresses, std::string label) {
  if (world_ranks.size() > static_cast<size_t>(kMaxNetMembers)) {
    return Status{ErrorKind::kUnsupported,
                  fmt::format("{}: {} members; groups across servers hold at most {}", label, world_ranks.size(), kMaxNetMembers)};
  }
  std::unique_ptr<NetChannel> ch(new NetChannel());
  ch->impl_ = std::make_unique<Impl>();
  ch->impl_->w = worker->impl();
  ch->impl_->owned = std::move(worker);
  ch->impl_->group = group_id;
  ch->impl_->eps.resize(world_ranks.size());
  ch->impl_->messages_sent.assign(world_ranks.size(), 0);
  ch->impl_->messages_received.assign(world_ranks.size(), 0);
  ch->world_ranks_ = std::move(world_ranks);
  ch->me_ = me;
  ch->label_ = std::move(label);
  for (size_t m = 0; m < addresses.size(); ++m) {
    if (addresses[m].empty()) continue;
    Endpoint& e = ch->impl_->eps[m];
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(addresses[m].data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = on_ep_error;
    p.err_handler.arg = &e;
    if (ucs_status_t st = ucx().ucp_ep_create(ch->impl_->w->worker, &p, &e.ep); st != UCS_OK) {
      return ucx_error(fmt::format("{}: connecting to rank {}", ch->label_, ch->world_ranks_[m]), st);
    }
  }
  return ch;
}

NetChannel::~NetChannel() {
  impl_->close_endpoints(false);  // no-op after begin_close()
  impl_->drain(std::chrono::milliseconds(500));
}

void NetChannel::begin_close() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  impl_->close_endpoints(broken_.ok());
}

bool NetChannel::closed() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return impl_->settled();
}

void NetChannel::progress() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  ucx().ucp_worker_progress(impl_->w->worker);
}

Status NetChannel::send(int to, int owner, uint32_t call, uint32_t piece, std::span<const NetIov> iov) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  Endpoint& e = impl_->eps[to];
  if (e.ep == nullptr) return {ErrorKind::kSystem, fmt::format("{}: no endpoint to rank {}", label_, world_ranks_[to])};
  auto op = std::make_unique<Op>();
  op->peer = to;
  op->seq = ++impl_->send_seq;
  for (const NetIov& v : iov) {
    op->iov.push_back({v.data, v.len});
    bytes_sent_.fetch_add(v.len, std::memory_order_relaxed);
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_iov();
  ucs_status_ptr_t r = ucx().ucp_tag_send_nbx(e.ep, op->iov.data(), op->iov.size(), make_tag(impl_->group, owner, call, piece), &p);
  if (UCS_PTR_IS_ERR(r)) {
    const ucs_status_t st = UCS_PTR_STATUS(r);
    Status s = peer_gone(st) || e.error != UCS_OK
                   ? Status{ErrorKind::kPeerLost, fmt::format("{}: lost rank {} while rank {} was sending (UCX: {})", label_,
                                                              world_ranks_[to], world_ranks_[me_], ucx().ucs_status_string(st)),
                             world_ranks_[to]}
                   : ucx_error(fmt::format("{}: sending to rank {}", label_, world_ranks_[to]), st);
    fail(s);
    return s;
  }
  if (r == nullptr) return Status::Ok();  // done already (eager)
  op->request = r;
  impl_->sends.push_back(std::move(op));
  return Status::Ok();
}

Status NetChannel::recv(int from, int owner, uint32_t call, uint32_t piece, std::span<const NetIov> iov, int token) {
  return post_recv(from, make_tag(impl_->group, owner, call, piece), ~uint64_t{0}, iov, token);
}

Status NetChannel::post_recv(int from, uint64_t tag, uint64_t mask, std::span<const NetIov> iov, int token) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  auto op = std::make_unique<Op>();
  op->peer = from;
  op->token = token;
  for (const NetIov& v : iov) op->iov.push_back({v.data, v.len});
  ucp_request_param_t p{};
  // Always a request: UCX 1.13 does not fill recv_info on an immediate
  // completion of an iov receive (seen: the length stayed unset).
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.datatype = ucp_dt_make_iov();
  ucs_status_ptr_t r = ucx().ucp_tag_recv_nbx(impl_->w->worker, op->iov.data(), op->iov.size(), tag, mask, &p);
  if (UCS_PTR_IS_ERR(r)) {
    Status s = ucx_error(fmt::format("{}: receiving from rank {}", label_, world_ranks_[from]), UCS_PTR_STATUS(r));
    fail(s);
    return s;
  }
  op->request = r;
  impl_->recvs.push_back(std::move(op));
  return Status::Ok();
}

size_t NetChannel::pending_receives() const {
  size_t n = 0;
  for (const auto& op : impl_->recvs) n += op->reported || op->id != 0 ? 0 : 1;
  return n;
}

std::optional<NetChannel::Completion> NetChannel::poll_receive() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return std::nullopt;
  for (auto& op : impl_->recvs) {
    if (op->id == 0 && !op->reported && impl_->poll(*op, true) && op->status == UCS_OK) {
      op->reported = true;
      Completion c{op->token, op->info.length};
      if (pending_receives() == 0) std::erase_if(impl_->recvs, [](const auto& o) { return o->id == 0; });
      return c;
    }
  }
  return std::nullopt;
}

bool NetChannel::poll_sends() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return false;
  for (auto& op : impl_->sends) {
    if (op->id == 0 && (!impl_->poll(*op, false) || op->status != UCS_OK)) return false;
  }
  std::erase_if(impl_->sends, [](const auto& o) { return o->id == 0; });
  return true;
}

uint64_t NetChannel::start_flush() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return 0;  // nothing more will move
  // A call may end with sends in flight (a schedule over the steps between
  // servers waits for its sends only where they leave from the caller's
  // memory): a rendezvous send's bytes are read by the receiver (UCX's get
  // over TCP asks this worker for them), so they need this member's
  // progress. (UCX's worker flush leaves tag sends be, and asking for one
  // after every call made calls across two hosts 1.6-2x slower in most runs.)
  const uint64_t mark = impl_->send_seq + 1;
  return impl_->sends_done(mark) ? 0 : mark;
}

bool NetChannel::flushed(uint64_t mark) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  ucx().ucp_worker_progress(impl_->w->worker);
  return impl_->sends_done(mark) || !broken_.ok();
}

uint32_t NetChannel::point_to_point_piece(int64_t tag) {
  // Folded 15 bits at a time, so that tags below 32768 never share a piece.
  uint64_t t = static_cast<uint64_t>(tag);
  uint32_t fold = 0;
  for (; t != 0; t >>= 15) fold ^= static_cast<uint32_t>(t & (kPointToPointPiece - 1));
  return kPointToPointPiece | fold;
}

Result<uint64_t> NetChannel::send_message(int to, int64_t tag, std::span<const NetIov> iov) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const size_t before = impl_->sends.size();
  const uint32_t number = ++impl_->messages_sent[static_cast<size_t>(to)];
  if (Status s = send(to, me_, number, point_to_point_piece(tag), iov); !s.ok()) return s;
  if (impl_->sends.size() == before) return uint64_t{0};  // sent already (eager)
  impl_->sends.back()->id = ++impl_->last_id;
  return impl_->last_id;
}

Result<uint64_t> NetChannel::recv_message(int from, std::span<const NetIov> iov) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const uint32_t number = ++impl_->messages_received[static_cast<size_t>(from)];
  // Any fold: a tag that disagrees is the caller's to find (it is in the message).
  const uint64_t mask = ~uint64_t{kPointToPointPiece - 1};
  if (Status s = post_recv(from, make_tag(impl_->group, from, number, kPointToPointPiece), mask, iov, -1); !s.ok()) return s;
  impl_->recvs.back()->id = ++impl_->last_id;
  return impl_->last_id;
}

Result<std::optional<NetChannel::AnyMessage>> NetChannel::recv_any_message(std::span<const int> from, int64_t tag,
                                                                           std::span<const NetIov> iov) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  ucx().ucp_worker_progress(impl_->w->worker);
  const uint32_t piece = point_to_point_piece(tag);
  const size_t n = from.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t k = (impl_->any_first + i) % n;
    const int m = from[k];
    const uint32_t number = impl_->messages_received[static_cast<size_t>(m)] + 1;
    ucp_tag_recv_info_t info{};
    // Left where it is (remove = 0): recv_message's receive takes it.
    if (ucx().ucp_tag_probe_nb(impl_->w->worker, make_tag(impl_->group, m, number, piece), ~uint64_t{0}, 0, &info) ==
        nullptr) {
      continue;
    }
    impl_->any_first = (k + 1) % n;
    auto id = recv_message(m, iov);
    if (!id.ok()) return id.status();
    return std::optional<AnyMessage>{AnyMessage{id.value(), m}};
  }
  return std::optional<AnyMessage>{};
}

namespace {
// The op known by `id` in `list`, or list.end().
std::vector<std::unique_ptr<Op>>::iterator find_id(std::vector<std::unique_ptr<Op>>& list, uint64_t id) {
  return std::find_if(list.begin(), list.end(), [id](const auto& o) { return o->id == id; });
}
}  // namespace

Result<bool> NetChannel::message_sent(uint64_t id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (id == 0) return true;
  if (!broken_.ok()) return broken_;
  auto it = find_id(impl_->sends, id);
  if (it == impl_->sends.end()) return true;
  if (!impl_->poll(**it, false)) return false;
  const ucs_status_t st = (*it)->status;
  const int peer = (*it)->peer;
  impl_->sends.erase(it);
  if (st != UCS_OK) {
    return ucx_error(fmt::format("{}: rank {} sending to rank {}", label_, world_ranks_[me_], world_ranks_[peer]), st);
  }
  return true;
}

Result<std::optional<size_t>> NetChannel::message_received(uint64_t id) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  auto it = find_id(impl_->recvs, id);
  if (it == impl_->recvs.end()) return Status{ErrorKind::kSystem, fmt::format("{}: no such receive", label_)};
  if (!impl_->poll(**it, true)) return std::optional<size_t>{};
  const ucs_status_t st = (*it)->status;
  const int peer = (*it)->peer;
  size_t posted = 0;
  for (const auto& v : (*it)->iov) posted += v.length;
  const size_t length = (*it)->info.length;
  impl_->recvs.erase(it);
  if (st == UCS_ERR_MESSAGE_TRUNCATED) {
    return Status{ErrorKind::kMismatch, fmt::format("{}: rank {} sent a message larger than the {} bytes (with header) rank "
                                                    "{} receives", label_, world_ranks_[peer], posted, world_ranks_[me_]),
                  world_ranks_[peer]};
  }
  if (st != UCS_OK) {
    return ucx_error(fmt::format("{}: rank {} receiving from rank {}", label_, world_ranks_[me_], world_ranks_[peer]), st);
  }
  return std::optional<size_t>{length};
}

bool NetChannel::busy() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return !impl_->recvs.empty() || !impl_->sends.empty() || !impl_->closing.empty();
}

Status NetChannel::check(const char* what, std::optional<Clock::time_point>& lost_since) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  auto& eps = impl_->eps;
  // A peer that failed a call (a mismatch it saw) closes its endpoints; what
  // other peers sent before that is still on its way. So a lost peer is
  // reported only once nothing else has arrived for a short grace period, and
  // the caller gets to judge the messages that did arrive first.
  constexpr auto kGrace = std::chrono::milliseconds(10);
  int lost_peer = -1;
  for (auto* list : {&impl_->recvs, &impl_->sends}) {
    for (auto& op : *list) {
      if (op->request != nullptr && eps[op->peer].error != UCS_OK && lost_peer < 0) lost_peer = op->peer;
      if (op->request == nullptr && op->status != UCS_OK && op->status != UCS_INPROGRESS && !op->reported) {
        if (op->status == UCS_ERR_MESSAGE_TRUNCATED) {
          size_t posted = 0;
          for (const auto& v : op->iov) posted += v.length;
          return {ErrorKind::kMismatch, fmt::format("{}: rank {} sent a message larger than the {} bytes (with header) "
                                                    "rank {} expected", label_, world_ranks_[op->peer], posted,
                                                    world_ranks_[me_])};
        }
        if (eps[op->peer].error != UCS_OK || peer_gone(op->status)) {
          if (lost_peer < 0) lost_peer = op->peer;
          continue;
        }
        return ucx_error(fmt::format("{}: rank {} {} rank {}", label_, world_ranks_[me_], what, world_ranks_[op->peer]),
                         op->status);
      }
    }
  }
  if (lost_peer < 0) {
    lost_since.reset();
    return Status::Ok();
  }
  if (!lost_since) lost_since = Clock::now();
  if (Clock::now() - *lost_since <= kGrace) return Status::Ok();
  return {ErrorKind::kPeerLost, fmt::format("{}: lost rank {} while rank {} was {} (UCX: {})", label_,
                                            world_ranks_[lost_peer], world_ranks_[me_], what,
                                            ucx().ucs_status_string(eps[lost_peer].error != UCS_OK
                                                                        ? eps[lost_peer].error
                                                                        : UCS_ERR_CONNECTION_RESET)),
          world_ranks_[lost_peer]};
}

Status NetChannel::timed_out(const char* what, std::chrono::milliseconds timeout) const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  int peer = -1;
  for (auto* list : {&impl_->recvs, &impl_->sends}) {
    for (auto& op : *list) {
      if (peer < 0 && op->request != nullptr) peer = op->peer;
    }
  }
  const int who = peer >= 0 ? world_ranks_[peer] : -1;
  return {ErrorKind::kTimeout, fmt::format("{}: rank {} did not arrive within {} ms (rank {} was {})", label_, who,
                                           timeout.count(), world_ranks_[me_], what),
          who};
}

void NetChannel::sleep(std::chrono::nanoseconds slice) {
  // Sleep until the worker has events (or the slice passes): armed under
  // the lock, slept without it.
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (ucx().ucp_worker_arm(impl_->w->worker) != UCS_OK) return;  // BUSY: events pending; an error shows in check()
  }
  pollfd p{impl_->w->efd, POLLIN, 0};
  const timespec ts{static_cast<time_t>(slice.count() / 1'000'000'000), static_cast<long>(slice.count() % 1'000'000'000)};
  ::ppoll(&p, 1, &ts, nullptr);
}

void NetChannel::fail(Status why) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (failed_.load(std::memory_order_relaxed)) return;
  broken_ = std::move(why);
  failed_.store(true, std::memory_order_release);
  impl_->abandon();
}

}  // namespace fastgather::transport
