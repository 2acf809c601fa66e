// The engine's coroutines. A collective is written as straight-line code
// that co_awaits what it needs (a peer's post, a UCX completion); the driver
// (driver.hpp) resumes it when that has happened, so one piece of code
// serves the blocking call, test() and wait().
//
// Task<T> is lazy: nothing runs until it is awaited or handed to a driver.
// Awaiting a task from another transfers control to it directly (symmetric
// transfer: no stack growth over many steps), and it resumes its awaiter when
// it returns. Frames come from a per-thread free list, so a call allocates
// nothing once warm.
#pragma once

#include <coroutine>
#include <cstddef>
#include <exception>
#include <optional>
#include <utility>

namespace fastgather::engine {

class Driver;

// Frame memory: a free list per size class and thread.
void* frame_alloc(size_t bytes);
void frame_free(void* p, size_t bytes) noexcept;

struct PromiseBase {
  Driver* driver = nullptr;               // the operation this coroutine belongs to
  std::coroutine_handle<> continuation;  // who awaits it (null: the driver)
  std::exception_ptr error;

  static void* operator new(size_t bytes) { return frame_alloc(bytes); }
  static void operator delete(void* p, size_t bytes) noexcept { frame_free(p, bytes); }
  std::suspend_always initial_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { error = std::current_exception(); }

  struct Final {
    bool await_ready() noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto next = h.promise().continuation;
      return next ? next : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
};

template <class T>
class [[nodiscard]] Task {
 public:
  struct promise_type : PromiseBase {
    std::optional<T> value;
    Task get_return_object() { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
    template <class U>
    void return_value(U&& v) {
      value.emplace(std::forward<U>(v));
    }
  };
  using Handle = std::coroutine_handle<promise_type>;

  Task() = default;
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~Task() { reset(); }

  // Awaited from another task: runs in the same operation.
  bool await_ready() const noexcept { return false; }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> parent) noexcept {
    h_.promise().driver = parent.promise().driver;
    h_.promise().continuation = parent;
    return h_;
  }
  T await_resume() { return take(); }

  // For the driver.
  Handle handle() const { return h_; }
  bool done() const { return !h_ || h_.done(); }
  T take() {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    return std::move(*h_.promise().value);
  }

 private:
  explicit Task(Handle h) : h_(h) {}
  void reset() {
    if (h_) h_.destroy();
    h_ = {};
  }
  Handle h_;
};

}  // namespace fastgather::engine
