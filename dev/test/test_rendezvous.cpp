// Tests llmc/rendezvous.h: several forked processes meet through a directory and through TCP on
// localhost and all receive rank 0's bytes; a file left by an earlier run token is ignored and a
// file of the same token is refused; a missing peer or rank 0 times out with a clear error; the
// rank layout comes from flags or Slurm's variables. Files go to build/test_tmp/rendezvous/.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/rendezvous.h"

using llmc::Launch;
using llmc::LaunchFlags;
using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kDir = "build/test_tmp/rendezvous";
constexpr int kWorld = 4;

std::vector<unsigned char> test_id(unsigned char seed) {
  std::vector<unsigned char> id(llmc::kRendezvousIdBytes);
  for (size_t i = 0; i < id.size(); i++) id[i] = (unsigned char)(seed + 7 * i);
  return id;
}

Launch launch_of(int rank, int world, const std::string& token) {
  Launch l;
  l.rank = rank;
  l.world = world;
  l.token = token;
  return l;
}

// Forks one process per rank; each runs the rendezvous and exits 0 when it holds `expected`
// (rank 0 passes it in). Returns how many processes succeeded.
int run_ranks(const std::string& spec_text, const std::string& token,
              const std::vector<unsigned char>& expected, double timeout_s) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kWorld; rank++) {
    const pid_t pid = fork();
    if (pid == 0) {
      try {
        std::vector<unsigned char> id = rank == 0 ? expected : std::vector<unsigned char>(expected.size());
        llmc::rendezvous_exchange(llmc::parse_rendezvous(spec_text), launch_of(rank, kWorld, token),
                                  id.data(), timeout_s);
        _exit(id == expected ? 0 : 2);
      } catch (const llmc::Error& e) {
        fprintf(stderr, "rank %d: %s\n", rank, e.what());
        _exit(1);
      }
    }
    pids.push_back(pid);
  }
  int ok = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// A TCP port that was free a moment ago.
int free_port() {
  llmc::Socket s(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s.fd(), (sockaddr*)&addr, sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(s.fd(), (sockaddr*)&addr, &len);
  return ntohs(addr.sin_port);
}

void test_fs() {
  const std::string dir = kDir + "/fs";
  system(("rm -rf " + dir).c_str());
  llmc::make_dirs(dir);
  // A file of an earlier launch, under its own token: must not be picked up.
  const std::vector<unsigned char> stale = test_id(99);
  llmc::rendezvous_fs_publish(dir, launch_of(0, kWorld, "run-1"), stale.data());
  const std::vector<unsigned char> fresh = test_id(1);
  check_verbose(run_ranks("fs:" + dir, "run-2", fresh, 10.0) == kWorld,
                "fs: 4 processes all receive rank 0's id, not the stale one of token run-1");
  // run-2's file stays until rank 0 removes it (the trainer does, once NCCL has every rank).
  check_throws([&] { llmc::rendezvous_fs_publish(dir, launch_of(0, kWorld, "run-2"), fresh.data()); },
               "left from an earlier launch", "fs: rank 0 refuses a token whose file exists");
  llmc::rendezvous_fs_remove(dir, launch_of(0, kWorld, "run-2"));
  check(!llmc::file_exists(llmc::rendezvous_fs_path(dir, "run-2")), "fs: rank 0 removes its file");
  std::vector<unsigned char> got(llmc::kRendezvousIdBytes);
  const auto start = std::chrono::steady_clock::now();
  check_throws([&] { llmc::rendezvous_fs_receive(dir, launch_of(1, kWorld, "run-3"), got.data(), 0.5); },
               "found no", "fs: no rank 0 -> timeout error");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check_verbose(waited >= 0.5 && waited < 2.0, llmc::strformat("fs: the timeout of 0.5 s took %.2f s", waited));
  // A file of the right token but another process count (e.g. a reused token).
  llmc::rendezvous_fs_publish(dir, launch_of(0, 2, "run-4"), fresh.data());
  check_throws([&] { llmc::rendezvous_fs_receive(dir, launch_of(1, kWorld, "run-4"), got.data(), 1.0); },
               "2 processes, this launch has 4", "fs: a file for another process count is refused");
}

void test_tcp() {
  const std::vector<unsigned char> id = test_id(5);
  const int port = free_port();
  check_verbose(run_ranks(llmc::strformat("tcp:localhost:%d", port), "tcp-1", id, 10.0) == kWorld,
                llmc::strformat("tcp: 4 processes on port %d all receive rank 0's id", port));
  // Rank 0 of another launch (token tcp-old) is listening: a peer of tcp-new must not take its id.
  const int port2 = free_port();
  const pid_t server = fork();
  if (server == 0) {
    try {
      llmc::rendezvous_tcp_serve(port2, launch_of(0, 2, "tcp-old"), id.data(), 3.0);
    } catch (const llmc::Error&) {
    }
    _exit(0);
  }
  std::vector<unsigned char> got(llmc::kRendezvousIdBytes);
  check_throws([&] { llmc::rendezvous_tcp_receive("127.0.0.1", port2, launch_of(1, 2, "tcp-new"), got.data(), 3.0); },
               "another launch", "tcp: rank 0 with another token refuses the peer");
  waitpid(server, nullptr, 0);
  const auto start = std::chrono::steady_clock::now();
  check_throws([&] { llmc::rendezvous_tcp_serve(free_port(), launch_of(0, 3, "tcp-2"), id.data(), 0.5); },
               "only 0 of the 2 other ranks", "tcp: missing peers -> timeout error");
  check_throws([&] { llmc::rendezvous_tcp_receive("127.0.0.1", free_port(), launch_of(1, 2, "tcp-3"), got.data(), 0.5); },
               "could not get the id", "tcp: no rank 0 -> timeout error");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check_verbose(waited >= 1.0 && waited < 3.0, llmc::strformat("tcp: two timeouts of 0.5 s took %.2f s", waited));
}

void test_launch() {
  std::map<std::string, std::string> env;
  auto get = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  LaunchFlags flags;
  Launch l = llmc::resolve_launch(flags, get);
  check(l.world == 1 && l.rank == 0 && l.source == "single process", "no flags, no Slurm: one process");
  env = {{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"},
         {"SLURM_JOB_ID", "1234"}, {"SLURM_STEP_ID", "0"}};
  l = llmc::resolve_launch(flags, get);
  check_verbose(l.world == 8 && l.rank == 5 && l.local_rank == 1 && l.token == "1234.0.0",
                "Slurm: rank, world, local rank, token job.step.restarts = " + l.token);
  env["SLURM_RESTART_COUNT"] = "2";
  check(llmc::resolve_launch(flags, get).token == "1234.0.2", "Slurm: a requeued job gets a new token");
  env.erase("SLURM_PROCID");
  check_throws([&] { llmc::resolve_launch(flags, get); }, "SLURM_PROCID", "Slurm without SLURM_PROCID");
  flags.rank = 1;
  flags.world = 2;
  flags.token = "t1";
  l = llmc::resolve_launch(flags, get);
  check_verbose(l.world == 2 && l.rank == 1 && l.local_rank == 1 && l.token == "t1" && l.source == "flags",
                "flags win over Slurm; the local rank defaults to the rank");
  flags.token = "";
  check_throws([&] { llmc::resolve_launch(flags, get); }, "without -rt", "by hand without a token");
  flags.token = "a/b";
  check_throws([&] { llmc::resolve_launch(flags, get); }, "only letters", "a token that is no file name");
  flags.token = "t";
  flags.rank = 2;
  check_throws([&] { llmc::resolve_launch(flags, get); }, "0 <= rank", "rank not below the process count");
  check_throws([] { llmc::parse_rendezvous("tcp:host"); }, "tcp:HOST:PORT", "-rv without a port");
  check_throws([] { llmc::parse_rendezvous("nfs:/x"); }, "fs:DIR", "-rv of an unknown kind");
  const llmc::RendezvousSpec s = llmc::parse_rendezvous("tcp:node-1:29500");
  check(s.kind == llmc::RendezvousSpec::kTcp && s.host == "node-1" && s.port == 29500, "parse tcp:HOST:PORT");
  check_throws([] { llmc::rendezvous_exchange(llmc::RendezvousSpec(), launch_of(1, 2, "t"), nullptr, 1.0); },
               "need -rv", "several processes without -rv");
}

}  // namespace

int main() {
  test_launch();
  test_fs();
  test_tcp();
  return testing::summary("test_rendezvous");
}
