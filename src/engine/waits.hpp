// What an operation can co_await: a member's post of a step (any channel), a UCX
// receive, the completion of its UCX sends. Each is a Waiter the driver
// handles; when the awaited thing is already there, nothing suspends.
#pragma once

#include <algorithm>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "engine/driver.hpp"
#include "transport/channel.hpp"
#include "transport/net_channel.hpp"
#include "transport/shm_channel.hpp"
#include "transport/shm_mail.hpp"

namespace fastgather::engine {

// co_await arrival(channel, member, step): Ok once member has posted `step`
// (channel.header()/bytes() then read it), or the channel's error.
class Arrival final : public Waiter {
 public:
  Arrival(transport::Channel& ch, int member, uint64_t step) : ch_(ch), member_(member), step_(step) {}
  bool await_ready() {
    if (ch_.arrived(member_, step_)) return true;
    error = ch_.broken();
    return !error.ok();
  }
  Status await_resume() { return error; }

  bool ready() override { return ch_.arrived(member_, step_); }
  Status check() override { return ch_.check(member_); }
  Status timed_out(std::chrono::milliseconds t) override { return ch_.timed_out(member_, step_, t); }
  Status fail(const Status& why) override {
    ch_.abort(why);
    return ch_.broken();
  }
  void sleep(std::chrono::nanoseconds slice) override { ch_.sleep(member_, step_, slice); }
  bool comes_from_cpu(int cpu) override { return ch_.member_cpu(member_) == cpu; }

 private:
  transport::Channel& ch_;
  int member_;
  uint64_t step_;
};
inline Arrival arrival(transport::Channel& ch, int member, uint64_t step) { return {ch, member, step}; }

// co_await sent(channel): every post's bytes have left this member's memory
// (Channel::sent; at once where peers read them in place).
class Sent final : public Waiter {
 public:
  explicit Sent(transport::Channel& ch) : ch_(ch) {}
  bool await_ready() {
    error = ch_.broken();
    return !error.ok() || ch_.sent();
  }
  Status await_resume() { return error; }

  bool ready() override { return ch_.sent(); }
  Status check() override { return ch_.check(ch_.me()); }
  Status timed_out(std::chrono::milliseconds t) override { return ch_.timed_out(ch_.me(), ch_.last_step(), t); }
  Status fail(const Status& why) override {
    ch_.abort(why);
    return ch_.broken();
  }
  void sleep(std::chrono::nanoseconds slice) override { ch_.sleep(ch_.me(), ch_.last_step(), slice); }

 private:
  transport::Channel& ch_;
};
inline Sent sent(transport::Channel& ch) { return Sent(ch); }

// co_await verdict(channel, member): whether member could read every peer
// by single copy, once it has said so (the probe when a group is made).
class Verdict final : public Waiter {
 public:
  Verdict(transport::ShmChannel& ch, int member) : ch_(ch), member_(member) {}
  bool await_ready() {
    if (ch_.verdict(member_)) return true;
    error = ch_.broken();
    return !error.ok();
  }
  Result<bool> await_resume() {
    if (!error.ok()) return error;
    return *ch_.verdict(member_);
  }

  bool ready() override { return ch_.verdict(member_).has_value(); }
  Status check() override { return ch_.check(member_); }
  Status timed_out(std::chrono::milliseconds t) override {
    const int who = ch_.world_rank(member_);
    return {ErrorKind::kTimeout,
            fmt::format("{}: rank {} did not finish probing single copy within {} ms", ch_.label(), who, t.count()), who};
  }
  Status fail(const Status& why) override {
    ch_.abort(why);
    return ch_.broken();
  }
  void sleep(std::chrono::nanoseconds slice) override { ch_.sleep_for_verdict(member_, slice); }

 private:
  transport::ShmChannel& ch_;
  int member_;
};
inline Verdict verdict(transport::ShmChannel& ch, int member) { return {ch, member}; }

// Shared by the two UCX waits.
class NetWait : public Waiter {
 public:
  NetWait(transport::NetChannel& net, const char* what) : net_(net), what_(what) {}
  bool await_ready() {
    error = net_.broken();
    return !error.ok() || ready();
  }
  Status check() override { return net_.check(what_, lost_since_); }
  Status timed_out(std::chrono::milliseconds t) override { return net_.timed_out(what_, t); }
  Status fail(const Status& why) override {
    net_.fail(why);
    return net_.broken();
  }
  void sleep(std::chrono::nanoseconds slice) override { net_.sleep(slice); }

 protected:
  transport::NetChannel& net_;
  const char* what_;
  std::optional<Clock::time_point> lost_since_;
};

// co_await any_receive(net): the next receive that completed.
class AnyReceive final : public NetWait {
 public:
  explicit AnyReceive(transport::NetChannel& net) : NetWait(net, "receiving") {}
  Result<transport::NetChannel::Completion> await_resume() {
    if (!error.ok()) return error;
    return *got_;
  }
  // Idempotent: a completion, once taken from the channel, is kept until
  // the coroutine resumes (the driver may ask again before it resumes).
  bool ready() override {
    if (!got_) got_ = net_.poll_receive();
    return got_.has_value();
  }

 private:
  std::optional<transport::NetChannel::Completion> got_;
};
inline AnyReceive any_receive(transport::NetChannel& net) { return AnyReceive(net); }

// co_await sends_done(net): every send posted so far has completed.
class SendsDone final : public NetWait {
 public:
  explicit SendsDone(transport::NetChannel& net) : NetWait(net, "sending") {}
  Status await_resume() { return error; }
  bool ready() override { return net_.poll_sends(); }
};
inline SendsDone sends_done(transport::NetChannel& net) { return SendsDone(net); }

// co_await flushed(net, mark): what NetChannel::start_flush marked has left
// (NetChannel::flushed). Run in the background after a call (nobody
// waits for it but the progress thread): its end, however it comes, leaves
// the group as it is.
class Flushed final : public NetWait {
 public:
  Flushed(transport::NetChannel& net, uint64_t mark) : NetWait(net, "flushing"), mark_(mark) {}
  Status await_resume() { return error; }
  bool ready() override { return net_.flushed(mark_); }
  Status fail(const Status& why) override { return why; }

 private:
  uint64_t mark_;
};
inline Flushed flushed(transport::NetChannel& net, uint64_t mark) { return Flushed(net, mark); }

// co_await message_sent(net, id) / message_received(net, id): a
// point-to-point message over UCX (NetChannel::send_message, recv_message)
// has left / arrived (its length), or its error.
class MessageSent final : public NetWait {
 public:
  MessageSent(transport::NetChannel& net, uint64_t id) : NetWait(net, "sending a message"), id_(id) {}
  Status await_resume() {
    if (!error.ok()) return error;
    return done_.ok() ? Status::Ok() : done_.status();
  }
  bool ready() override {
    if (done_.ok() && done_.value()) return true;
    done_ = net_.message_sent(id_);
    return !done_.ok() || done_.value();
  }

 private:
  uint64_t id_;
  Result<bool> done_{false};
};
inline MessageSent message_sent(transport::NetChannel& net, uint64_t id) { return {net, id}; }

class MessageReceived final : public NetWait {
 public:
  MessageReceived(transport::NetChannel& net, uint64_t id) : NetWait(net, "receiving a message"), id_(id) {}
  Result<size_t> await_resume() {
    if (!error.ok()) return error;
    if (!got_.ok()) return got_.status();
    return *got_.value();
  }
  bool ready() override {
    if (got_.ok() && got_.value().has_value()) return true;
    got_ = net_.message_received(id_);
    return !got_.ok() || got_.value().has_value();
  }

 private:
  uint64_t id_;
  Result<std::optional<size_t>> got_{std::optional<size_t>{}};
};
inline MessageReceived message_received(transport::NetChannel& net, uint64_t id) { return {net, id}; }

// co_await mail_room(mail, to): a slot of this member's mailbox to `to` is
// free for its next chunk (send), or `to` refused the mailbox (the error).
// A wait that fails leaves the group as it is: a send is no collective.
class MailRoom final : public Waiter {
 public:
  // taken > 0: until the receiver has taken this member's chunks up to that
  // count (a single-copy message read), rather than until a slot is free.
  MailRoom(transport::ShmMail& mail, int to, uint64_t taken = 0) : mail_(mail), to_(to), taken_(taken) {}
  bool await_ready() {
    error = mail_.refused(mail_.channel().me(), to_);
    return !error.ok() || there();
  }
  Status await_resume() {
    if (Status r = mail_.refused(mail_.channel().me(), to_); !r.ok() && error.ok()) return r;
    return error;
  }

  bool ready() override { return there() || !mail_.refused(mail_.channel().me(), to_).ok(); }
  Status check() override { return mail_.channel().check(to_); }
  Status timed_out(std::chrono::milliseconds t) override {
    const auto& ch = mail_.channel();
    const int who = ch.world_rank(to_);
    return {ErrorKind::kTimeout,
            fmt::format("{}: rank {} timed out after {} ms sending to rank {}, which took none of the message "
                        "(no recv of it there?)",
                        ch.label(), ch.world_rank(ch.me()), t.count(), who),
            who};
  }
  Status fail(const Status& why) override { return why; }
  void sleep(std::chrono::nanoseconds slice) override {
    mail_.channel().sleep_until(to_, [this] { return ready(); }, slice);
  }
  bool comes_from_cpu(int cpu) override { return mail_.channel().member_cpu(to_) == cpu; }

 private:
  bool there() const { return taken_ == 0 ? mail_.room(to_) : mail_.taken(to_, taken_); }
  transport::ShmMail& mail_;
  int to_;
  uint64_t taken_;
};
inline MailRoom mail_room(transport::ShmMail& mail, int to, uint64_t taken = 0) { return {mail, to, taken}; }

// co_await mail_arrival(mail, from, tag, &from): the next chunk from member
// `from` is there (its header: ShmMail::peek), with this receive owning
// `from`'s mailbox (ShmMail::claim; *claimed says so, for the caller to
// release). With from = -1 (any source), the first member whose next chunk
// starts a message with `tag` and whose mailbox no other receive owns;
// *chosen says which.
class MailArrival final : public Waiter {
 public:
  MailArrival(transport::ShmMail& mail, int from, int64_t tag, bool* claimed, int* chosen)
      : mail_(mail), from_(from), tag_(tag), claimed_(claimed), chosen_(chosen) {}
  bool await_ready() { return ready(); }
  Status await_resume() { return error; }

  bool ready() override {
    if (from_ >= 0) {
      if (!*claimed_) *claimed_ = mail_.claim(from_);
      if (!*claimed_) return false;
      *chosen_ = from_;
      return mail_.peek(from_) != nullptr;
    }
    const int n = mail_.channel().members();
    const int me = mail_.channel().me();
    for (int i = 1; i < n; ++i) {
      const int m = (me + i) % n;
      const transport::ChunkHeader* h = mail_.peek(m);
      // A refused mailbox holds what its receiver would not take: no message for anyone.
      if (h == nullptr || h->offset != 0 || h->tag != tag_ || !mail_.refused(m, me).ok() || !mail_.claim(m)) continue;
      if (mail_.peek(m) == nullptr) {  // cannot be: only the owner takes
        mail_.release(m);
        continue;
      }
      from_ = m;
      *claimed_ = true;
      *chosen_ = m;
      return true;
    }
    return false;
  }
  // A member that sent its messages and left is no error while another
  // may still send one: from any source, only once every peer is gone.
  Status check() override {
    auto& ch = mail_.channel();
    if (from_ >= 0) return ch.check(from_);
    Status first;
    for (int m = 0; m < ch.members(); ++m) {
      if (m == ch.me()) continue;
      Status s = ch.check(m);
      if (s.ok()) return s;
      if (first.ok()) first = std::move(s);
    }
    return first;
  }
  Status timed_out(std::chrono::milliseconds t) override {
    const auto& ch = mail_.channel();
    const int me = ch.world_rank(ch.me());
    if (from_ < 0) {
      return {ErrorKind::kTimeout, fmt::format("{}: rank {} timed out after {} ms receiving from any rank (tag {}): "
                                               "nobody sent it a message",
                                               ch.label(), me, t.count(), tag_)};
    }
    const int who = ch.world_rank(from_);
    return {ErrorKind::kTimeout,
            fmt::format("{}: rank {} timed out after {} ms receiving from rank {} (tag {}): the message did not come",
                        ch.label(), me, t.count(), who, tag_),
            who};
  }
  Status fail(const Status& why) override { return why; }
  void sleep(std::chrono::nanoseconds slice) override {
    auto& ch = mail_.channel();
    if (from_ >= 0) {
      ch.sleep_until(from_, [this] { return ready(); }, slice);
      return;
    }
    // Any source: one futex at a time, in short slices, each member in turn.
    next_ = (next_ + 1) % ch.members();
    if (next_ == ch.me()) next_ = (next_ + 1) % ch.members();
    ch.sleep_until(next_, [this] { return ready(); }, std::min<std::chrono::nanoseconds>(slice, std::chrono::microseconds(200)));
  }
  bool comes_from_cpu(int cpu) override { return from_ >= 0 && mail_.channel().member_cpu(from_) == cpu; }

 private:
  transport::ShmMail& mail_;
  int from_;
  int64_t tag_;
  bool* claimed_;
  int* chosen_;
  int next_ = 0;
};
inline MailArrival mail_arrival(transport::ShmMail& mail, int from, int64_t tag, bool* claimed, int* chosen) {
  return {mail, from, tag, claimed, chosen};
}

// co_await any_source(mail, net, remote, tag, iov, &claimed, &chosen): a
// receive from any source in a group across servers. The first member on
// this server whose next chunk starts a message with `tag` (its mailbox
// then owned, as mail_arrival(mail, -1, ...) does; mail may be null: no
// other member here), or the first member elsewhere (`remote`: their
// NetChannel member indices) whose next message carries the tag's fold
// (NetChannel::recv_any_message: its receive then posted into iov; resumes
// with its id and member). Fails on lost peers as the channel between
// servers does (a group across servers breaks on the first); a wait that
// outlasts the deadline leaves the group as it is (nothing was posted).
class AnySource final : public Waiter {
 public:
  AnySource(transport::ShmMail* mail, transport::NetChannel& net, std::span<const int> remote, int64_t tag,
            std::span<const transport::NetIov> iov, bool* claimed, int* chosen)
      : net_(net), remote_(remote), tag_(tag), iov_(iov) {
    if (mail != nullptr) local_.emplace(*mail, -1, tag, claimed, chosen);
  }
  bool await_ready() {
    error = net_.broken();
    return !error.ok() || ready();
  }
  // The message between servers, once posted; nothing when a mailbox here was chosen.
  Result<std::optional<transport::NetChannel::AnyMessage>> await_resume() {
    if (!error.ok()) return error;
    if (!got_.ok()) return got_.status();
    return got_.value();
  }

  bool ready() override {
    if (!got_.ok() || got_.value().has_value()) return true;
    if (local_ && local_->ready()) return true;
    got_ = net_.recv_any_message(remote_, tag_, iov_);
    return !got_.ok() || got_.value().has_value();
  }
  Status check() override { return net_.check("receiving from any rank", lost_since_); }
  Status timed_out(std::chrono::milliseconds t) override {
    return {ErrorKind::kTimeout,
            fmt::format("{}: rank {} timed out after {} ms receiving from any rank (tag {}): nobody sent it a message",
                        net_.label(), net_.world_rank(net_.me()), t.count(), tag_)};
  }
  Status fail(const Status& why) override { return why; }
  // In short slices, the network's events and the mailboxes' futexes in turn.
  void sleep(std::chrono::nanoseconds slice) override {
    slice = std::min<std::chrono::nanoseconds>(slice, std::chrono::microseconds(200));
    if (local_ && (turn_++ & 1) != 0) {
      local_->sleep(slice);
    } else {
      net_.sleep(slice);
    }
  }

 private:
  transport::NetChannel& net_;
  std::span<const int> remote_;
  int64_t tag_;
  std::span<const transport::NetIov> iov_;
  std::optional<MailArrival> local_;
  Result<std::optional<transport::NetChannel::AnyMessage>> got_{std::optional<transport::NetChannel::AnyMessage>{}};
  std::optional<Clock::time_point> lost_since_;
  unsigned turn_ = 0;
};
inline AnySource any_source(transport::ShmMail* mail, transport::NetChannel& net, std::span<const int> remote,
                            int64_t tag, std::span<const transport::NetIov> iov, bool* claimed, int* chosen) {
  return {mail, net, remote, tag, iov, claimed, chosen};
}

}  // namespace fastgather::engine
