// parasol's errors, in three kinds, each with its exit code on the command line:
// - a user error (Error): bad input; names the offending field and the reason; exit 2.
// - an internal error (InternalError, raised by PARASOL_CHECK behind a REQUIRES contract): a broken
//   invariant of parasol itself; names the check and its place; exit 1, "this is a parasol bug".
// - a system fault (SystemError): a CUDA, NCCL, MPI or I/O call that failed; names the call;
//   exit 1.
// All three derive from Error, so that the runtime's cross-rank agreement (every rank throws when
// one does) carries any of them; code that treats a failure as the user's (search's refused
// plans, the exit code) asks kind().
#pragma once

#include <stdexcept>
#include <string>

namespace parasol {

enum class ErrorKind { kUser, kInternal, kSystem };

class Error : public std::runtime_error {
 public:
  // field: a dotted path such as "plan.tp" or "cluster.links[3].bw_GBps"; may be empty.
  Error(std::string field, std::string reason, ErrorKind kind = ErrorKind::kUser);

  const std::string& field() const { return field_; }
  const std::string& reason() const { return reason_; }
  ErrorKind kind() const { return kind_; }
  bool is_user_error() const { return kind_ == ErrorKind::kUser; }

 private:
  std::string field_;
  std::string reason_;
  ErrorKind kind_;
};

// A broken invariant of parasol (a bug), as PARASOL_CHECK raises it. what(): "internal error
// (this is a parasol bug): <where>: check `<condition>` failed: <message>".
class InternalError : public Error {
 public:
  InternalError(std::string where, std::string reason);
};

// A failed system call: CUDA, NCCL, MPI, a file that cannot be written. `call` names it.
class SystemError : public Error {
 public:
  SystemError(std::string call, std::string reason);
};

// The exit code of the command line for an error of `kind`: 2 for the user's, 1 otherwise.
int exit_code(ErrorKind kind);

// The line the command line prints for `e`, with the kind's prefix ("error: ", "internal error
// (this is a parasol bug): ", "system error: ").
std::string error_line(const Error& e);

[[noreturn]] void check_failed(const char* condition, const std::string& message, const char* file,
                               int line);

}  // namespace parasol

// PARASOL_CHECK(condition, message): the check behind a REQUIRES contract. When the condition is
// false, throws InternalError naming the condition, the message, and the file and line.
#define PARASOL_CHECK(condition, message)                                 \
  do {                                                                    \
    if (!(condition)) [[unlikely]]                                        \
      ::parasol::check_failed(#condition, (message), __FILE__, __LINE__); \
  } while (0)
