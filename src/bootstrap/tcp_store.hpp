// Out-of-band rendezvous: a small key-value store over TCP, hosted by world
// rank 0, used only while ranks meet (never for collective data).
//
// Frame: u32 length (of what follows, at most kMaxFrame), u8 op, u32 request
// id (echoed by the reply: u32 length, u8 status, u32 id, payload), payload.
// Strings are u32 length + bytes. The first frame of a connection must be
// HELLO carrying the job token and the caller's "rank/world"; anything
// malformed closes that connection and nothing else.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <sys/types.h>
#include <string_view>
#include <thread>
#include <vector>

#include "fastgather/config.hpp"
#include "fastgather/status.hpp"
#include "fastgather/store.hpp"

namespace fastgather::bootstrap {

// A Status as a store value ("<kind>\n<message>") and back (nullopt for a
// value that is not one): how ranks tell each other why they failed.
std::string encode_status(const Status& s);
std::optional<Status> decode_status(std::string_view value);

// A rank that gives up on the whole job sets this key to its reason; from
// then on a GET of a missing key, waiting or new, fails at once with
// kJobAbortedPrefix + the reason, with the kind of the failure.
inline constexpr const char* kJobAbortKey = "job/abort";
inline constexpr const char* kJobAbortedPrefix = "job aborted: ";
// The value a rank writes: encode_status of its failure, as "rank N: ...".
std::string job_abort_value(const Status& why, int rank);


using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxFrame = 1u << 20;
constexpr size_t kMaxKey = 1024;
static_assert(kMaxKey >= kMaxTokenBytes, "a HELLO carries the token as its key");

enum class StoreOp : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kBye = 5 };
enum class StoreReply : uint8_t { kOk = 0, kError = 1 };

// Parses one request from buf. Returns the frame's size if a whole valid
// frame is there, 0 if more bytes are needed, and -1 if the bytes can never
// become a valid frame. Kept apart from the sockets so it can be fuzzed.
struct StoreRequest {
  StoreOp op{};
  uint32_t id = 0;    // echoed in the reply
  std::string key;    // token for HELLO
  std::string value;  // SET; "rank/world" for HELLO
  int64_t delta = 0;  // ADD
};
int64_t parse_store_request(std::string_view buf, StoreRequest* out);
std::string encode_store_request(const StoreRequest& req);

// The user owning the socket at the other end of the TCP connection fd, when
// that socket is on this host (in this network namespace); nullopt when not,
// or when the kernel's socket table cannot be read.
std::optional<uid_t> peer_uid_on_this_host(int fd);

// Who may join. A connection must open with a HELLO of at most kMaxHello
// bytes within hello_within; until then it is a stranger, and strangers are
// bounded in number (kMaxStrangers; more wait in the kernel's backlog) and
// in the memory each holds (its HELLO), whatever they send. Once `world`
// ranks have said who they are, the job is complete and every new HELLO is
// refused.
struct StoreAdmission {
  std::string token;  // every HELLO must carry it ("" admits any token-less caller)
  // A connection whose socket the kernel finds on this host (in this network
  // namespace) must belong to this process's user, so that a token that
  // leaked does not let another local user in. Connections from other hosts
  // (not in this host's socket table) are admitted by the token alone.
  bool refuse_other_users = true;
  std::chrono::milliseconds hello_within{3000};
};
constexpr int kMaxStoreRanks = 1 << 20;
constexpr size_t kMaxHello = 4 + 5 + 2 * (4 + kMaxKey);
constexpr size_t kMaxStrangers = 128;

// A listening TCP socket on addr:port (port 0: one the kernel picks; see
// bound_port), as the store listens.
Result<int> listen_on(const std::string& addr, int port);
int bound_port(int listen_fd);

class TcpStoreServer {
 public:
  // Listens on addr:port (port 0 picks one; see port()), or on a copy of
  // listen_fd when one is given (a spawner's socket; see Config).
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& addr, int port, StoreAdmission admission,
                                                       int listen_fd = -1);
  ~TcpStoreServer();
  int port() const { return port_; }
  // Waits until `joined` ranks have said HELLO at some time and every one of
  // them has closed again, or until deadline. joined > 0: when rank 0 fails
  // during start-up, the ranks still on their way find the store and read why.
  void drain(Clock::time_point deadline, int joined = 0);
  uint64_t rejected_connections() const;
  // Bytes held for connections that have not said HELLO (what a stranger
  // can make this process keep).
  size_t stranger_bytes() const;
  // Servers of this process whose thread is running: a process that forks
  // must know (see fgtest::run_job and docs/reliability.md).
  static int running();

 private:
  TcpStoreServer() = default;
  void loop();
  struct State;
  std::unique_ptr<State> state_;
  std::thread thread_;
  int port_ = 0;
};

class TcpStoreClient : public Store {
 public:
  // Retries refused connections (rank 0 may not listen yet) until deadline.
  // identity "rank/world" lets the store refuse a rank that already joined
  // or a rank of a job of another size; "" connects anonymously.
  static Result<std::unique_ptr<TcpStoreClient>> connect(const std::string& addr, int port,
                                                         const std::string& token,
                                                         Clock::time_point deadline,
                                                         const std::string& identity = "");
  ~TcpStoreClient() override;

  Status set(const std::string& key, const std::string& value) override;
  // Blocks until key exists or deadline passes.
  Result<std::string> get(const std::string& key, Clock::time_point deadline) override;
  Result<int64_t> add(const std::string& key, int64_t delta) override;

 private:
  explicit TcpStoreClient(int fd) : fd_(fd) {}
  Result<std::string> call(StoreRequest req, Clock::time_point deadline);
  int fd_ = -1;
  std::string peer_;
  std::string in_;  // bytes received and not yet consumed
  uint32_t next_id_ = 0;
};

}  // namespace fastgather::bootstrap
