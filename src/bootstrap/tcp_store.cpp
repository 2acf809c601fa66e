#include "bootstrap/tcp_store.hpp"

#include "bootstrap/store_values.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

namespace fastgather::bootstrap {

// MASTER_IP: an IPv4 or IPv6 address, or a host name (its IPv4 address first).
Result<std::pair<sockaddr_storage, socklen_t>> resolve_store_address(const std::string& addr, int port);
constexpr std::chrono::milliseconds kHelloReplyWithin{3000};

namespace {

Status sys_error(const std::string& what) {
  return {ErrorKind::kSystem, fmt::format("{}: {}", what, std::strerror(errno))};
}

void put_u32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void put_str(std::string* s, std::string_view v) {
  put_u32(s, static_cast<uint32_t>(v.size()));
  s->append(v);
}

// Reads fields from one frame's payload, refusing to run past its end.
struct Reader {
  std::string_view buf;
  bool ok = true;
  bool u32(uint32_t* v) {
    if (buf.size() < 4) return ok = false;
    std::memcpy(v, buf.data(), 4);
    buf.remove_prefix(4);
    return true;
  }
  bool str(std::string* v, size_t max) {
    uint32_t n = 0;
    if (!u32(&n) || n > max || n > buf.size()) return ok = false;
    v->assign(buf.data(), n);
    buf.remove_prefix(n);
    return true;
  }
  bool i64(int64_t* v) {
    if (buf.size() < 8) return ok = false;
    std::memcpy(v, buf.data(), 8);
    buf.remove_prefix(8);
    return true;
  }
};

std::string reply_frame(StoreReply code, uint32_t id, std::string_view payload) {
  std::string out;
  put_u32(&out, static_cast<uint32_t>(5 + payload.size()));
  out.push_back(static_cast<char>(code));
  put_u32(&out, id);
  out.append(payload);
  return out;
}

bool send_all(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

int64_t parse_store_request(std::string_view buf, StoreRequest* out) {
  if (buf.size() < 4) return 0;
  uint32_t len = 0;
  std::memcpy(&len, buf.data(), 4);
  if (len == 0 || len > kMaxFrame) return -1;
  if (buf.size() - 4 < len) return 0;
  if (len < 5) return -1;  // op and request id
  Reader r{buf.substr(9, len - 5)};
  auto op = static_cast<StoreOp>(static_cast<uint8_t>(buf[4]));
  *out = StoreRequest{};
  out->op = op;
  std::memcpy(&out->id, buf.data() + 5, 4);
  switch (op) {
    case StoreOp::kHello:
      r.str(&out->key, kMaxKey) && r.str(&out->value, kMaxKey);
      break;
    case StoreOp::kSet:
      r.str(&out->key, kMaxKey) && r.str(&out->value, kMaxFrame);
      break;
    case StoreOp::kGet:
      r.str(&out->key, kMaxKey);
      break;
    case StoreOp::kAdd:
      r.str(&out->key, kMaxKey) && r.i64(&out->delta);
      break;
    case StoreOp::kBye:
      break;
    default:
      return -1;
  }
  if (!r.ok || !r.buf.empty()) return -1;  // short or trailing bytes
  return 4 + static_cast<int64_t>(len);
}

std::string encode_store_request(const StoreRequest& req) {
  std::string payload;
  payload.push_back(static_cast<char>(req.op));
  put_u32(&payload, req.id);
  switch (req.op) {
    case StoreOp::kGet:
      put_str(&payload, req.key);
      break;
    case StoreOp::kHello:
    case StoreOp::kSet:
      put_str(&payload, req.key);
      put_str(&payload, req.value);
      break;
    case StoreOp::kAdd:
      put_str(&payload, req.key);
      payload.append(reinterpret_cast<const char*>(&req.delta), 8);
      break;
    case StoreOp::kBye:
      break;
  }
  std::string out;
  put_u32(&out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}

// ---------------------------------------------------------------- server

std::optional<uid_t> peer_uid_on_this_host(int fd) {
  sockaddr_storage here{}, there{};
  socklen_t here_len = sizeof(here), there_len = sizeof(there);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&here), &here_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&there), &there_len) != 0 || here.ss_family != there.ss_family ||
      (here.ss_family != AF_INET && here.ss_family != AF_INET6)) {
    return std::nullopt;
  }
  // The other end's socket, looked up by its own 4-tuple: its source is our
  // peer, its destination us.
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } q{};
  q.nlh.nlmsg_len = sizeof(q);
  q.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  q.nlh.nlmsg_flags = NLM_F_REQUEST;
  q.req.sdiag_family = static_cast<uint8_t>(here.ss_family);
  q.req.sdiag_protocol = IPPROTO_TCP;
  q.req.idiag_states = ~0u;
  q.req.id.idiag_cookie[0] = q.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (here.ss_family == AF_INET) {
    const auto& h = reinterpret_cast<const sockaddr_in&>(here);
    const auto& t = reinterpret_cast<const sockaddr_in&>(there);
    q.req.id.idiag_sport = t.sin_port;
    q.req.id.idiag_dport = h.sin_port;
    std::memcpy(q.req.id.idiag_src, &t.sin_addr, 4);
    std::memcpy(q.req.id.idiag_dst, &h.sin_addr, 4);
  } else {
    const auto& h = reinterpret_cast<const sockaddr_in6&>(here);
    const auto& t = reinterpret_cast<const sockaddr_in6&>(there);
    q.req.id.idiag_sport = t.sin6_port;
    q.req.id.idiag_dport = h.sin6_port;
    std::memcpy(q.req.id.idiag_src, &t.sin6_addr, 16);
    std::memcpy(q.req.id.idiag_dst, &h.sin6_addr, 16);
  }
  const int nl = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return std::nullopt;
  std::optional<uid_t> uid;
  timeval tv{0, 200000};  // the kernel answers at once; never hang a store on it
  ::setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(nl, &q, sizeof(q), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) ==
      static_cast<ssize_t>(sizeof(q))) {
    alignas(nlmsghdr) char buf[8192];
    const ssize_t n = ::recv(nl, buf, sizeof(buf), 0);
    const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
    // One answer or an error (ENOENT: no such socket here, i.e. the peer is
    // on another host or in another network namespace).
    if (n > 0 && NLMSG_OK(h, static_cast<unsigned>(n)) && h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
        h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      uid = static_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid;
    }
  }
  ::close(nl);
  return uid;
}

struct TcpStoreServer::State {
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: stop request
  StoreAdmission admission;
  struct Client {
    std::string in;
    bool greeted = false;
    Clock::time_point since;
    int rank = -1;                // the job rank this connection speaks for, if it said one
    std::optional<uid_t> uid;     // who opened it, where this host's kernel can say
  };
  int world = -1;               // set by the first rank's HELLO
  std::map<int, int> joined;    // rank -> connection, while connected
  std::set<int> ever_joined;    // ranks that have said HELLO at any time
  std::map<int, Client> clients;
  std::map<std::string, std::string> kv;
  std::multimap<std::string, std::pair<int, uint32_t>> waiting;  // key -> (fd, request id) blocked in GET
  std::mutex mu;                            // guards greeted_count for drain()
  int greeted_count = 0;
  int ever_greeted = 0;  // ranks that have joined at any time
  std::string abort_reason;  // set once kJobAbortKey is
  std::atomic<uint64_t> rejected{0};
  std::atomic<size_t> stranger_bytes{0};
};

Result<int> listen_on(const std::string& addr, int port) {
  auto where = resolve_store_address(addr, port);
  if (!where.ok()) return where.status();
  const sockaddr_storage sa = where.value().first;
  const socklen_t sa_len = where.value().second;
  const int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return sys_error("store socket");
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sa_len) != 0 || ::listen(fd, 256) != 0) {
    Status e = sys_error(fmt::format("rendezvous store cannot listen on {}:{}", addr, port));
    ::close(fd);
    return e;
  }
  return fd;
}

int bound_port(int listen_fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return 0;
  return ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
}

namespace {
std::atomic<int> g_running_servers{0};  // TcpStoreServer::running()
}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& addr, int port,
                                                              StoreAdmission admission, int listen_fd) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->state_ = std::make_unique<State>();
  State& st = *s->state_;
  st.admission = std::move(admission);
  // A socket for another port (a Config changed after the spawner made it)
  // is not the one asked for.
  if (listen_fd >= 0 && bound_port(listen_fd) != port) listen_fd = -1;
  if (listen_fd >= 0) {
    // The caller's socket (a spawner's): ours is a copy, so that the
    // caller's stays open for the next communicator of the same job.
    st.listen_fd = ::fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);
    if (st.listen_fd < 0) return sys_error("the rendezvous socket handed to rank 0");
    ::fcntl(st.listen_fd, F_SETFL, ::fcntl(st.listen_fd, F_GETFL) | O_NONBLOCK);
  } else {
    auto fd = listen_on(addr, port);
    if (!fd.ok()) return fd.status();
    st.listen_fd = fd.value();
  }
  s->port_ = bound_port(st.listen_fd);
  st.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  s->thread_ = std::thread([srv = s.get()] { srv->loop(); });
  g_running_servers.fetch_add(1);
  return s;
}

int TcpStoreServer::running() { return g_running_servers.load(); }

TcpStoreServer::~TcpStoreServer() {
  if (!state_) return;
  uint64_t one = 1;
  (void)!::write(state_->wake_fd, &one, sizeof(one));
  if (thread_.joinable()) {
    thread_.join();
    g_running_servers.fetch_sub(1);
  }
  for (auto& [fd, c] : state_->clients) ::close(fd);
  ::close(state_->listen_fd);
  ::close(state_->wake_fd);
}

uint64_t TcpStoreServer::rejected_connections() const { return state_->rejected.load(); }
size_t TcpStoreServer::stranger_bytes() const { return state_->stranger_bytes.load(); }

void TcpStoreServer::drain(Clock::time_point deadline, int joined) {
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> g(state_->mu);
      if (state_->ever_greeted >= joined && state_->greeted_count == 0) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void TcpStoreServer::loop() {
  pthread_setname_np(pthread_self(), "fg-store");
  State& st = *state_;
  auto drop = [&](int fd) {
    auto it = st.clients.find(fd);
    if (it == st.clients.end()) return;
    if (it->second.greeted) {
      std::lock_guard<std::mutex> g(st.mu);
      --st.greeted_count;
      if (it->second.rank >= 0) st.joined.erase(it->second.rank);
    } else {
      st.rejected.fetch_add(1);
    }
    for (auto w = st.waiting.begin(); w != st.waiting.end();) {
      w = (w->second.first == fd) ? st.waiting.erase(w) : std::next(w);
    }
    ::close(fd);
    st.clients.erase(it);
  };
  auto reply = [&](int fd, uint32_t id, StoreReply code, std::string_view payload) {
    return send_all(fd, reply_frame(code, id, payload), Clock::now() + std::chrono::seconds(1));
  };

  const uid_t my_uid = ::geteuid();
  // Why a first frame does not admit its connection ("" when it does); on
  // admission, cl.rank and the job's size are what the HELLO said.
  auto admit = [&](State::Client& cl, const StoreRequest& req) -> std::string {
    if (req.op != StoreOp::kHello || req.key != st.admission.token) {
      return "first frame must be HELLO with this job's token";
    }
    if (st.world >= 0 && static_cast<int>(st.ever_joined.size()) >= st.world) {
      return fmt::format("all {} ranks of this job have joined; the store admits nobody else", st.world);
    }
    // A connection opened on this host by another user is a stranger
    // whatever it knows (a token can leak; a uid cannot be claimed).
    if (st.admission.refuse_other_users && cl.uid && *cl.uid != my_uid) {
      return fmt::format("the connection was opened by uid {} on this host; this job runs as uid {}", *cl.uid, my_uid);
    }
    if (req.value.empty()) return "";  // anonymous: a tool, not a rank
    // "rank/world": a second job's rank, or a stale one, must not join this job.
    auto who = parse_rank_identity(req.value, kMaxStoreRanks);
    if (!who.ok()) return who.status().message();
    const auto [r, w] = who.value();
    if (st.world >= 0 && w != st.world) {
      return fmt::format("this job has {} ranks, the caller says {} (another job on this port?)", st.world, w);
    }
    if (st.ever_joined.count(r) != 0) {
      return fmt::format("rank {} has already joined this job (another job on this port?)", r);
    }
    st.world = w;
    cl.rank = r;
    return "";
  };
  std::vector<pollfd> fds;
  std::vector<int> to_drop;
  const int tick_ms = static_cast<int>(std::clamp<int64_t>(st.admission.hello_within.count() / 2, 1, 500));
  for (;;) {
    size_t strangers = 0, held = 0;
    for (auto& [fd, c] : st.clients) {
      if (!c.greeted) ++strangers, held += c.in.capacity();
    }
    st.stranger_bytes.store(held);
    fds.clear();
    fds.push_back({st.wake_fd, POLLIN, 0});
    // At kMaxStrangers, new connections wait in the listen backlog until a
    // stranger has said HELLO or run out of time.
    fds.push_back({st.listen_fd, static_cast<short>(strangers < kMaxStrangers ? POLLIN : 0), 0});
    for (auto& [fd, c] : st.clients) fds.push_back({fd, POLLIN, 0});
    int n = ::poll(fds.data(), fds.size(), tick_ms);
    if (n < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      while (strangers < kMaxStrangers) {
        int c = ::accept4(st.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        State::Client cl;
        cl.since = Clock::now();
        // Asked now, while the connecting socket surely exists.
        if (st.admission.refuse_other_users) cl.uid = peer_uid_on_this_host(c);
        st.clients[c] = std::move(cl);
        ++strangers;
      }
    }
    to_drop.clear();
    for (size_t i = 2; i < fds.size(); ++i) {
      int fd = fds[i].fd;
      auto& cl = st.clients[fd];
      if (!cl.greeted && Clock::now() - cl.since > st.admission.hello_within) {  // half-open or silent
        to_drop.push_back(fd);
        continue;
      }
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      // A stranger's bytes are read only as far as a HELLO can reach.
      const size_t want = cl.greeted ? sizeof(buf) : kMaxHello - std::min(kMaxHello - 1, cl.in.size());
      ssize_t r = ::recv(fd, buf, want, 0);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        to_drop.push_back(fd);
        continue;
      }
      cl.in.append(buf, static_cast<size_t>(r));
      if (!cl.greeted && cl.in.size() >= 4) {
        uint32_t len = 0;
        std::memcpy(&len, cl.in.data(), 4);
        if (4 + static_cast<size_t>(len) > kMaxHello) {  // no HELLO is this long
          to_drop.push_back(fd);
          continue;
        }
      }
      for (;;) {
        StoreRequest req;
        int64_t used = parse_store_request(cl.in, &req);
        if (used == 0) break;
        if (used < 0) {
          to_drop.push_back(fd);
          break;
        }
        cl.in.erase(0, static_cast<size_t>(used));
        if (!cl.greeted) {
          const std::string why = admit(cl, req);
          if (!why.empty()) {
            reply(fd, req.id, StoreReply::kError, "rendezvous refused: " + why);
            to_drop.push_back(fd);
            break;
          }
          if (cl.rank >= 0) {
            st.joined[cl.rank] = fd;
            st.ever_joined.insert(cl.rank);
          }
          cl.greeted = true;
          cl.in.shrink_to_fit();
          {
            std::lock_guard<std::mutex> g(st.mu);
            ++st.greeted_count;
            ++st.ever_greeted;
          }
          reply(fd, req.id, StoreReply::kOk, "");
          continue;
        }
        switch (req.op) {
          case StoreOp::kSet: {
            st.kv[req.key] = req.value;
            reply(fd, req.id, StoreReply::kOk, "");
            if (req.key == kJobAbortKey) {
              // Nobody waits for a key that will not come: every waiting
              // and every later GET of a missing key gets the reason.
              if (st.abort_reason.empty()) st.abort_reason = std::string(kJobAbortedPrefix) + req.value;
              for (auto& [key, w] : st.waiting) reply(w.first, w.second, StoreReply::kError, st.abort_reason);
              st.waiting.clear();
              break;
            }
            auto [b, e] = st.waiting.equal_range(req.key);
            for (auto w = b; w != e; ++w) reply(w->second.first, w->second.second, StoreReply::kOk, req.value);
            st.waiting.erase(b, e);
            break;
          }
          case StoreOp::kGet: {
            auto it = st.kv.find(req.key);
            if (it != st.kv.end()) {
              reply(fd, req.id, StoreReply::kOk, it->second);
            } else if (!st.abort_reason.empty()) {
              reply(fd, req.id, StoreReply::kError, st.abort_reason);
            } else {
              st.waiting.emplace(req.key, std::pair{fd, req.id});
            }
            break;
          }
          case StoreOp::kAdd: {
            int64_t v = 0;
            auto it = st.kv.find(req.key);
            if (it != st.kv.end()) v = std::strtoll(it->second.c_str(), nullptr, 10);
            v += req.delta;
            st.kv[req.key] = std::to_string(v);
            reply(fd, req.id, StoreReply::kOk, std::to_string(v));
            break;
          }
          case StoreOp::kBye:
            to_drop.push_back(fd);
            break;
          case StoreOp::kHello:
            reply(fd, req.id, StoreReply::kError, "HELLO sent twice");
            to_drop.push_back(fd);
            break;
        }
        if (!to_drop.empty() && to_drop.back() == fd) break;
      }
      if (cl.in.size() > kMaxFrame + 8) to_drop.push_back(fd);
    }
    for (int fd : to_drop) drop(fd);
  }
}

std::string encode_status(const Status& s) { return fmt::format("{}\n{}", static_cast<int>(s.kind()), s.message()); }

std::optional<Status> decode_status(std::string_view value) {
  const size_t nl = value.find('\n');
  if (nl == 0 || nl > 2) return std::nullopt;  // also npos
  int k = 0;
  for (char ch : value.substr(0, nl)) {
    if (ch < '0' || ch > '9') return std::nullopt;
    k = k * 10 + (ch - '0');
  }
  if (k <= 0 || k > static_cast<int>(ErrorKind::kAborted)) return std::nullopt;
  return Status{static_cast<ErrorKind>(k), std::string(value.substr(nl + 1))};
}

std::string job_abort_value(const Status& why, int rank) {
  return encode_status({why.kind(), fmt::format("rank {}: {}", rank, why.to_string())});
}

Result<std::pair<sockaddr_storage, socklen_t>> resolve_store_address(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status{ErrorKind::kInvalidArgument,
                  fmt::format("master address '{}' does not resolve: {}", addr, rc != 0 ? ::gai_strerror(rc) : "no address")};
  }
  // IPv4 first when a name has both ("localhost"): every rank must pick the same.
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  std::pair<sockaddr_storage, socklen_t> out{};
  std::memcpy(&out.first, pick->ai_addr, pick->ai_addrlen);
  out.second = pick->ai_addrlen;
  ::freeaddrinfo(res);
  return out;
}

// ---------------------------------------------------------------- client

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::connect(const std::string& addr, int port,
                                                                const std::string& token,
                                                                Clock::time_point deadline,
                                                                const std::string& identity) {
  auto where = resolve_store_address(addr, port);
  if (!where.ok()) return where.status();
  const sockaddr_storage sa = where.value().first;
  const socklen_t sa_len = where.value().second;
  int last_errno = 0;
  while (Clock::now() < deadline) {
    int fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return sys_error("store socket");
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sa_len) == 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::unique_ptr<TcpStoreClient> c(new TcpStoreClient(fd));
      c->peer_ = fmt::format("{}:{}", addr, port);
      StoreRequest hello{.op = StoreOp::kHello, .key = token, .value = identity};
      // A store answers HELLO at once. Whatever else listens on the port
      // (another program, a half-dead process) must not hold us for the
      // whole timeout.
      auto r = c->call(hello, std::min(deadline, Clock::now() + kHelloReplyWithin));
      if (r.status().kind() == ErrorKind::kTimeout) {
        return Status{ErrorKind::kSystem,
                      fmt::format("{}:{} accepted the connection but did not answer the rendezvous HELLO within {} ms: "
                                  "is another program listening on this port?",
                                  addr, port, kHelloReplyWithin.count())};
      }
      if (!r.ok()) return r.status();
      return c;
    }
    last_errno = errno;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // No errno where the deadline had passed before the first try.
  return Status{ErrorKind::kTimeout, fmt::format("no rendezvous store answered at {}:{} ({})", addr, port,
                                                 last_errno != 0 ? std::strerror(last_errno)
                                                                 : "the start-up deadline passed before the first try")};
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ < 0) return;
  StoreRequest bye{.op = StoreOp::kBye};
  std::string f = encode_store_request(bye);
  send_all(fd_, f, Clock::now() + std::chrono::milliseconds(100));
  ::close(fd_);
}

Result<std::string> TcpStoreClient::call(StoreRequest req, Clock::time_point deadline) {
  if (fd_ < 0) return Status{ErrorKind::kPeerLost, "rendezvous connection already closed"};
  auto fail = [&](ErrorKind kind, const std::string& why) -> Status {
    ::close(fd_);  // the stream cannot be trusted any more
    fd_ = -1;
    return {kind, fmt::format("rendezvous store {}: {}", peer_, why)};
  };
  req.id = ++next_id_;
  bool last_look = false;
  if (!send_all(fd_, encode_store_request(req), deadline)) {
    return fail(ErrorKind::kPeerLost, fmt::format("connection to the store host (world rank 0) lost: {}", std::strerror(errno)));
  }
  for (;;) {
    // Replies carry the request id: a late answer to a call that timed out
    // earlier is skipped, so a timeout leaves the connection usable.
    while (in_.size() >= 4) {
      uint32_t len = 0;
      std::memcpy(&len, in_.data(), 4);
      if (len < 5 || len > kMaxFrame) return fail(ErrorKind::kSystem, "malformed reply");
      if (in_.size() - 4 < len) break;
      auto code = static_cast<StoreReply>(in_[4]);
      uint32_t id = 0;
      std::memcpy(&id, in_.data() + 5, 4);
      std::string payload = in_.substr(9, len - 5);
      in_.erase(0, 4 + static_cast<size_t>(len));
      if (id != req.id) continue;
      if (code != StoreReply::kOk && payload.rfind(kJobAbortedPrefix, 0) == 0) {
        // Another rank gave up on the job and said why: that is the news,
        // with the kind of its failure.
        const std::string rest = payload.substr(std::strlen(kJobAbortedPrefix));
        if (auto why = decode_status(rest)) return Status{why->kind(), kJobAbortedPrefix + why->message()};
        return Status{ErrorKind::kPeerLost, payload};
      }
      if (code != StoreReply::kOk) return fail(ErrorKind::kInvalidArgument, payload);
      return payload;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    // At the deadline, one last look at what has already arrived: a reply
    // that came while we slept is an answer, not a timeout.
    if (left <= 0 && !last_look) {
      last_look = true;
      left = 0;
    } else if (left <= 0) {
      return Status{ErrorKind::kTimeout,
                    fmt::format("rendezvous store {}: {}", peer_,
                                req.op == StoreOp::kGet ? fmt::format("timed out waiting for key '{}'", req.key)
                                                        : std::string("timed out"))};
    }
    pollfd p{fd_, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) return fail(ErrorKind::kSystem, std::strerror(errno));
    if (n <= 0) continue;
    char buf[4096];
    ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
    if (r == 0) return fail(ErrorKind::kPeerLost, "connection to the store host (world rank 0) lost: closed");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return fail(ErrorKind::kPeerLost, fmt::format("connection to the store host (world rank 0) lost: {}", std::strerror(errno)));
    }
    in_.append(buf, static_cast<size_t>(r));
  }
}

Status TcpStoreClient::set(const std::string& key, const std::string& value) {
  auto r = call({.op = StoreOp::kSet, .key = key, .value = value}, Clock::now() + std::chrono::seconds(30));
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::string> TcpStoreClient::get(const std::string& key, Clock::time_point deadline) {
  return call({.op = StoreOp::kGet, .key = key}, deadline);
}

Result<int64_t> TcpStoreClient::add(const std::string& key, int64_t delta) {
  auto r = call({.op = StoreOp::kAdd, .key = key, .delta = delta}, Clock::now() + std::chrono::seconds(30));
  if (!r.ok()) return r.status();
  return static_cast<int64_t>(std::strtoll(r.value().c_str(), nullptr, 10));
}

}  // namespace fastgather::bootstrap

namespace fastgather {

Status Store::barrier(const std::string& name, int count, Clock::time_point deadline) {
  auto n = add(name + "/arrived", 1);
  if (!n.ok()) return n.status();
  if (n.value() == count) {
    if (Status s = set(name + "/open", "1"); !s.ok()) return s;
  }
  auto r = get(name + "/open", deadline);
  if (!r.ok()) {
    return {r.status().kind(), fmt::format("barrier '{}': {} of {} participants arrived before the deadline ({})",
                                           name, n.value(), count, r.status().message())};
  }
  return Status::Ok();
}

}  // namespace fastgather
