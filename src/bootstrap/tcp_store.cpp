#include "bootstrap/tcp_store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

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

struct TcpStoreServer::State {
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: stop request
  std::string token;
  std::chrono::milliseconds hello_within{10000};
  struct Client {
    std::string in;
    bool greeted = false;
    Clock::time_point since;
    int rank = -1;  // the job rank this connection speaks for, if it said one
  };
  int world = -1;               // set by the first rank's HELLO
  std::map<int, int> joined;    // rank -> connection, while connected
  std::map<int, Client> clients;
  std::map<std::string, std::string> kv;
  std::multimap<std::string, std::pair<int, uint32_t>> waiting;  // key -> (fd, request id) blocked in GET
  std::mutex mu;                            // guards greeted_count for drain()
  int greeted_count = 0;
  int ever_greeted = 0;  // ranks that have joined at any time
  std::string abort_reason;  // set once kJobAbortKey is
  bool any_greeted = false;
  std::atomic<uint64_t> rejected{0};
};

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& addr, int port,
                                                              std::string token,
                                                              std::chrono::milliseconds hello_within) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->state_ = std::make_unique<State>();
  State& st = *s->state_;
  st.token = std::move(token);
  st.hello_within = hello_within;
  auto where = resolve_store_address(addr, port);
  if (!where.ok()) return where.status();
  sockaddr_storage sa = where.value().first;
  socklen_t sa_len = where.value().second;
  st.listen_fd = ::socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (st.listen_fd < 0) return sys_error("store socket");
  int one = 1;
  ::setsockopt(st.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(st.listen_fd, reinterpret_cast<sockaddr*>(&sa), sa_len) != 0 ||
      ::listen(st.listen_fd, 256) != 0) {
    Status e = sys_error(fmt::format("rendezvous store cannot listen on {}:{}", addr, port));
    ::close(st.listen_fd);
    return e;
  }
  socklen_t len = sizeof(sa);
  ::getsockname(st.listen_fd, reinterpret_cast<sockaddr*>(&sa), &len);
  s->port_ = ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  st.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  s->thread_ = std::thread([srv = s.get()] { srv->loop(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  if (!state_) return;
  uint64_t one = 1;
  (void)!::write(state_->wake_fd, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, c] : state_->clients) ::close(fd);
  ::close(state_->listen_fd);
  ::close(state_->wake_fd);
}

uint64_t TcpStoreServer::rejected_connections() const { return state_->rejected.load(); }

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

  std::vector<pollfd> fds;
  std::vector<int> to_drop;
  for (;;) {
    fds.clear();
    fds.push_back({st.wake_fd, POLLIN, 0});
    fds.push_back({st.listen_fd, POLLIN, 0});
    for (auto& [fd, c] : st.clients) fds.push_back({fd, POLLIN, 0});
    int n = ::poll(fds.data(), fds.size(), 500);
    if (n < 0 && errno != EINTR) return;
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      for (;;) {
        int c = ::accept4(st.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        st.clients[c] = State::Client{{}, false, Clock::now()};
      }
    }
    to_drop.clear();
    for (size_t i = 2; i < fds.size(); ++i) {
      int fd = fds[i].fd;
      auto& cl = st.clients[fd];
      if (!cl.greeted && Clock::now() - cl.since > st.hello_within) {  // half-open or silent
        to_drop.push_back(fd);
        continue;
      }
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
      if (r <= 0) {
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        to_drop.push_back(fd);
        continue;
      }
      cl.in.append(buf, static_cast<size_t>(r));
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
          if (req.op != StoreOp::kHello || req.key != st.token) {
            reply(fd, req.id, StoreReply::kError, "rendezvous refused: first frame must be HELLO with this job's token");
            to_drop.push_back(fd);
            break;
          }
          // "rank/world": a second job's rank, or a stale one, must not join this job.
          if (!req.value.empty()) {
            int r = -1, w = -1;
            if (std::sscanf(req.value.c_str(), "%d/%d", &r, &w) != 2 || r < 0 || w < 1 || r >= w) {
              reply(fd, req.id, StoreReply::kError, "rendezvous refused: malformed rank identity '" + req.value + "'");
              to_drop.push_back(fd);
              break;
            }
            std::string why;
            if (st.world >= 0 && w != st.world) {
              why = fmt::format("rendezvous refused: this job has {} ranks, the caller says {} (another job on this port?)",
                                st.world, w);
            } else if (st.joined.count(r) != 0) {
              why = fmt::format("rendezvous refused: rank {} has already joined this job (another job on this port?)", r);
            }
            if (!why.empty()) {
              reply(fd, req.id, StoreReply::kError, why);
              to_drop.push_back(fd);
              break;
            }
            st.world = w;
            st.joined[r] = fd;
            cl.rank = r;
          }
          cl.greeted = true;
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
  return Status{ErrorKind::kTimeout, fmt::format("no rendezvous store answered at {}:{} ({})", addr, port,
                                                 std::strerror(last_errno))};
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
    if (left <= 0) {
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
