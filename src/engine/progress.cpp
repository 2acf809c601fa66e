#include "engine/progress.hpp"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace fastgather::engine {

// ------------------------------------------------------------ Completions

// Threads are detached and hold the state, so that a function that drops
// the last reference to whatever owns the Completions (a torch group
// released in a Future callback) does not pull the state from under them.
struct Completions::State {
  std::mutex mu;
  std::condition_variable work_cv;    // something was posted, or stop
  std::condition_variable exited_cv;  // a thread left
  std::deque<std::function<void()>> work;
  int threads = 0;  // alive
  int idle = 0;     // waiting in work_cv
  bool stop = false;
};

namespace {

thread_local const Completions::State* tls_completion_state = nullptr;

void run_guarded(std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    // A callback's exception has nobody to go to (torch's futures take
    // theirs into the future); the thread goes on.
  }
}

void completion_thread(std::shared_ptr<Completions::State> st) {
  pthread_setname_np(pthread_self(), "fg-complete");  // as top -H, gdb and /proc/PID/task/*/comm show it
  tls_completion_state = st.get();
  std::unique_lock<std::mutex> lk(st->mu);
  for (;;) {
    if (!st->work.empty()) {
      std::function<void()> fn = std::move(st->work.front());
      st->work.pop_front();
      lk.unlock();
      run_guarded(fn);
      fn = nullptr;  // what it holds goes outside the lock
      lk.lock();
      continue;
    }
    if (st->stop) break;
    ++st->idle;
    const bool woken = st->work_cv.wait_for(lk, Completions::kIdle, [&] { return st->stop || !st->work.empty(); });
    --st->idle;
    if (!woken) break;  // idle for kIdle: leave (a post starts another)
  }
  --st->threads;
  st->exited_cv.notify_all();
}

}  // namespace

Completions::Completions() : st_(std::make_shared<State>()) {}

Completions::~Completions() { shutdown(); }

void Completions::post(std::function<void()> fn) {
  std::unique_lock<std::mutex> lk(st_->mu);
  if (st_->stop) {
    // After shutdown (a request's owner asking for its callback once the
    // communicator is gone): a thread of its own all the same, never the
    // caller's, which may hold what the callback takes.
    lk.unlock();
    std::thread([fn = std::move(fn)]() mutable { run_guarded(fn); }).detach();
    return;
  }
  st_->work.push_back(std::move(fn));
  // Each queued function needs a thread of its own that is free: an idle
  // one, woken, or a new one. A function may block until a later one has
  // run (a callback waiting on another request's future), so none waits
  // behind a busy thread while threads may still be started.
  if (static_cast<int>(st_->work.size()) > st_->idle && st_->threads < kMaxThreads) {
    ++st_->threads;
    std::thread(completion_thread, st_).detach();
  } else {
    st_->work_cv.notify_one();
  }
}

void Completions::shutdown() {
  std::unique_lock<std::mutex> lk(st_->mu);
  st_->stop = true;
  st_->work_cv.notify_all();
  // Called from one of the threads (a callback that ends the owner): that
  // one is left to finish on its own, and runs what it would have waited for.
  const int self = tls_completion_state == st_.get() ? 1 : 0;
  for (;;) {
    if (!st_->work.empty() && (self == 1 || st_->threads == 0)) {
      std::function<void()> fn = std::move(st_->work.front());
      st_->work.pop_front();
      lk.unlock();
      run_guarded(fn);
      fn = nullptr;
      lk.lock();
      continue;
    }
    if (st_->threads <= self && st_->work.empty()) break;
    st_->exited_cv.wait(lk);
  }
}

// --------------------------------------------------------------- Progress

namespace {

struct Entry {
  std::shared_ptr<Driver> op;
  Queue* queue = nullptr;
  Completion done;
  Clock::time_point since;
};

}  // namespace

struct Progress::State {
  std::mutex mu;
  std::condition_variable cv;       // the thread's sleep: a watch into an empty list, a completion, stop
  std::condition_variable let_go;   // the thread no longer drives `busy`
  std::deque<Entry> entries;        // oldest first
  Queue* busy = nullptr;            // the queue the thread drives (without mu)
  bool asleep = false;              // waiting with nothing to watch
  bool poked = false;               // a watched operation with a callback completed
  bool stop = false;
  bool started = false;
  std::thread thread;
  std::thread::id thread_id;
  Completions completions;

  // Under mu: takes the callbacks of completed entries and drops the
  // entries (in order: one queue's operations complete in the order they
  // were started). The caller posts them once it has let go of mu.
  std::vector<std::function<void()>> take_completed() {
    std::vector<std::function<void()>> ready;
    for (auto it = entries.begin(); it != entries.end();) {
      if (!it->op->done()) {
        ++it;
        continue;
      }
      if (it->done) ready.push_back(call(std::move(it->done), it->op));
      it = entries.erase(it);
    }
    return ready;
  }
  static std::function<void()> call(Completion done, std::shared_ptr<Driver> op) {
    return [done = std::move(done), op = std::move(op)] { done(op->result()); };
  }
  // Never run here: this thread drives, and a callback may wait for what
  // only driving completes.
  void post(std::vector<std::function<void()>>& ready) {
    for (auto& f : ready) completions.post(std::move(f));
    ready.clear();
  }
  void loop();
};

void Progress::State::loop() {
  pthread_setname_np(pthread_self(), "fg-progress");
  std::unique_lock<std::mutex> lk(mu);
  // How long an owner is left with its request: kGrace, doubled up to
  // kMaxGrace each time the thread looks and finds the owners keeping up
  // (each look preempts a rank on a busy host), back to kGrace once it had
  // to drive one.
  Clock::duration grace = kGrace;
  auto last_busy = Clock::now();
  while (!stop) {
    poked = false;  // a completion while the callbacks are posted pokes again
    if (auto ready = take_completed(); !ready.empty()) {
      lk.unlock();
      post(ready);
      lk.lock();
    }
    const auto now = Clock::now();
    if (entries.empty()) {
      if (now - last_busy < kLinger) {
        // Recently busy: a look every grace, so that a watch need not wake it.
        cv.wait_for(lk, grace, [&] { return stop || poked; });
      } else {
        asleep = true;  // until a watch wakes it
        cv.wait(lk, [&] { return stop || poked || !entries.empty(); });
        asleep = false;
      }
      continue;
    }
    last_busy = now;
    // The oldest incomplete one: its owner may still come back for it.
    const Entry& e = entries.front();
    if (now < e.since + grace) {
      grace = std::min<Clock::duration>(2 * grace, kMaxGrace);
      cv.wait_until(lk, e.since + grace, [&] { return stop || poked; });
      continue;
    }
    std::shared_ptr<Driver> op = e.op;
    Queue* q = e.queue;
    busy = q;
    lk.unlock();
    const bool drove = q->lend_a_hand(*op, Clock::now() + kSlice);
    lk.lock();
    busy = nullptr;
    let_go.notify_all();
    if (!drove) {
      // Another thread drives the group (its owner waits through a long
      // call): it completes the operation, or lets go of it. The owner keeps
      // up: look again a grace later.
      grace = std::min<Clock::duration>(2 * grace, kMaxGrace);
      if (!op->done()) cv.wait_for(lk, grace, [&] { return stop || poked; });
      continue;
    }
    grace = kGrace;  // it had to drive one: owners may leave the next too
    if (!op->done()) {
      lk.unlock();
      std::this_thread::yield();  // a word to an owner that may be coming back
      lk.lock();
    }
  }
}

Progress::Progress() : st_(std::make_shared<State>()) {}

Progress::~Progress() { shutdown(); }

void Progress::watch(const std::shared_ptr<Driver>& op, Queue* queue, Completion done) {
  std::unique_lock<std::mutex> lk(st_->mu);
  if (st_->stop) {  // the communicator is finalized: its queues were drained
    lk.unlock();
    if (done) st_->completions.post(State::call(std::move(done), op));
    return;
  }
  // Owners that wait complete their requests themselves: what they completed
  // leaves the list here, so that it stays short between the thread's looks.
  auto& entries = st_->entries;
  while (!entries.empty() && !entries.front().done && entries.front().op->done()) entries.pop_front();
  // A callback for a request already watched joins its entry (the only case
  // that looks through the list).
  auto it = done ? std::find_if(entries.rbegin(), entries.rend(), [&](const Entry& e) { return e.op == op; })
                 : entries.rend();
  if (it == entries.rend()) {
    entries.push_back(Entry{op, queue, nullptr, Clock::now()});
    it = entries.rbegin();
  }
  if (done) {
    if (it->done) {
      it->done = [first = std::move(it->done), then = std::move(done)](const Status& s) {
        first(s);
        then(s);
      };
    } else {
      it->done = std::move(done);
    }
    op->watched_by(this);
    // It may have completed before it was watched (Driver::finish saw no
    // watcher): the thread posts it at once.
    if (op->done()) st_->poked = true;
  }
  if (!st_->started) {
    st_->started = true;
    st_->thread = std::thread([st = st_] { st->loop(); });
    st_->thread_id = st_->thread.get_id();
  } else if (st_->asleep || st_->poked) {
    st_->cv.notify_one();
  }
}

void Progress::completed() {
  std::lock_guard<std::mutex> lk(st_->mu);
  st_->poked = true;
  st_->cv.notify_one();
}

void Progress::forget(Queue* queue) {
  std::unique_lock<std::mutex> lk(st_->mu);
  st_->let_go.wait(lk, [&] { return st_->busy != queue; });
  for (auto it = st_->entries.begin(); it != st_->entries.end();) {
    if (it->queue != queue) {
      ++it;
      continue;
    }
    it->op->watched_by(nullptr);
    if (it->done) {
      if (it->op->done()) {
        st_->completions.post(State::call(std::move(it->done), it->op));
      } else {
        st_->completions.post([done = std::move(it->done)] {
          done(Status{ErrorKind::kAborted, "the group was destroyed before the request completed"});
        });
      }
    }
    it = st_->entries.erase(it);
  }
}

void Progress::shutdown() {
  std::unique_lock<std::mutex> lk(st_->mu);
  if (st_->stop) return;
  st_->stop = true;
  st_->cv.notify_all();
  if (st_->started) {
    lk.unlock();
    if (st_->thread_id == std::this_thread::get_id()) {
      st_->thread.detach();
    } else {
      st_->thread.join();
    }
    lk.lock();
  }
  std::deque<Entry> left = std::move(st_->entries);
  st_->entries.clear();
  lk.unlock();
  for (Entry& e : left) {
    e.op->watched_by(nullptr);
    if (!e.done) continue;
    if (e.op->done()) {
      st_->completions.post(State::call(std::move(e.done), e.op));
    } else {
      st_->completions.post([done = std::move(e.done)] {
        done(Status{ErrorKind::kAborted, "the communicator was finalized before the request completed"});
      });
    }
  }
  st_->completions.shutdown();
}

}  // namespace fastgather::engine
