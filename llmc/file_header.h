// The 256-int32 header that opens the checkpoint and training-state files (llm.c's convention),
// and the checksum those files keep in its last two slots:
//   [254] checksum kind: 0 none (files of llm.c and of earlier versions), 1 CRC-32
//   [255] the CRC-32 (as uint32 bits) of the whole file, header included, with this slot read as 0
// llm.c reads only the first slots of a checkpoint header, so a checksummed checkpoint stays an
// llm.c checkpoint. Covering the header means a flipped header bit is caught too, not only
// damage in the payload.
//
// CRC-32 is the IEEE 802.3 one (reflected polynomial 0xEDB88320) that zlib, gzip and Python's
// zlib.crc32 compute, so the PyTorch script checks and writes the same value at zlib's speed.
// Here it is computed slicing-by-8 (eight table lookups per 8 bytes), about 1.25 GB/s on one
// core: 17 s for the 21.8 GB of a 1.5B-parameter run's checkpoint. So a large buffer is cut into
// pieces whose CRCs are computed on several threads (OpenMP) and then combined as zlib's
// crc32_combine does: the same value, several times sooner.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "utils.h"

namespace llmc {

constexpr int kHeaderInts = 256;
constexpr int kHeaderChecksumKindSlot = 254;
constexpr int kHeaderChecksumSlot = 255;
constexpr int kChecksumNone = 0;
constexpr int kChecksumCrc32 = 1;

namespace crc32_detail {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

// tables[0] is the byte-at-a-time table; tables[s][b] advances tables[s-1][b] by one more zero
// byte, so that eight bytes fold in with eight independent lookups.
constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; bit++) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[0][b] = c;
  }
  for (int s = 1; s < 8; s++) {
    for (uint32_t b = 0; b < 256; b++) t[s][b] = (t[s - 1][b] >> 8) ^ t[0][t[s - 1][b] & 0xffu];
  }
  return t;
}

inline constexpr Tables kTables = make_tables();

}  // namespace crc32_detail

namespace crc32_detail {

// One thread's CRC-32 of data continued from crc.
inline uint32_t update_serial(uint32_t crc, const void* data, size_t bytes) {
  const Tables& t = kTables;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; bytes >= 8; p += 8, bytes -= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^
          t[3][hi & 0xffu] ^ t[2][(hi >> 8) & 0xffu] ^ t[1][(hi >> 16) & 0xffu] ^ t[0][hi >> 24];
  }
  for (; bytes > 0; p++, bytes--) crc = t[0][(crc ^ *p) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

// A 32x32 matrix over GF(2) (column n is mat[n]) times a vector, and a matrix squared.
inline uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, mat++) {
    if (vec & 1u) sum ^= *mat;
  }
  return sum;
}

inline void gf2_square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

}  // namespace crc32_detail

// The CRC-32 of a followed by b from crc_a and crc_b, the CRC-32s of each, and b's length, as
// zlib's crc32_combine: crc_a advanced over len_b zero bytes (the operator for one zero bit
// squared up to the bits of len_b), then crc_b folded in.
inline uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
  if (len_b == 0) return crc_a;
  uint32_t even[32], odd[32];
  odd[0] = 0xEDB88320u;  // one zero bit
  for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
  crc32_detail::gf2_square(even, odd);  // two zero bits
  crc32_detail::gf2_square(odd, even);  // four
  do {
    crc32_detail::gf2_square(even, odd);  // one zero byte, then 4, 16, ...
    if (len_b & 1u) crc_a = crc32_detail::gf2_times(even, crc_a);
    len_b >>= 1;
    if (len_b == 0) break;
    crc32_detail::gf2_square(odd, even);  // 2, 8, 32, ... zero bytes
    if (len_b & 1u) crc_a = crc32_detail::gf2_times(odd, crc_a);
    len_b >>= 1;
  } while (len_b != 0);
  return crc_a ^ crc_b;
}

namespace crc32_detail {

// crc32_update in pieces of piece_bytes (the last takes the rest), their CRCs on up to `threads`
// threads, combined in order.
inline uint32_t update_in_pieces(uint32_t crc, const void* data, size_t bytes, size_t piece_bytes,
                                 int threads) {
  const size_t pieces = bytes / piece_bytes;
  if (pieces < 2 || threads < 2) return update_serial(crc, data, bytes);
  const unsigned char* p = static_cast<const unsigned char*>(data);
  auto piece_end = [&](size_t i) { return i + 1 == pieces ? bytes : (i + 1) * piece_bytes; };
  std::vector<uint32_t> crcs(pieces);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (long i = 0; i < (long)pieces; i++) {
    crcs[i] = update_serial(0, p + i * piece_bytes, piece_end(i) - i * piece_bytes);
  }
  for (size_t i = 0; i < pieces; i++) crc = crc32_combine(crc, crcs[i], piece_end(i) - i * piece_bytes);
  return crc;
}

}  // namespace crc32_detail

// The CRC-32 of data continued from crc, as zlib's crc32(crc, data, bytes): start from 0, and
// crc32_update(crc32_update(0, a), b) is the CRC-32 of a followed by b. From 128 MiB on, in
// pieces of 64 MiB on several threads. Little-endian hosts only (every target of this project).
inline uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  return crc32_detail::update_in_pieces(crc, data, bytes, 64ul << 20, host_pass_threads());
}

// Marks a header as checksummed and returns the CRC-32 of its bytes with the checksum slot read
// as 0: a writer continues it over the payload with crc32_update, then header_store_checksum.
inline uint32_t header_checksum_begin(int h[kHeaderInts]) {
  h[kHeaderChecksumKindSlot] = kChecksumCrc32;
  int copy[kHeaderInts];
  memcpy(copy, h, sizeof(copy));
  copy[kHeaderChecksumSlot] = 0;
  return crc32_update(0, copy, sizeof(copy));
}

inline void header_store_checksum(int h[kHeaderInts], uint32_t crc) {
  memcpy(&h[kHeaderChecksumSlot], &crc, sizeof(crc));
}

// Whether a header read from path carries a checksum; fails on a kind this version does not know.
inline bool header_has_checksum(const int h[kHeaderInts], const std::string& path) {
  const int kind = h[kHeaderChecksumKindSlot];
  if (kind != kChecksumNone && kind != kChecksumCrc32) {
    LLMC_FAIL("%s: unknown checksum kind %d in header slot %d (0 none, %d CRC-32): the header is "
              "damaged or the file comes from a newer version; re-create it",
              path.c_str(), kind, kHeaderChecksumKindSlot, kChecksumCrc32);
  }
  return kind == kChecksumCrc32;
}

// The CRC-32 a checksummed header's file must have, computed over the header as
// header_checksum_begin does (without changing h).
inline uint32_t header_checksum_start(const int h[kHeaderInts]) {
  int copy[kHeaderInts];
  memcpy(copy, h, sizeof(copy));
  return header_checksum_begin(copy);
}

// Fails unless computed (the CRC-32 of the file, continued from header_checksum_start) is the one
// in the header; `remedy` says what to do about a damaged file.
inline void header_verify_checksum(const int h[kHeaderInts], uint32_t computed,
                                   const std::string& path, const char* remedy) {
  uint32_t stored;
  memcpy(&stored, &h[kHeaderChecksumSlot], sizeof(stored));
  if (stored != computed) {
    LLMC_FAIL("%s: checksum mismatch (CRC-32 %08x in the header, %08x computed): the file is "
              "damaged; %s", path.c_str(), stored, computed, remedy);
  }
}

// header_verify_checksum over the file behind f: its header h (as read) and every byte after it,
// read to the end in pieces; leaves f positioned after the header. Readers call it before they
// trust anything else in the header, so that damage anywhere, a changed size or shape included,
// is reported as damage to this file.
inline void header_verify_file_checksum(File& f, const int h[kHeaderInts], const char* remedy) {
  const long header_bytes = kHeaderInts * sizeof(int);
  long remaining = f.size() - header_bytes;
  f.seek(header_bytes);
  // Pieces large enough for crc32_update's threads.
  std::vector<unsigned char> piece((size_t)std::min(remaining, 256L << 20));
  uint32_t crc = header_checksum_start(h);
  while (remaining > 0) {
    const size_t bytes = (size_t)std::min<long>(remaining, (long)piece.size());
    f.read(piece.data(), bytes, "the file for its checksum");
    crc = crc32_update(crc, piece.data(), bytes);
    remaining -= (long)bytes;
  }
  f.seek(header_bytes);
  header_verify_checksum(h, crc, f.path(), remedy);
}

}  // namespace llmc
