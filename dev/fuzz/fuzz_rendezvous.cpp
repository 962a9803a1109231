// Fuzzes what the rendezvous of llmc/rendezvous.h takes from other processes, for a launch of 4
// processes with run token 1234.0.0. The input is read three ways: as rank 0's id file
// (rendezvous_fs_read), as a peer's hello to rank 0, which has rank 2 joined already
// (hello_accepted), and as rank 0's reply to rank 1 (reply_mismatch). A TCP message is always one
// record long, so those two take the input's first sizeof(RendezvousRecord) bytes, zero-padded.
// What is accepted must carry what make_record writes for this launch (magic, process count,
// token up to its NUL; a reply's status 0, a hello's rank one that may still join), the id taken
// from a file must be the file's; and what make_record writes for the input's id and rank is
// accepted.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "dev/fuzz/fuzz_file.h"
#include "llmc/rendezvous.h"

using llmc::RendezvousRecord;

namespace {

constexpr int kWorld = 4;
const std::set<int> kJoined = {2};

// test_fuzz.sh writes its seed records in this layout (4 uint32, token, id, padding).
static_assert(sizeof(RendezvousRecord) == 212, "update the rendezvous seeds in test_fuzz.sh");

llmc::Launch launch_of(int rank) {
  llmc::Launch l;
  l.rank = rank;
  l.world = kWorld;
  l.token = "1234.0.0";
  return l;
}

// Compares with the writer's record rather than repeating the reader's checks: bytes after the
// token's NUL, the rank of a file or reply and the padding are not read by anyone.
bool carries_launch(const RendezvousRecord& r, const llmc::Launch& l) {
  const RendezvousRecord written = llmc::make_record(l, nullptr);
  return r.magic == written.magic && r.world == written.world &&
         std::string(r.token, strnlen(r.token, sizeof(r.token))) == written.token;
}

std::string bytes_of(const RendezvousRecord& r) {
  return std::string((const char*)&r, sizeof(r));
}

void check_file(const uint8_t* data, size_t size, const RendezvousRecord& record) {
  static fuzz::ScratchFile file("nccl_id");
  const llmc::Launch peer = launch_of(1);
  unsigned char id[llmc::kRendezvousIdBytes];
  bool accepted = true;
  try {
    llmc::rendezvous_fs_read(file.write(data, size), peer, id);
  } catch (const llmc::Error&) {
    accepted = false;
  }
  if (accepted) {
    fuzz::require(size == sizeof(RendezvousRecord) && carries_launch(record, peer),
                  "an accepted id file is one record of this launch");
    fuzz::require(memcmp(id, record.id, sizeof(id)) == 0, "the id taken is the file's");
  }
  const std::string written = bytes_of(llmc::make_record(launch_of(0), record.id));
  try {
    llmc::rendezvous_fs_read(file.write((const uint8_t*)written.data(), written.size()), peer, id);
  } catch (const llmc::Error&) {
    fuzz::fail_property("the file rank 0 writes is refused");
  }
  fuzz::require(memcmp(id, record.id, sizeof(id)) == 0, "the id taken is the one rank 0 wrote");
}

void check_hello(const RendezvousRecord& hello) {
  const llmc::Launch rank0 = launch_of(0);
  if (llmc::hello_accepted(hello, rank0, kJoined)) {
    fuzz::require(carries_launch(hello, rank0), "an accepted hello is of this launch");
    fuzz::require(hello.rank >= 1 && hello.rank < (uint32_t)kWorld && !kJoined.count((int)hello.rank),
                  "an accepted hello names a rank 1..3 that has not joined");
  }
  const int rank = (int)(hello.rank % kWorld);
  const bool may_join = rank != 0 && !kJoined.count(rank);
  fuzz::require(llmc::hello_accepted(llmc::make_record(launch_of(rank), nullptr), rank0, kJoined) == may_join,
                "rank 0 accepts the hello a peer writes exactly when that rank may still join");
}

void check_reply(const RendezvousRecord& reply) {
  const llmc::Launch peer = launch_of(1);
  if (llmc::reply_mismatch(reply, peer).empty()) {
    fuzz::require(carries_launch(reply, peer) && reply.status == 0,
                  "an accepted reply is an acceptance from this launch's rank 0");
  }
  RendezvousRecord written = llmc::make_record(launch_of(0), reply.id);
  fuzz::require(llmc::reply_mismatch(written, peer).empty(), "the reply rank 0 writes is accepted");
  written.status = reply.status;
  fuzz::require(llmc::reply_mismatch(written, peer).empty() == (reply.status == 0),
                "a reply rank 0 writes with a nonzero status is a refusal");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RendezvousRecord record;
  memset(&record, 0, sizeof(record));
  memcpy(&record, data, std::min(size, sizeof(record)));
  check_file(data, size, record);
  check_hello(record);
  check_reply(record);
  return 0;
}
