// src/base: what every layer may use (it includes nothing of ours).
//
// Every environment variable fastgather reads, in one table: name, range,
// default and meaning. Values are whole decimal numbers (digits only, no
// sign, no spaces, no suffixes) or one of a listed set of words; anything
// else is an error that names the variable and what it accepts.
// Communicator::create and the launcher check the whole table before doing
// anything, and every layer reads its variables through env_count/env_word/
// env_flag, so what is read is what was checked.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "fastgather/status.hpp"

namespace fastgather::base {

struct EnvVar {
  const char* name;
  enum class Kind { kCount, kWord, kText, kFlag } kind;  // kFlag: set and non-empty = on
  uint64_t min = 0, max = 0;  // kCount: inclusive range
  const char* words = "";     // kWord: accepted values, separated by '|'
  const char* fallback = "";  // what applies when unset, in words
  const char* doc = "";
};

std::span<const EnvVar> env_table();
const EnvVar* find_env(const char* name);

// The variable's value if set and non-empty; an error naming it if the value
// is not accepted.
Result<std::optional<uint64_t>> env_count(const char* name);
Result<std::optional<std::string>> env_word(const char* name);
// A kCount read where its error was already reported by check_environment():
// the value, or `fallback` when unset or invalid.
uint64_t env_count_or(const char* name, uint64_t fallback);
bool env_flag(const char* name);
// A kText variable of the table, as it is (nullopt: unset, or set but empty
// unless empty_counts). Every variable the project reads is read through
// these functions, so this file is where `getenv` is.
std::optional<std::string> env_text(const char* name, bool empty_counts = false);
// The table as text, one variable a line (fg-bench --help-env).
std::string describe_environment();
// Checks every variable of the table that is set.
Status check_environment();

// Strict decimal parse of a count in [min, max]; `what` names the source in
// the error ("environment variable TP", "--m").
Result<uint64_t> parse_count(const std::string& text, uint64_t min, uint64_t max, const std::string& what);

}  // namespace fastgather::base
