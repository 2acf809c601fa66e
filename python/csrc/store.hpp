// torch's rendezvous store, as the library's Store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>
#include <vector>

#include "common.hpp"

namespace fastgather_torch {

class C10dStore : public fg::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  fg::Status set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      return fg::Status::Ok();
    } catch (const std::exception& e) {
      return {fg::ErrorKind::kSystem, std::string("torch store: ") + e.what()};
    }
  }

  fg::Result<std::string> get(const std::string& key, Clock::time_point deadline) override {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      store_->wait({key}, std::max(left, std::chrono::milliseconds(1)));
      const std::vector<uint8_t> v = store_->get(key);
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return fg::Status{fg::ErrorKind::kTimeout, "torch store: waiting for key '" + key + "': " + e.what()};
    }
  }

  fg::Result<int64_t> add(const std::string& key, int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const std::exception& e) {
      return fg::Status{fg::ErrorKind::kSystem, std::string("torch store: ") + e.what()};
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace fastgather_torch
