// Runs the parasol executable (PARASOL_BIN, set by tests/tools/CMakeLists.txt) as a user would
// and returns its exit code and output, for the command-line tests of tests/tools/.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace parasol::testing_cli {

struct Result {
  int code;         // the exit status, -1 when the process did not exit normally
  std::string out;  // stdout and stderr together
};

// Runs a whole shell command line (e.g. with `env VAR=1` before the executable).
inline Result run_command(const std::string& command) {
  std::string cmd = command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline Result run(const std::string& args) {
  return run_command(std::string(PARASOL_BIN) + " " + args);
}

}  // namespace parasol::testing_cli
