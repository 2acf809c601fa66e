// What an operation can co_await: a member's post of a step (any channel), a UCX
// receive, the completion of its UCX sends. Each is a Waiter the driver
// handles; when the awaited thing is already there, nothing suspends.
#pragma once

#include <optional>

#include <fmt/format.h>

#include "engine/driver.hpp"
#include "transport/channel.hpp"
#include "transport/net_channel.hpp"
#include "transport/shm_channel.hpp"

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

}  // namespace fastgather::engine
