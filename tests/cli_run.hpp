// Test helper: runs the relpos command line as a user does and captures its output and status.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace relpos::test {

struct CliRun {
  int status = -1;   // exit status (-1: killed by a signal)
  std::string out;   // stdout and stderr together unless stdout_only
};

// env: "NAME=value ..." set for this run only.
inline CliRun run_cli(const std::string& args, bool stdout_only = false, const std::string& env = "") {
  const std::string cmd = (env.empty() ? std::string() : "env " + env + " ") + std::string(RELPOS_CLI_PATH) + " " + args +
                          (stdout_only ? " 2>/dev/null" : " 2>&1");
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace relpos::test
