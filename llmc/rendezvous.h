// Launching several processes without MPI: which rank this process is, and how rank 0 hands
// the others an opaque id (NCCL's 128-byte unique id) before the communicator exists.
//
// Rank, process count and local rank (the GPU index on this node) come from flags (-pr, -pn,
// -pl) when given, else from Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID).
//
// Two rendezvous, named by -rv:
//   fs:DIR         rank 0 writes DIR/nccl_id_<token> under a temporary name and renames it into
//                  place (so a reader never sees a partial file); the others poll for that name.
//                  Rank 0 deletes the file once every rank has joined.
//   tcp:HOST:PORT  rank 0 listens on PORT; the others connect to HOST:PORT, send a hello with
//                  the token, and receive the id on that same connection.
//
// Stale ids: an id is only ever taken for the run token of this launch. Under Slurm the token is
// SLURM_JOB_ID.SLURM_STEP_ID.SLURM_RESTART_COUNT (unique per launch); by hand -rt TOKEN is
// required and must be new for every launch (e.g. a timestamp). The fs file carries the token in
// its name and body, and rank 0 refuses to start when a file for its token already exists (an
// earlier launch with the same token died before deleting it). Over TCP both sides check each
// other's token and process count, so a peer never takes an id from another launch's rank 0.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "utils.h"

namespace llmc {

constexpr size_t kRendezvousIdBytes = 128;
constexpr uint32_t kRendezvousMagic = 0x52445631;  // "RDV1"
constexpr size_t kRunTokenMaxBytes = 64;

// Rank layout of this process, from flags or Slurm.
struct LaunchFlags {
  int rank = -1;        // -pr
  int world = 0;        // -pn (0: not given)
  int local_rank = -1;  // -pl (-1: the rank, i.e. one node)
  std::string rendezvous;  // -rv fs:DIR | tcp:HOST:PORT
  std::string token;       // -rt
};

struct Launch {
  int rank = 0, world = 1, local_rank = 0;
  std::string token;
  std::string source;  // "flags", "slurm" or "single process"
};

inline int parse_env_int(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (!*text || *end || errno || v < 0 || v > INT32_MAX) {
    LLMC_FAIL("environment variable %s='%s' is not a non-negative integer", name, text);
  }
  return (int)v;
}

inline void check_run_token(const std::string& token) {
  if (token.empty() || token.size() > kRunTokenMaxBytes) {
    LLMC_FAIL("-rt '%s': the run token must have 1 to %zu characters", token.c_str(), kRunTokenMaxBytes);
  }
  for (char c : token) {
    if (!isalnum((unsigned char)c) && c != '.' && c != '_' && c != '-') {
      LLMC_FAIL("-rt '%s': use only letters, digits, '.', '_' and '-' in the run token", token.c_str());
    }
  }
}

// env(name) returns the variable's value or null (getenv, or a table in the tests).
inline Launch resolve_launch(const LaunchFlags& f, const std::function<const char*(const char*)>& env) {
  Launch l;
  if (f.world > 0 || f.rank >= 0) {
    if (f.world <= 0 || f.rank < 0 || f.rank >= f.world) {
      LLMC_FAIL("-pr %d -pn %d: give both, with 0 <= rank < process count", f.rank, f.world);
    }
    l.rank = f.rank;
    l.world = f.world;
    l.local_rank = f.local_rank >= 0 ? f.local_rank : f.rank;
    l.token = f.token;
    l.source = "flags";
    if (l.world > 1 && l.token.empty()) {
      LLMC_FAIL("-pn %d without -rt: give every process of this launch the same new run token, "
                "e.g. -rt $(date +%%s)", l.world);
    }
  } else if (env("SLURM_NTASKS") && parse_env_int("SLURM_NTASKS", env("SLURM_NTASKS")) > 1) {
    const char* names[] = {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID"};
    for (const char* name : names) {
      if (!env(name)) LLMC_FAIL("SLURM_NTASKS is set but %s is not: launch with srun", name);
    }
    l.world = parse_env_int("SLURM_NTASKS", env("SLURM_NTASKS"));
    l.rank = parse_env_int("SLURM_PROCID", env("SLURM_PROCID"));
    l.local_rank = parse_env_int("SLURM_LOCALID", env("SLURM_LOCALID"));
    const char* restarts = env("SLURM_RESTART_COUNT");
    l.token = !f.token.empty() ? f.token
                               : strformat("%s.%s.%s", env("SLURM_JOB_ID"), env("SLURM_STEP_ID"),
                                           restarts ? restarts : "0");
    l.source = "slurm";
    if (l.rank >= l.world) LLMC_FAIL("SLURM_PROCID %d is not below SLURM_NTASKS %d", l.rank, l.world);
  } else {
    l.source = "single process";
    return l;
  }
  if (l.world > 1) check_run_token(l.token);
  return l;
}

struct RendezvousSpec {
  enum Kind { kNone, kFs, kTcp } kind = kNone;
  std::string dir;   // fs
  std::string host;  // tcp
  int port = 0;      // tcp
};

inline RendezvousSpec parse_rendezvous(const std::string& text) {
  RendezvousSpec s;
  if (text.empty()) return s;
  if (text.rfind("fs:", 0) == 0 && text.size() > 3) {
    s.kind = RendezvousSpec::kFs;
    s.dir = text.substr(3);
    return s;
  }
  const size_t colon = text.rfind(':');
  if (text.rfind("tcp:", 0) == 0 && colon > 4 && colon + 1 < text.size()) {
    char* end = nullptr;
    const long port = strtol(text.c_str() + colon + 1, &end, 10);
    if (!*end && port > 0 && port < 65536) {
      s.kind = RendezvousSpec::kTcp;
      s.host = text.substr(4, colon - 4);
      s.port = (int)port;
      return s;
    }
  }
  LLMC_FAIL("-rv '%s': use fs:DIR (a directory every process can read) or tcp:HOST:PORT (rank 0's "
            "host and a free port)", text.c_str());
}

using RendezvousClock = std::chrono::steady_clock;

inline RendezvousClock::time_point deadline_after(double seconds) {
  return RendezvousClock::now() +
         std::chrono::duration_cast<RendezvousClock::duration>(std::chrono::duration<double>(seconds));
}

inline double seconds_left(RendezvousClock::time_point deadline) {
  return std::chrono::duration<double>(deadline - RendezvousClock::now()).count();
}

// The fs file and the TCP messages share one layout: magic, process count, token, id.
struct RendezvousRecord {
  uint32_t magic = kRendezvousMagic;
  uint32_t world = 0;
  uint32_t rank = 0;    // the sender's rank (TCP hello)
  uint32_t status = 0;  // TCP reply: 0 accepted, else rejected
  char token[kRunTokenMaxBytes + 1] = {};
  unsigned char id[kRendezvousIdBytes] = {};
};

inline RendezvousRecord make_record(const Launch& l, const void* id) {
  RendezvousRecord r;
  r.world = (uint32_t)l.world;
  r.rank = (uint32_t)l.rank;
  strncpy(r.token, l.token.c_str(), kRunTokenMaxBytes);
  if (id) memcpy(r.id, id, kRendezvousIdBytes);
  return r;
}

// Why a record does not belong to this launch, or "" when it does.
inline std::string record_mismatch(const RendezvousRecord& r, const Launch& l) {
  if (r.magic != kRendezvousMagic) return "not a rendezvous record";
  if (strncmp(r.token, l.token.c_str(), kRunTokenMaxBytes + 1) != 0) {
    return strformat("run token '%.*s', this process has -rt '%s'", (int)kRunTokenMaxBytes, r.token,
                     l.token.c_str());
  }
  if ((int)r.world != l.world) return strformat("%u processes, this launch has %d", r.world, l.world);
  return "";
}

// Rank 0: whether a peer's hello belongs to this launch and names a rank that has not joined yet.
inline bool hello_accepted(const RendezvousRecord& hello, const Launch& l, const std::set<int>& joined) {
  return record_mismatch(hello, l).empty() && (int)hello.rank > 0 && (int)hello.rank < l.world &&
         !joined.count((int)hello.rank);
}

// A peer: why rank 0's reply does not hand this launch an id, or "" when it does.
inline std::string reply_mismatch(const RendezvousRecord& reply, const Launch& l) {
  const std::string why = record_mismatch(reply, l);
  if (why.empty() && reply.status != 0) return "duplicate rank or different token";
  return why;
}

inline std::string rendezvous_fs_path(const std::string& dir, const std::string& token) {
  return dir + "/nccl_id_" + token;
}

inline void rendezvous_fs_publish(const std::string& dir, const Launch& l, const void* id) {
  make_dirs(dir);
  const std::string path = rendezvous_fs_path(dir, l.token);
  if (file_exists(path)) {
    LLMC_FAIL("-rv fs:%s: %s is left from an earlier launch with run token '%s': start every "
              "process with a new -rt (or delete the file)", dir.c_str(), path.c_str(), l.token.c_str());
  }
  const std::string tmp = strformat("%s.tmp.%d", path.c_str(), (int)getpid());
  const RendezvousRecord r = make_record(l, id);
  File f(tmp, "wb");
  f.write(&r, sizeof(r), "the rendezvous id");
  f.close(/*sync=*/true);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    LLMC_FAIL("cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
  }
}

// Takes the id out of rank 0's file; fails unless the file is one record of this launch.
inline void rendezvous_fs_read(const std::string& path, const Launch& l, void* id) {
  RendezvousRecord r;
  File f(path, "rb");
  if (f.size() != (long)sizeof(r)) LLMC_FAIL("%s: not a rendezvous file (size %ld)", path.c_str(), f.size());
  f.read(&r, sizeof(r), "the rendezvous id");
  const std::string why = record_mismatch(r, l);
  if (!why.empty()) {
    LLMC_FAIL("%s: %s: start every process of a launch with the same -pn and -rt", path.c_str(), why.c_str());
  }
  memcpy(id, r.id, kRendezvousIdBytes);
}

inline void rendezvous_fs_receive(const std::string& dir, const Launch& l, void* id, double timeout_s) {
  const std::string path = rendezvous_fs_path(dir, l.token);
  const RendezvousClock::time_point deadline = deadline_after(timeout_s);
  while (!file_exists(path)) {
    if (seconds_left(deadline) <= 0) {
      LLMC_FAIL("-rv fs:%s: rank %d found no %s from rank 0 within %g s: start rank 0 with the "
                "same -rv and -rt, or raise -ct", dir.c_str(), l.rank, path.c_str(), timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  rendezvous_fs_read(path, l, id);
}

// Rank 0, once every rank has joined: later launches must never find this id.
inline void rendezvous_fs_remove(const std::string& dir, const Launch& l) {
  const std::string path = rendezvous_fs_path(dir, l.token);
  if (remove(path.c_str()) != 0 && errno != ENOENT) {
    LLMC_FAIL("cannot delete the rendezvous file %s: %s", path.c_str(), strerror(errno));
  }
}

// A socket closed when it goes out of scope.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Sends or receives exactly `bytes`, waiting at most until the deadline. False on failure.
inline bool socket_transfer(int fd, void* data, size_t bytes, bool sending,
                            RendezvousClock::time_point deadline) {
  char* p = (char*)data;
  while (bytes > 0) {
    pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
    const double left = seconds_left(deadline);
    if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) return false;
    const ssize_t n = sending ? send(fd, p, bytes, MSG_NOSIGNAL) : recv(fd, p, bytes, 0);
    if (n <= 0) return false;
    p += n;
    bytes -= (size_t)n;
  }
  return true;
}

// Rank 0: serves the id to every other rank of this launch. A connection with another token or
// process count is answered with a rejection and does not count.
inline void rendezvous_tcp_serve(int port, const Launch& l, const void* id, double timeout_s) {
  Socket server(socket(AF_INET, SOCK_STREAM, 0));
  if (server.fd() < 0) LLMC_FAIL("rendezvous: cannot create a socket: %s", strerror(errno));
  const int yes = 1;
  setsockopt(server.fd(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons((uint16_t)port);
  if (bind(server.fd(), (sockaddr*)&addr, sizeof(addr)) != 0 || listen(server.fd(), 128) != 0) {
    LLMC_FAIL("-rv tcp: rank 0 cannot listen on port %d: %s: choose a free port", port, strerror(errno));
  }
  const RendezvousClock::time_point deadline = deadline_after(timeout_s);
  std::set<int> joined;
  while ((int)joined.size() < l.world - 1) {
    pollfd pfd = {server.fd(), POLLIN, 0};
    const double left = seconds_left(deadline);
    if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) {
      LLMC_FAIL("-rv tcp: after %g s only %zu of the %d other ranks reached rank 0 on port %d: "
                "start every rank with the same -rv, -pn and -rt, or raise -ct", timeout_s,
                joined.size(), l.world - 1, port);
    }
    Socket peer(accept(server.fd(), nullptr, nullptr));
    if (peer.fd() < 0) continue;
    // A silent connection may hold rank 0 for a few seconds at most, not the whole timeout.
    const RendezvousClock::time_point peer_deadline = std::min(deadline, deadline_after(5.0));
    RendezvousRecord hello;
    if (!socket_transfer(peer.fd(), &hello, sizeof(hello), false, peer_deadline)) continue;
    RendezvousRecord reply = make_record(l, id);
    const bool accepted = hello_accepted(hello, l, joined);
    reply.status = accepted ? 0 : 1;
    if (!accepted) memset(reply.id, 0, sizeof(reply.id));
    if (socket_transfer(peer.fd(), &reply, sizeof(reply), true, peer_deadline) && accepted) {
      joined.insert((int)hello.rank);
    }
  }
}

// Ranks above 0: connects to rank 0 (retrying until it listens) and receives the id.
inline void rendezvous_tcp_receive(const std::string& host, int port, const Launch& l, void* id,
                                   double timeout_s) {
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || !found) {
    LLMC_FAIL("-rv tcp:%s:%d: cannot resolve the host name %s", host.c_str(), port, host.c_str());
  }
  sockaddr_in addr;
  memcpy(&addr, found->ai_addr, sizeof(addr));
  freeaddrinfo(found);
  const RendezvousClock::time_point deadline = deadline_after(timeout_s);
  while (true) {
    Socket s(socket(AF_INET, SOCK_STREAM, 0));
    if (s.fd() < 0) LLMC_FAIL("rendezvous: cannot create a socket: %s", strerror(errno));
    if (connect(s.fd(), (sockaddr*)&addr, sizeof(addr)) == 0) {
      RendezvousRecord hello = make_record(l, nullptr), reply;
      if (socket_transfer(s.fd(), &hello, sizeof(hello), true, deadline) &&
          socket_transfer(s.fd(), &reply, sizeof(reply), false, deadline)) {
        const std::string why = reply_mismatch(reply, l);
        if (!why.empty()) {
          LLMC_FAIL("-rv tcp:%s:%d: rank 0 there belongs to another launch or refused rank %d "
                    "(%s): start every rank with the same -pn and a new, shared -rt", host.c_str(),
                    port, l.rank, why.c_str());
        }
        memcpy(id, reply.id, kRendezvousIdBytes);
        return;
      }
    }
    if (seconds_left(deadline) <= 0) {
      LLMC_FAIL("-rv tcp:%s:%d: rank %d could not get the id from rank 0 within %g s: start rank 0 "
                "with the same -rv, or raise -ct", host.c_str(), port, l.rank, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Fails unless a launch of several processes has a rendezvous to meet through.
inline void require_rendezvous(const RendezvousSpec& spec, const Launch& l) {
  if (l.world > 1 && spec.kind == RendezvousSpec::kNone) {
    LLMC_FAIL("%d processes (%s) without mpirun need -rv fs:DIR or -rv tcp:HOST:PORT so rank 0 can "
              "hand out the NCCL id", l.world, l.source.c_str());
  }
}

// Rank 0 passes its id in; every other rank gets rank 0's id out.
inline void rendezvous_exchange(const RendezvousSpec& spec, const Launch& l, void* id, double timeout_s) {
  if (spec.kind == RendezvousSpec::kFs) {
    if (l.rank == 0) rendezvous_fs_publish(spec.dir, l, id);
    else rendezvous_fs_receive(spec.dir, l, id, timeout_s);
  } else if (spec.kind == RendezvousSpec::kTcp) {
    if (l.rank == 0) rendezvous_tcp_serve(spec.port, l, id, timeout_s);
    else rendezvous_tcp_receive(spec.host, spec.port, l, id, timeout_s);
  } else {
    require_rendezvous(spec, l);
  }
}

}  // namespace llmc
