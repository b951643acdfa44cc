// The one error type of parasol: a user error that names the offending field and the reason.
// The command line prints what() and exits with code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace parasol {

class Error : public std::runtime_error {
 public:
  // field: a dotted path such as "plan.tp" or "cluster.links[3].bw_GBps"; may be empty.
  Error(std::string field, std::string reason);

  const std::string& field() const { return field_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string field_;
  std::string reason_;
};

}  // namespace parasol
