// Tests llmc/utils.h (checked file I/O whose errors name the path, staged files, glob,
// make_dirs, small helpers), llmc/file_header.h (CRC-32) and llmc/gpt2.h (configs,
// the parameter table, checkpoint and debug-state header validation, checkpoint
// checksums, BF16 rounding). Files go to build/test_tmp/utils/.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/file_header.h"
#include "llmc/flags.h"
#include "llmc/gpt2.h"
#include "llmc/utils.h"

using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

const std::string kDir = "build/test_tmp/utils";

void write_bytes(const std::string& path, const void* data, size_t bytes) {
  llmc::File f(path, "wb");
  if (bytes > 0) f.write(data, bytes, "test bytes");
  f.close();
}

void test_strformat_and_helpers() {
  const std::string long_text(5000, 'x');
  check(llmc::strformat("%s|%d", long_text.c_str(), 7) == long_text + "|7",
        "strformat formats a string longer than any fixed buffer");
  check(llmc::strformat("%s", "").empty(), "strformat of an empty string");
  check(llmc::round_up(50257, 128) == 50304 && llmc::round_up(128, 128) == 128 &&
            llmc::round_up(0, 128) == 0,
        "round_up");
  check_throws([] { llmc::fail("plain message"); }, "plain message", "fail throws llmc::Error");
  check_throws([] { LLMC_FAIL("value %d of %s", 3, "x"); }, "value 3 of x", "LLMC_FAIL formats");
  void* p = llmc::malloc_checked(16, "a small buffer");
  check(p != nullptr, "malloc_checked allocates");
  free(p);
  check_throws([] { llmc::malloc_checked((size_t)1 << 62, "a huge buffer"); },
               "out of host memory allocating 4611686018427387904 bytes for a huge buffer",
               "malloc_checked of 2^62 bytes");
}

void test_file() {
  const std::string path = kDir + "/data.bin";
  const int values[4] = {1, 2, 3, 4};
  write_bytes(path, values, sizeof(values));
  {
    llmc::File f(path, "rb");
    int back[4] = {};
    check_verbose(f.size() == 16 && f.path() == path, "File::size and File::path");
    f.read(back, sizeof(back), "four ints");
    check_verbose(memcmp(back, values, sizeof(values)) == 0, "File write then read round trip");
    f.seek(8);
    int third = 0;
    f.read(&third, sizeof(third), "the third int");
    check(third == 3, "File::seek then read");
    f.seek(12);
    check(f.size() == 16 && ftell(f.handle()) == 12, "File::size leaves the position alone");
    int two[2];
    check_throws(
        [&] { f.read(two, sizeof(two), "two ints"); },
        path + ": file is truncated: reading two ints at byte 12 needs 8 bytes, only 4 remain",
        "reading past the end names the file, what, where and how much");
    check_throws([&] { f.seek(-5); }, path + ": cannot seek to byte -5",
                 "a bad seek names the file");
  }
  check_throws([&] { llmc::File f(kDir + "/no_such_file.bin", "rb"); },
               "cannot open " + kDir + "/no_such_file.bin for reading: No such file or directory",
               "opening a missing file names it");
  check_throws([&] { llmc::File f(kDir + "/no_such_dir/out.bin", "wb"); },
               "cannot open " + kDir + "/no_such_dir/out.bin for writing",
               "writing into a missing directory");
  check_throws([&] { llmc::File f(kDir + "/no_such_dir/out.log", "a"); }, "for writing",
               "appending into a missing directory is reported as writing");

  write_bytes(kDir + "/text.txt", "hello\nworld", 11);
  write_bytes(kDir + "/empty.txt", "", 0);
  check_verbose(llmc::read_text_file(kDir + "/text.txt") == "hello\nworld" &&
                    llmc::read_text_file(kDir + "/empty.txt").empty(),
                "read_text_file, including an empty file");
  check_throws([&] { llmc::read_text_file(kDir + "/missing.txt"); }, kDir + "/missing.txt",
               "read_text_file of a missing file names it");
  check(llmc::file_exists(kDir + "/text.txt") && !llmc::file_exists(kDir + "/missing.txt"),
        "file_exists");

  llmc::File closing(kDir + "/closed.bin", "wb");
  closing.write(values, sizeof(values), "ints");
  closing.close(true);
  closing.close();
  check(llmc::File(kDir + "/closed.bin", "rb").size() == 16,
        "close(sync) flushes; a second close is a no-op");
}

// StagedFiles: nothing under a final name before commit, all of them after it, and nothing left
// (neither name) when a write or a rename fails.
void test_staged_files() {
  const std::string a = kDir + "/staged_a.bin", b = kDir + "/staged_b.bin";
  const auto write_text = [](const char* text) {
    return [text](llmc::File& f) { f.write(text, strlen(text), "text"); };
  };
  {
    llmc::StagedFiles files;
    files.write(a, write_text("first"));
    files.write(b, write_text("second"));
    check_verbose(llmc::file_exists(a + ".tmp") && llmc::file_exists(b + ".tmp") &&
                      !llmc::file_exists(a) && !llmc::file_exists(b),
                  "StagedFiles: before commit only the .tmp files exist");
    files.commit();
  }
  check_verbose(llmc::read_text_file(a) == "first" && llmc::read_text_file(b) == "second" &&
                    !llmc::file_exists(a + ".tmp") && !llmc::file_exists(b + ".tmp"),
                "StagedFiles: commit renames every file to its name");
  remove(a.c_str());
  remove(b.c_str());

  check_throws([&] {
    llmc::StagedFiles files;
    files.write(a, write_text("first"));
    files.write(b, [](llmc::File&) { llmc::fail("disk full"); });
  }, "disk full", "StagedFiles: a failing write's error is passed on");
  check_verbose(!llmc::file_exists(a) && !llmc::file_exists(a + ".tmp") &&
                    !llmc::file_exists(b) && !llmc::file_exists(b + ".tmp"),
                "StagedFiles: a failed write leaves no file, nor those staged before it");

  const std::string blocked = kDir + "/staged_dir";
  llmc::make_dirs(blocked + "/inside");
  check_throws([&] {
    llmc::StagedFiles files;
    files.write(a, write_text("first"));
    files.write(blocked, write_text("second"));
    files.commit();
  }, "cannot rename " + blocked + ".tmp to " + blocked, "StagedFiles: a failed rename names it");
  check_verbose(!llmc::file_exists(a) && !llmc::file_exists(a + ".tmp") &&
                    !llmc::file_exists(blocked + ".tmp"),
                "StagedFiles: a failed rename removes the files already renamed");
}

void test_glob_and_make_dirs() {
  const std::string dir = kDir + "/glob";
  llmc::make_dirs(dir);
  for (const char* name : {"b_002.bin", "b_000.bin", "b_010.bin", "b_001.bin", "other.txt"}) {
    write_bytes(dir + "/" + name, "x", 1);
  }
  const std::vector<std::string> got = llmc::glob_files(dir + "/b_*.bin", "-i");
  const std::vector<std::string> expected = {dir + "/b_000.bin", dir + "/b_001.bin",
                                             dir + "/b_002.bin", dir + "/b_010.bin"};
  check_verbose(got == expected, "glob_files matches only the pattern, sorted by name");
  check_verbose(llmc::glob_files(dir + "/other.txt", "-i").size() == 1,
                "glob_files of a plain existing path returns it");
  check_throws([&] { llmc::glob_files(dir + "/c_*.bin", "-j"); },
               "no files match -j '" + dir + "/c_*.bin'",
               "a pattern matching nothing names flag and pattern");
  check_throws([&] { llmc::glob_files(dir + "/absent.bin", "-e"); },
               "no files match -e '" + dir + "/absent.bin'", "a missing plain path");

  const std::string nested = kDir + "/dirs/a/b/c";
  llmc::make_dirs(nested);
  llmc::make_dirs(nested);
  llmc::make_dirs(kDir + "/dirs/trailing/");
  write_bytes(nested + "/probe", "x", 1);
  check_verbose(llmc::file_exists(nested + "/probe") && llmc::file_exists(kDir + "/dirs/trailing"),
                "make_dirs creates nested directories, again without error, and with a trailing /");
  write_bytes(kDir + "/dirs/plain_file", "x", 1);
  check_throws([&] { llmc::make_dirs(kDir + "/dirs/plain_file/sub"); },
               "cannot create directory " + kDir + "/dirs/plain_file/sub: Not a directory",
               "make_dirs below a file names the directory and the reason");
}

// The speedrun architecture's preset `name` (tiny, d12).
llmc::GPT2Config speedrun_preset(const char* name) {
  llmc::GPT2Config c;
  llmc::config_from_preset(name, &c, llmc::Arch::kSpeedrun);
  return c;
}

// A config's parameter table as llmc::param_table and llmc::param_offsets derive it.
struct ParamTable {
  llmc::GPT2Config config;
  llmc::ParamSpec specs[llmc::kNumParamTensors];
  size_t offsets[llmc::kNumParamTensors];
  size_t count = 0;  // llmc::num_parameters
  const llmc::ParamSpec& operator[](int i) const { return specs[i]; }
  // The names of the tensors the config has, in the file's order.
  std::string order() const {
    std::string names;
    for (int i = 0; i < llmc::kNumParamTensors; i++) {
      if (specs[i].size > 0) names += std::string(names.empty() ? "" : " ") + specs[i].name;
    }
    return names;
  }
  // Whether tensors [0, end) have the sizes and offsets they have in other.
  bool kept_before(const ParamTable& other, int end) const {
    for (int i = 0; i < end; i++) {
      if (offsets[i] != other.offsets[i] || specs[i].size != other.specs[i].size) return false;
    }
    return true;
  }
  // Whether this is `before` with tensor i of `size` elements added at its end.
  bool appended(const ParamTable& before, int i, size_t size) const {
    return kept_before(before, i) && offsets[i] == before.count && specs[i].size == size &&
           count == before.count + size;
  }
};

ParamTable table_of(const llmc::GPT2Config& c) {
  ParamTable t;
  t.config = c;
  llmc::param_table(c, t.specs);
  llmc::param_offsets(c, t.offsets);
  t.count = llmc::num_parameters(c);
  return t;
}

// The tables of c without and with its switch `feature` (c.*feature, left on).
std::pair<ParamTable, ParamTable> tables_around(llmc::GPT2Config& c, bool llmc::GPT2Config::*feature) {
  ParamTable without = table_of(c);
  c.*feature = true;
  return {without, table_of(c)};
}

// Whether tensor s's slab in each layer l of plan is slabs[l] (-1: the layer has none).
bool slabs_are(const llmc::LayerPlan& plan, const llmc::ParamSpec& s, const std::vector<int>& slabs) {
  for (size_t l = 0; l < slabs.size(); l++) {
    if (llmc::param_slab(plan, s, (int)l) != slabs[l]) return false;
  }
  return true;
}

// Whether c's header holds `features` in slot 9 and reads back as c.
bool header_holds(const llmc::GPT2Config& c, int features, const char* path) {
  int h[llmc::kHeaderInts];
  llmc::header_from_config(c, llmc::kCheckpointVersionBF16, h);
  return h[llmc::kFeaturesSlot] == features && llmc::config_from_header(h, path) == c;
}

// Whether the init (seed 3) of a config with tensors appended is the one without them followed by zeros.
bool init_appends_zeros(const ParamTable& before, const ParamTable& after) {
  const std::vector<float> init = llmc::init_params_from_seed(after.config, 3);
  const std::vector<float> plain = llmc::init_params_from_seed(before.config, 3);
  return init.size() == after.count && plain.size() == before.count && after.count > before.count &&
         std::equal(plain.begin(), plain.end(), init.begin()) &&
         std::all_of(init.begin() + plain.size(), init.end(), [](float x) { return x == 0.0f; });
}

// The modern architecture's table: no wpe or biases of the norms, a norm after the embedding, a
// separate head with bias after lnfw; q, k and v are three matrices for Muon.
void test_modern_table() {
  llmc::GPT2Config d12;
  check(llmc::config_from_preset("d12", &d12, llmc::Arch::kModern) && d12.modern() &&
            d12.num_heads == 6 && d12.head_size() == 128,
        "modern preset d12: 6 heads of 128");
  llmc::GPT2Config d48;
  check(llmc::config_from_preset("d48", &d48, llmc::Arch::kModern) && d48.head_size() == 64,
        "modern preset d48: head size 64 (128 does not divide 1600)");
  const ParamTable t = table_of(d12);
  const size_t L = 12, C = 768, Vp = 50304;
  const size_t expected = Vp * C + C + L * (C + 3 * C * C + 3 * C + C * C + C + C + 4 * C * C + 4 * C +
                                            4 * C * C + C) + C + Vp * C + Vp;
  check_verbose(llmc::num_parameters(d12) == expected && t[llmc::kWpe].size == 0 &&
                    t[llmc::kLn1b].size == 0 && t[llmc::kLnfb].size == 0 &&
                    t.offsets[llmc::kHeadb] + Vp == expected,
                llmc::strformat("modern d12: %zu parameters (%zu), no wpe or norm biases, headb last",
                                llmc::num_parameters(d12), expected));
  check(t[llmc::kQkvw].role == llmc::ParamRole::kMatrix && t[llmc::kQkvw].split == 3 &&
            t[llmc::kQkvw].rows == 768 && t[llmc::kFcw].rows == 3072 && t[llmc::kFcprojw].cols == 3072 &&
            t[llmc::kHeadw].role == llmc::ParamRole::kHead && t[llmc::kHeadb].role == llmc::ParamRole::kVector,
        "modern roles: q, k, v three 768x768 matrices, fc 3072x768, fcproj 768x3072, head and its bias");
  const std::vector<float> init = llmc::init_params_from_seed(d12, 42);
  auto all_equal = [&](int i, float v) {
    return std::all_of(init.begin() + t.offsets[i], init.begin() + t.offsets[i] + t[i].size,
                       [v](float x) { return x == v; });
  };
  double sum_squares = 0.0;
  const size_t qkv0 = t.offsets[llmc::kQkvw], slab = 3 * C * C;
  for (size_t i = qkv0; i < qkv0 + slab; i++) sum_squares += (double)init[i] * init[i];
  const double qkv_std = std::sqrt(sum_squares / slab), want = std::sqrt(0.33 / 768);
  check_verbose(all_equal(llmc::kLnew, 1.0f) && all_equal(llmc::kLn1w, 1.0f) && all_equal(llmc::kLnfw, 1.0f) &&
                    all_equal(llmc::kAttprojw, 0.0f) && all_equal(llmc::kFcprojw, 0.0f) &&
                    all_equal(llmc::kHeadw, 0.0f) && all_equal(llmc::kQkvb, 0.0f) &&
                    std::fabs(qkv_std / want - 1.0) < 0.01,
                llmc::strformat("modern init: gains one, projections and head zero, qkvw std %.5f (%.5f)",
                                qkv_std, want));
}

// The speedrun's table (SPEC.md "Speedrun checkpoint"): the modern tensors it has, then the value
// embeddings, gates, skip weights, lambdas and value scales; the attention's tensors over the 11
// layers with attention, layer 7 having none; the seeds of the 19 earlier tensors and of Muon's
// groups as they were.
void test_speedrun_table() {
  llmc::GPT2Config d12, tiny;
  check(llmc::config_from_preset("d12", &d12, llmc::Arch::kSpeedrun) && d12.num_heads == 6 &&
            d12.channels == 768 && d12.max_seq_len == 262144 &&
            llmc::config_from_preset("tiny", &tiny, llmc::Arch::kSpeedrun) && tiny.num_layers == 12 &&
            tiny.num_heads == 2 && tiny.channels == 128 && tiny.max_seq_len == 1024 &&
            !llmc::config_from_preset("d24", &tiny, llmc::Arch::kSpeedrun),
        "speedrun presets: d12 L12 NH6 C768 maxT 262144, tiny L12 NH2 C128 maxT 1024, no d24");
  check_throws([] { llmc::make_config(8, 2, 128, 64, 300, llmc::Arch::kSpeedrun); },
               "its references' 12 layers (record #28's; 11 record #89's)", "a speedrun of 8 layers is refused");
  ParamTable t = table_of(d12);
  const size_t L = 12, La = 11, C = 768, Vp = 50304, NH = 6;
  // train_gpt2.py's count: 5 embeddings of Vp x C, L/2 skips, per layer 2 lambdas and 8 C^2 of the
  // MLP, per attention layer 4 C^2, the gate NH x C/64 and 2 value scales.
  const size_t expected = 5 * Vp * C + L / 2 + L * (2 + 8 * C * C) + La * (4 * C * C + NH * (C / 64) + 2);
  const std::string order = t.order();
  check_verbose(llmc::num_parameters(d12) == expected &&
                    order == "wte qkvw attprojw fcw fcprojw headw ve attngate skipw lambdas value_scales",
                llmc::strformat("speedrun d12: %zu parameters (%zu), tensors %s", llmc::num_parameters(d12),
                                expected, order.c_str()));
  const llmc::ParamSpec &gate = t[llmc::kAttngate], &qkvw = t[llmc::kQkvw];
  check(t[llmc::kVe].size == 3 * Vp * C && t[llmc::kVe].role == llmc::ParamRole::kEmbedding &&
            gate.size == La * NH * 12 && gate.role == llmc::ParamRole::kMatrix && gate.rows == 6 &&
            gate.cols == 12 && t[llmc::kSkipw].size == 6 && t[llmc::kLambdas].size == 2 * L &&
            t[llmc::kValueScales].size == 2 * La &&
            t[llmc::kSkipw].role == llmc::ParamRole::kVector && t[llmc::kLambdas].role == llmc::ParamRole::kVector &&
            t[llmc::kValueScales].role == llmc::ParamRole::kVector && t[llmc::kHeadw].role == llmc::ParamRole::kHead,
        "speedrun tensors: ve [3, Vp, C], gates [11, 6, 12] for Muon, skips [6], lambdas [12, 2], value "
        "scales [11, 2] at the scalars' rate");
  const llmc::LayerPlan plan = llmc::layer_plan(d12);
  check(llmc::param_slab(plan, qkvw, 6) == 6 && llmc::param_slab(plan, qkvw, 7) == -1 &&
            llmc::param_slab(plan, qkvw, 8) == 7 && llmc::param_slab(plan, qkvw, 11) == 10 &&
            llmc::param_slab_size(plan, qkvw) == 3 * C * C && llmc::param_slab(plan, t[llmc::kFcw], 7) == 7 &&
            llmc::param_slab(plan, t[llmc::kLambdas], 7) == 7 && llmc::param_slab(plan, t[llmc::kWte], 7) == 0 &&
            llmc::param_slab(plan, t[llmc::kValueScales], 7) == -1 &&
            llmc::param_slab_size(plan, t[llmc::kValueScales]) == 2,
        "speedrun slabs: attention tensors skip layer 7 (layer 8 reads slab 7), the MLP's and lambdas "
        "have all 12");
  bool seeds_kept = llmc::param_seed_index(llmc::kLnew) == 18;
  for (int i = 0; i < 19; i++) {
    if (i != llmc::kLnew) seeds_kept = seeds_kept && llmc::param_seed_index(i) == (i > llmc::kLnew ? i - 1 : i);
  }
  std::vector<int> indices;
  for (int i = 0; i < llmc::kNumParamTensors; i++) indices.push_back(llmc::param_seed_index(i));
  for (int g = 0; g < llmc::kMaxMuonGroups; g++) indices.push_back(llmc::muon_group_seed_index(g));
  std::sort(indices.begin(), indices.end());
  // The speedrun's in the order they joined the table (the bigram table since placed after ve).
  const int joined[] = {llmc::kVe, llmc::kAttngate, llmc::kSkipw, llmc::kLambdas, llmc::kValueScales,
                        llmc::kSmearw, llmc::kSmearLambda, llmc::kBigram, llmc::kBigramGates, llmc::kVegate,
                        llmc::kResidLambdas, llmc::kPostLambdas, llmc::kXsaAlpha, llmc::kX0Gates, llmc::kSkipGate,
                        llmc::kHeadGates, llmc::kAttnLambdas, llmc::kMuddGateW1, llmc::kMuddGateW2,
                        llmc::kMuddGateB2, llmc::kMuddGateScale};
  for (int k = 0; k < 21; k++) seeds_kept = seeds_kept && llmc::param_seed_index(joined[k]) == 35 + k;
  check_verbose(seeds_kept && llmc::muon_group_seed_index(0) == 19 && llmc::param_seed_index(llmc::kVe) == 35 &&
                    std::adjacent_find(indices.begin(), indices.end()) == indices.end(),
                llmc::strformat("rounding seeds: the 19 tensors' and Muon's groups' (19 + g) as before, the "
                                "speedrun's 35-55 in the order they joined (bigram %d, bigram_gates %d, vegate %d, "
                                "xsa_alpha %d, x0_gates %d, skip_gate %d, head_gates %d, attn_lambdas %d), no two "
                                "alike",
                                llmc::param_seed_index(llmc::kBigram), llmc::param_seed_index(llmc::kBigramGates),
                                llmc::param_seed_index(llmc::kVegate), llmc::param_seed_index(llmc::kXsaAlpha),
                                llmc::param_seed_index(llmc::kX0Gates), llmc::param_seed_index(llmc::kSkipGate),
                                llmc::param_seed_index(llmc::kHeadGates),
                                llmc::param_seed_index(llmc::kAttnLambdas)));
  check_throws([] { llmc::muon_group_seed_index(llmc::kMaxMuonGroups); }, "room for 16 groups",
               "a Muon group beyond the seeds' room");
  const std::vector<float> init = llmc::init_params_from_seed(tiny, 3);
  t = table_of(tiny);
  auto values = [&](int i) {
    return std::vector<float>(init.begin() + t.offsets[i], init.begin() + t.offsets[i] + t[i].size);
  };
  const std::vector<float> lambdas = values(llmc::kLambdas), scales = values(llmc::kValueScales);
  const std::vector<float> skips = values(llmc::kSkipw), head = values(llmc::kHeadw);
  bool lambdas_one_zero = true;
  for (size_t l = 0; l < L; l++) lambdas_one_zero = lambdas_one_zero && lambdas[2 * l] == 1 && lambdas[2 * l + 1] == 0;
  check(lambdas_one_zero && std::all_of(scales.begin(), scales.end(), [](float x) { return x == 0.5f; }) &&
            std::all_of(skips.begin(), skips.end(), [](float x) { return x == 1.0f; }) &&
            std::all_of(head.begin(), head.end(), [](float x) { return x == 0.0f; }),
        "speedrun init: lambdas (1, 0), value scales 0.5, skips one, head zero");
}

// Record #89's bigram embedding on top of the smear: its table [Vp 15 / 2, C] (the embeddings' role)
// right after the value embeddings, and a gate for each attention layer (the scalars'), last; zero
// and 0.05 at init; both features in header slot 9.
void test_bigram_table(llmc::GPT2Config c) {
  const size_t smeared = llmc::num_parameters(c);
  c.bigram = true;
  const ParamTable t = table_of(c);
  const std::vector<float> init = llmc::init_params_from_seed(c, 3);
  const size_t rows = 50304 * 15 / 2, table = rows * 128;
  const auto bigram = init.begin() + t.offsets[llmc::kBigram], gates = init.begin() + t.offsets[llmc::kBigramGates];
  const bool zero = std::all_of(bigram, bigram + table, [](float x) { return x == 0.0f; });
  const bool gates_start = std::all_of(gates, init.end(), [](float x) { return x == llmc::kBigramGateInit; });
  check_verbose(llmc::num_parameters(c) == smeared + table + 11 && t[llmc::kBigram].size == table &&
                    t.offsets[llmc::kBigram] == t.offsets[llmc::kVe] + t[llmc::kVe].size &&
                    t[llmc::kBigramGates].size == 11 &&
                    t.offsets[llmc::kBigramGates] + 11 == init.size() && zero && gates_start &&
                    t[llmc::kBigram].role == llmc::ParamRole::kEmbedding &&
                    t[llmc::kBigramGates].role == llmc::ParamRole::kVector &&
                    llmc::param_slab(llmc::layer_plan(c), t[llmc::kBigramGates], 8) == 7,
                llmc::strformat("bigram: %zu parameters (%zu + %zu rows x 128 + 11), the table after ve, zero "
                                "(embeddings' role), 11 gates 0.05 last (scalars'), layer 8's the 8th",
                                llmc::num_parameters(c), smeared, rows));
  check(header_holds(c, llmc::kFeatureSmear | llmc::kFeatureBigram, "both.bin"),
        "smear and bigram: header slot 9 holds 3 and reads back the same config");
}

// The bigram table at a multiple of 16 elements (its rows' 16-byte loads in either precision), with
// and without the smear, at tiny and at d12 (whose tensors before the smear's end 4 elements past a
// multiple of 8), and the table's order with both features.
void test_bigram_alignment() {
  for (const char* preset : {"tiny", "d12"}) {
    for (bool smear : {false, true}) {
      llmc::GPT2Config c = speedrun_preset(preset);
      c.smear = smear;
      c.bigram = true;
      const ParamTable t = table_of(c);
      const std::string want = std::string("wte qkvw attprojw fcw fcprojw headw ve bigram attngate skipw lambdas "
                                           "value_scales ") + (smear ? "smearw smear_lambda " : "") + "bigram_gates";
      check_verbose(t.offsets[llmc::kBigram] % 16 == 0 && t.order() == want,
                    llmc::strformat("speedrun %s%s -bg 1: the bigram table at %zu (%zu mod 16), tensors %s", preset,
                                    smear ? " -sm 1" : "", t.offsets[llmc::kBigram], t.offsets[llmc::kBigram] % 16,
                                    t.order().c_str()));
    }
  }
}

// Record #89's value-embedding gates (-vg 1): vegate [6, NH, 12], a row for each layer with a value
// embedding (0-2 and 9-11) in layer order, the scalars' role, last in the table, zero at init; every
// other tensor where it was without them; header slot 9's bit 4. At tiny and d12, alone and with the
// smear and the bigram embedding (-sm 1 -bg 1).
void test_ve_gate_table() {
  for (const char* preset : {"tiny", "d12"}) {
    for (bool embedding : {false, true}) {
      llmc::GPT2Config c = speedrun_preset(preset);
      c.smear = c.bigram = embedding;
      const auto [before, t] = tables_around(c, &llmc::GPT2Config::ve_gates);
      const size_t rows = 6, NH = c.num_heads, size = rows * NH * 12;
      const std::string want = std::string("wte qkvw attprojw fcw fcprojw headw ve ") + (embedding ? "bigram " : "") +
                               "attngate skipw lambdas value_scales " +
                               (embedding ? "smearw smear_lambda bigram_gates " : "") + "vegate";
      const llmc::ParamSpec& g = t[llmc::kVegate];
      const llmc::LayerPlan plan = llmc::layer_plan(c);
      const bool slabs_ok = plan.value_embedding_layers == 6 && llmc::param_slab_size(plan, g) == NH * 12 &&
                            slabs_are(plan, g, {0, 1, 2, -1, -1, -1, -1, -1, -1, 3, 4, 5});
      check_verbose(t.appended(before, llmc::kVegate, size) && t.order() == want &&
                        g.role == llmc::ParamRole::kVector &&
                        g.stack == llmc::ParamStack::kValueEmbeddingLayers && slabs_ok,
                    llmc::strformat("speedrun %s%s -vg 1: vegate [6, %zu, 12] at %zu (%zu parameters before it), "
                                    "slabs 0-2 in layers 0-2 and 3-5 in 9-11, every other offset kept; tensors %s",
                                    preset, embedding ? " -sm 1 -bg 1" : "", NH, t.offsets[llmc::kVegate], before.count,
                                    t.order().c_str()));
      const int features = llmc::kFeatureVeGates | (embedding ? llmc::kFeatureSmear | llmc::kFeatureBigram : 0);
      check(header_holds(c, features, "vegate.bin"),
            llmc::strformat("speedrun %s%s -vg 1: header slot 9 holds %d and reads back the same config", preset,
                            embedding ? " -sm 1 -bg 1" : "", features));
      if (std::string(preset) != "tiny" || embedding) continue;  // the init's draws: once, at tiny
      check(init_appends_zeros(before, t),
            "speedrun tiny -vg 1: the gates' weights zero at init, every other value as without them");
    }
  }
}

// Record #89's residual and post lambdas: [L, 2] each after every other tensor, at tiny and d12, alone
// and with the smear and the bigram embedding: no other tensor's offset or rounding seed moves (the
// bigram table's offset still a multiple of 16), theirs 45 and 46; the scalars' role; sqrt(1.1) and
// 1 at init; header slot 9's bit 16.
void test_resid_lambdas_table() {
  for (const char* preset : {"tiny", "d12"}) {
    for (bool features : {false, true}) {
      llmc::GPT2Config c = speedrun_preset(preset);
      c.smear = c.bigram = features;
      const auto [before, t] = tables_around(c, &llmc::GPT2Config::resid_lambdas);
      const size_t L = c.num_layers, n = t.count, n_before = before.count;
      const std::vector<float> init = llmc::init_params_from_seed(c, 3);
      const auto resid = init.begin() + t.offsets[llmc::kResidLambdas];
      const auto post = init.begin() + t.offsets[llmc::kPostLambdas];
      const bool starts = std::all_of(resid, resid + 2 * L, [](float x) { return x == (float)std::sqrt(1.1); }) &&
                          std::all_of(post, post + 2 * L, [](float x) { return x == 1.0f; });
      check_verbose(t.kept_before(before, llmc::kResidLambdas) && n == n_before + 4 * L &&
                        t.offsets[llmc::kResidLambdas] == n_before &&
                        t.offsets[llmc::kPostLambdas] == n_before + 2 * L && t[llmc::kResidLambdas].size == 2 * L &&
                        t[llmc::kPostLambdas].size == 2 * L && t.offsets[llmc::kBigram] % 16 == 0 && starts &&
                        t[llmc::kResidLambdas].role == llmc::ParamRole::kVector &&
                        t[llmc::kPostLambdas].role == llmc::ParamRole::kVector &&
                        llmc::param_slab(llmc::layer_plan(c), t[llmc::kPostLambdas], 7) == 7 &&
                        llmc::param_seed_index(llmc::kResidLambdas) == 45 &&
                        llmc::param_seed_index(llmc::kPostLambdas) == 46,
                    llmc::strformat("speedrun %s%s -rl 1: %zu parameters (%zu + 4 x %zu), resid_lambdas at %zu and "
                                    "post_lambdas at %zu last, the others where they were (bigram at %zu mod 16 = "
                                    "%zu), seeds 45 and 46, sqrt(1.1) and 1 at init", preset,
                                    features ? " -sm 1 -bg 1" : "", n, n_before, L, t.offsets[llmc::kResidLambdas],
                                    t.offsets[llmc::kPostLambdas], t.offsets[llmc::kBigram],
                                    t.offsets[llmc::kBigram] % 16));
      const int bits = llmc::kFeatureResidLambdas | (features ? llmc::kFeatureSmear | llmc::kFeatureBigram : 0);
      check(header_holds(c, bits, "lambdas.bin"),
            llmc::strformat("-rl 1%s: header slot 9 holds %d and reads back the same config",
                            features ? " -sm 1 -bg 1" : "", bits));
    }
  }
}

// A modern model's header naming a speedrun-only feature (header slot 9's bit `feature`) is refused.
void check_modern_header_refuses(int feature, const char* what) {
  llmc::GPT2Config modern;
  llmc::config_from_preset("tiny", &modern, llmc::Arch::kModern);
  int h[llmc::kHeaderInts];
  llmc::header_from_config(modern, llmc::kCheckpointVersionBF16, h);
  h[llmc::kFeaturesSlot] = feature;
  check_throws([&] { llmc::config_from_header(h, "features.bin"); },
               llmc::strformat("slot 9 holds features %d", feature),
               llmc::strformat("a modern model's header naming %s is refused", what));
}

// Record #89's XSA (-xs 1): xsa_alpha [3, NH], a row for each XSA layer (1, 3, 4: the reference's 1,
// 3, 4 and 7, ours 7 without attention) in layer order, the scalars' role, last in the table, zero at
// init, its rounding seed after post_lambdas'; every other tensor where it was without it; header slot 9's
// bit 32. At tiny and d12, alone and with the smear, the bigram embedding and the value-embedding gates
// (-sm 1 -bg 1 -vg 1).
void test_xsa_table() {
  for (const char* preset : {"tiny", "d12"}) {
    for (bool others : {false, true}) {
      llmc::GPT2Config c = speedrun_preset(preset);
      c.smear = c.bigram = c.ve_gates = others;
      const auto [before, t] = tables_around(c, &llmc::GPT2Config::xsa);
      const size_t rows = 3, NH = c.num_heads, size = rows * NH;
      const std::string want = std::string("wte qkvw attprojw fcw fcprojw headw ve ") + (others ? "bigram " : "") +
                               "attngate skipw lambdas value_scales " +
                               (others ? "smearw smear_lambda bigram_gates vegate " : "") + "xsa_alpha";
      const llmc::ParamSpec& x = t[llmc::kXsaAlpha];
      const llmc::LayerPlan plan = llmc::layer_plan(c);
      const std::vector<int> slabs = {-1, 0, -1, 1, 2, -1, -1, -1, -1, -1, -1, -1};
      bool slabs_ok = plan.xsa_layers == 3 && llmc::param_slab_size(plan, x) == NH && slabs_are(plan, x, slabs);
      for (int l = 0; l < 12; l++) slabs_ok = slabs_ok && plan[l].xsa == (slabs[l] >= 0);
      check_verbose(t.appended(before, llmc::kXsaAlpha, size) && t.order() == want &&
                        x.role == llmc::ParamRole::kVector &&
                        x.stack == llmc::ParamStack::kXsaLayers && slabs_ok &&
                        llmc::param_seed_index(llmc::kXsaAlpha) == llmc::param_seed_index(llmc::kPostLambdas) + 1,
                    llmc::strformat("speedrun %s%s -xs 1: xsa_alpha [3, %zu] at %zu (%zu parameters before it), "
                                    "slabs 0-2 in layers 1, 3, 4, seed %d after post_lambdas', every other offset kept; "
                                    "tensors %s", preset, others ? " -sm 1 -bg 1 -vg 1" : "", NH,
                                    t.offsets[llmc::kXsaAlpha], before.count, llmc::param_seed_index(llmc::kXsaAlpha),
                                    t.order().c_str()));
      const int features =
          llmc::kFeatureXsa | (others ? llmc::kFeatureSmear | llmc::kFeatureBigram | llmc::kFeatureVeGates : 0);
      check(header_holds(c, features, "xsa.bin"),
            llmc::strformat("speedrun %s%s -xs 1: header slot 9 holds %d and reads back the same config", preset,
                            others ? " -sm 1 -bg 1 -vg 1" : "", features));
      if (std::string(preset) != "tiny") continue;  // the init's draws: at tiny
      check(init_appends_zeros(before, t),
            llmc::strformat("speedrun tiny%s -xs 1: the strengths zero at init, every other value as without them",
                            others ? " -sm 1 -bg 1 -vg 1" : ""));
    }
  }
  check_modern_header_refuses(llmc::kFeatureXsa, "XSA");
}

// Record #89's attention lambdas (-al 1): attn_lambdas [L, 2] last (a pair a layer, layer 6's of the
// plan unused), the scalars' role, its rounding seed after head_gates', (0.5, 1) at init; header slot 9's
// bit 256; describe() names them; with record #89's plan and record #28's layers.
void test_attn_lambdas_table() {
  for (bool plan : {true, false}) {
    llmc::GPT2Config c = speedrun_preset("tiny");
    llmc::set_record89_plan(c, plan);
    const auto [before, t] = tables_around(c, &llmc::GPT2Config::attn_lambdas);
    const size_t L = c.num_layers, n = t.count;
    const llmc::ParamSpec& s = t[llmc::kAttnLambdas];
    const llmc::LayerPlan layers = llmc::layer_plan(c);
    bool slabs_ok = llmc::param_slab_size(layers, s) == 2;
    for (int l = 0; l < (int)L; l++) slabs_ok = slabs_ok && llmc::param_slab(layers, s, l) == l;
    check(t.appended(before, llmc::kAttnLambdas, 2 * L) && std::string(s.name) == "attn_lambdas" &&
              s.stack == llmc::ParamStack::kLayers &&
              s.role == llmc::ParamRole::kVector && slabs_ok && llmc::arch_spec(c).attn_lambdas &&
              !llmc::arch_spec(llmc::Arch::kSpeedrun).attn_lambdas &&
              llmc::param_seed_index(llmc::kAttnLambdas) == llmc::param_seed_index(llmc::kHeadGates) + 1,
          llmc::strformat("speedrun tiny%s -al 1: %zu parameters (%zu + 2 x %zu), attn_lambdas [%zu] last, a "
                          "pair a layer, the scalars' role, its seed after head_gates'",
                          plan ? " -lp 1" : "", n, before.count, L, s.size));
    const std::vector<float> init = llmc::init_params_from_seed(c, 3);
    bool init_ok = true;
    for (size_t l = 0; l < L; l++) {
      init_ok = init_ok && init[t.offsets[llmc::kAttnLambdas] + 2 * l] == 0.5f &&
                init[t.offsets[llmc::kAttnLambdas] + 2 * l + 1] == 1.0f;
    }
    check(init_ok, llmc::strformat("speedrun tiny%s -al 1 init: (0.5, 1) in every layer", plan ? " -lp 1" : ""));
    const int features = llmc::kFeatureAttnLambdas | (plan ? llmc::kFeatureRecord89Plan : 0);
    const std::string text = c.describe();
    check(header_holds(c, features, "al.bin") && llmc::kFeatureAttnLambdas == 256 && text.size() > 13 &&
              text.substr(text.size() - 13) == " attn-lambdas",
          llmc::strformat("speedrun tiny%s -al 1: header slot 9 holds %d and reads back the same config (%s)",
                          plan ? " -lp 1" : "", features, text.c_str()));
  }
  check_modern_header_refuses(llmc::kFeatureAttnLambdas, "the attention lambdas");
}

// Whether the tensors are whole, in the scalars' role, their rounding seeds in table order after `after`'s.
bool scalars_after(const llmc::ParamSpec* t, std::initializer_list<int> tensors, int after) {
  bool ok = true;
  for (int i : tensors) {
    ok = ok && t[i].role == llmc::ParamRole::kVector && t[i].stack == llmc::ParamStack::kWhole &&
         llmc::param_seed_index(i) == llmc::param_seed_index(after) + (i - after);
  }
  return ok;
}

// Record #89's composed attention: no tensors of its own (its weights are the post gate generator's
// columns 29 and 35 on, layer 10's), header slot 9's bit 2048 read back, refused without the MUDD gate
// generators.
void test_composed_attention_config() {
  llmc::GPT2Config c;
  llmc::config_from_preset("tiny", &c, llmc::Arch::kSpeedrun);
  llmc::set_record89_plan(c, true);
  c.mudd_gates = true;
  const size_t without = llmc::num_parameters(c);
  c.composed_attention = true;
  int h[llmc::kHeaderInts];
  llmc::header_from_config(c, llmc::kCheckpointVersionBF16, h);
  const std::string d = c.describe();
  check(llmc::num_parameters(c) == without && h[llmc::kFeaturesSlot] == (llmc::kFeatureRecord89Plan | 512 | 2048) &&
            llmc::config_from_header(h, "ca.bin") == c && d.substr(d.size() - 19) == " composed-attention" &&
            llmc::arch_spec(c).composed_attention && llmc::composed_attention_missing(c) == nullptr,
        "speedrun tiny -lp 1 -mg 1 with the composed attention: no tensors of its own, header slot 9 holds "
        "64 | 512 | 2048 and reads back");
  const llmc::MuddGateColumn in = llmc::mudd_gate_column(llmc::kMuddComposedIn, 10);
  const llmc::MuddGateColumn out = llmc::mudd_gate_column(llmc::kMuddComposedOut, 10);
  check(in.generator == 1 && in.column == 29 && out.generator == 1 && out.column == 35 &&
            llmc::mudd_gate_column(llmc::kMuddComposedIn, 9).generator < 0 && llmc::kComposedWindow == 112,
        "the composed attention's w_in and w_out: the post generator's columns 29 and 35 on, layer 10's alone; "
        "a window of 112 keys");
  h[llmc::kFeaturesSlot] = llmc::kFeatureRecord89Plan | 2048;
  check_throws([&] { llmc::config_from_header(h, "ca.bin"); },
               "composed attention, which needs the MUDD gate generators",
               "a header naming the composed attention without the MUDD gate generators is refused");
}

// Record #89's MUDD dense connections (in its plan, with the gate generators here): mudd_w1 [2, 64, C],
// mudd_w2 [2, 14, 64] and mudd_b2 [2, 14] after mudd_gate_scale, the scalars' role, their seeds after its;
// W1 drawn in +-1/sqrt(C) after the gate generators' W1 (whose draws stay as without them), W2 zero, b2 the
// reference's start over its 0.1; header slot 9's bit 1024, refused without the plan or with an odd number
// of heads.
void test_mudd_connections_table() {
  llmc::GPT2Config c;
  llmc::config_from_preset("tiny", &c, llmc::Arch::kSpeedrun);
  llmc::set_record89_plan(c, true);
  c.mudd_gates = true;
  const size_t without = llmc::num_parameters(c);
  const std::vector<float> gates_only = llmc::init_params_from_seed(c, 3);
  c.mudd_connections = true;
  const ParamTable t = table_of(c);
  const size_t* offsets = t.offsets;
  const size_t C = c.channels, n = t.count, w1 = 2 * 64 * C, w2 = 2 * 14 * 64, b2 = 2 * 14;
  const bool roles = scalars_after(t.specs, {llmc::kMuddW1, llmc::kMuddW2, llmc::kMuddB2}, llmc::kMuddGateScale);
  check_verbose(roles && n == without + w1 + w2 + b2 && t[llmc::kMuddW1].size == w1 &&
                    t[llmc::kMuddW2].size == w2 && t[llmc::kMuddB2].size == b2 && offsets[llmc::kMuddW1] == without &&
                    offsets[llmc::kMuddB2] == n - b2 && std::string(t[llmc::kMuddW2].name) == "mudd_w2",
                llmc::strformat("speedrun tiny -lp 1 -mg 1 with the dense connections: %zu parameters (%zu "
                                "without), their three tensors last, the scalars' role, seeds after "
                                "mudd_gate_scale's", n, without));
  const std::vector<float> init = llmc::init_params_from_seed(c, 3);
  const float* pw1 = init.data() + offsets[llmc::kMuddW1];
  const float* pb2 = init.data() + offsets[llmc::kMuddB2];
  const float bound = (float)(1.0 / std::sqrt((double)C)), r = (float)(std::sqrt(1.1) / 0.1);
  bool drawn = std::equal(gates_only.begin(), gates_only.end(), init.begin());
  for (size_t k = 0; k < w1; k++) drawn = drawn && pw1[k] != 0.0f && std::fabs(pw1[k]) <= bound;
  const bool w2_zero = std::all_of(init.begin() + offsets[llmc::kMuddW2],
                                   init.begin() + offsets[llmc::kMuddW2] + w2, [](float x) { return x == 0.0f; });
  const bool bias = pb2[0] == 0.0f && pb2[5] == 0.0f && pb2[6] == 20.0f && pb2[7] == 20.0f && pb2[8] == r &&
                    pb2[9] == 10.0f && pb2[10] == 0.0f && pb2[11] == (float)(0.05 / 0.1) && pb2[12] == r &&
                    pb2[13] == 10.0f && pb2[14] == 0.0f && pb2[15] == -5.0f && pb2[16] == 0.0f && pb2[27] == 0.0f;
  check_verbose(drawn && w2_zero && bias,
                llmc::strformat("speedrun tiny -lp 1 -mg 1 with the dense connections, init: the rest as without "
                                "them, W1 in +-%g (first %g), W2 zero, b2 the reference's (ve gates %g, r %g, p %g, "
                                "bigram gate %g; the final out7 %g)",
                                bound, pw1[0], pb2[6], pb2[8], pb2[9], pb2[11], pb2[15]));
  int h[llmc::kHeaderInts];
  llmc::header_from_config(c, llmc::kCheckpointVersionBF16, h);
  const std::string d = c.describe();
  check(h[llmc::kFeaturesSlot] == (llmc::kFeatureRecord89Plan | 512 | 1024) &&
            llmc::config_from_header(h, "md.bin") == c && d.substr(d.size() - 17) == " mudd-connections" &&
            llmc::mudd_connections_missing(c) == nullptr,
        "speedrun tiny -lp 1 -mg 1 with the dense connections: header slot 9 holds 64 | 512 | 1024 and reads back");
  h[llmc::kFeaturesSlot] = 1024;
  h[4] = 12;
  check_throws([&] { llmc::config_from_header(h, "md.bin"); }, "MUDD dense connections, which need record #89's plan",
               "a header naming the MUDD dense connections without the plan is refused");
  h[llmc::kFeaturesSlot] = llmc::kFeatureRecord89Plan | 1024;
  h[4] = 11;
  h[5] = 3;
  h[6] = 192;
  check_throws([&] { llmc::config_from_header(h, "md.bin"); }, "which need an even number of heads",
               "a header naming the MUDD dense connections over 3 heads is refused");
}

// Record #89's MUDD gate generators (-mg 1, in its plan): mudd_gate_w1 [2, 64, C], mudd_gate_w2 [2, 41, 64],
// mudd_gate_b2 [2, 41] and mudd_gate_scale [1] after head_gates, the scalars' role, their seeds after
// head_gates'; W1 drawn in +-1/sqrt(C), W2 zero, b2 the reference's start over the scale 0.1; header slot 9's
// bit 512, refused without the plan; the gates' columns as the reference's layout.
void test_mudd_gates_table() {
  llmc::GPT2Config c;
  llmc::config_from_preset("tiny", &c, llmc::Arch::kSpeedrun);
  llmc::set_record89_plan(c, true);
  const size_t without = llmc::num_parameters(c);
  c.mudd_gates = true;
  llmc::ParamSpec t[llmc::kNumParamTensors];
  size_t offsets[llmc::kNumParamTensors];
  llmc::param_table(c, t);
  llmc::param_offsets(c, offsets);
  const size_t C = c.channels, n = llmc::num_parameters(c);
  const size_t w1 = 2 * 64 * C, w2 = 2 * 41 * 64, b2 = 2 * 41;
  const bool roles = scalars_after(
      t, {llmc::kMuddGateW1, llmc::kMuddGateW2, llmc::kMuddGateB2, llmc::kMuddGateScale}, llmc::kHeadGates);
  check_verbose(roles && n == without + w1 + w2 + b2 + 1 && t[llmc::kMuddGateW1].size == w1 &&
                    t[llmc::kMuddGateW2].size == w2 && t[llmc::kMuddGateB2].size == b2 &&
                    t[llmc::kMuddGateScale].size == 1 && offsets[llmc::kMuddGateW1] == without &&
                    offsets[llmc::kMuddGateScale] == n - 1 && std::string(t[llmc::kMuddGateB2].name) == "mudd_gate_b2",
                llmc::strformat("speedrun tiny -lp 1 -mg 1: %zu parameters (%zu without), the generators' four "
                                "tensors last, the scalars' role, seeds after head_gates'", n, without));
  const std::vector<float> init = llmc::init_params_from_seed(c, 3);
  const float* pw1 = init.data() + offsets[llmc::kMuddGateW1];
  const float* pb2 = init.data() + offsets[llmc::kMuddGateB2];
  const float bound = (float)(1.0 / std::sqrt((double)C));
  bool drawn = true;
  for (size_t k = 0; k < w1; k++) drawn = drawn && pw1[k] != 0.0f && std::fabs(pw1[k]) <= bound;
  const bool w2_zero = std::all_of(init.begin() + offsets[llmc::kMuddGateW2],
                                   init.begin() + offsets[llmc::kMuddGateW2] + w2, [](float x) { return x == 0.0f; });
  const bool bias = pb2[12] == 2.5f && pb2[17] == 2.5f && pb2[18] == 0.0f && pb2[19] == 0.5f && pb2[25] == 0.5f &&
                    pb2[26] == 0.0f && pb2[40] == 0.0f && pb2[41 + 12] == 2.5f && pb2[41 + 27] == 0.5f &&
                    pb2[41 + 28] == 5.0f && pb2[41 + 29] == 10.0f && pb2[41 + 34] == 10.0f && pb2[41 + 35] == 0.0f &&
                    pb2[41 + 18] == 0.0f && pb2[0] == 0.0f;
  check_verbose(drawn && w2_zero && bias && init[offsets[llmc::kMuddGateScale]] == 0.1f,
                llmc::strformat("speedrun tiny -lp 1 -mg 1 init: W1 in +-%g (first %g), W2 zero, b2 the "
                                "reference's (pre 12 %g, 19 %g; post 28 %g, 29 %g), scale %g",
                                bound, pw1[0], pb2[12], pb2[19], pb2[41 + 28], pb2[41 + 29],
                                init[offsets[llmc::kMuddGateScale]]));
  using llmc::mudd_gate_column;
  auto at = [](llmc::MuddGateColumn g, int generator, int column) {
    return g.generator == generator && (generator < 0 || g.column == column);
  };
  check(at(mudd_gate_column(llmc::kMuddXsa, 1), 0, 0) && at(mudd_gate_column(llmc::kMuddXsa, 3), 0, 6) &&
            at(mudd_gate_column(llmc::kMuddHeadGate, 3), 0, 12) && at(mudd_gate_column(llmc::kMuddX0, 0), 0, 18) &&
            at(mudd_gate_column(llmc::kMuddBigram, 0), 0, 19) && at(mudd_gate_column(llmc::kMuddBigram, 3), 0, 25) &&
            at(mudd_gate_column(llmc::kMuddXsa, 4), 1, 0) && at(mudd_gate_column(llmc::kMuddXsa, 7), 1, 6) &&
            at(mudd_gate_column(llmc::kMuddHeadGate, 10), 1, 12) && at(mudd_gate_column(llmc::kMuddX0, 4), 1, 18) &&
            at(mudd_gate_column(llmc::kMuddBigram, 5), 1, 21) && at(mudd_gate_column(llmc::kMuddX0, 7), 1, 22) &&
            at(mudd_gate_column(llmc::kMuddBigram, 9), 1, 27) && at(mudd_gate_column(llmc::kMuddSkip, 6), 1, 28) &&
            at(mudd_gate_column(llmc::kMuddX0, 10), -1, 0) && at(mudd_gate_column(llmc::kMuddBigram, 10), -1, 0) &&
            at(mudd_gate_column(llmc::kMuddXsa, 0), -1, 0) && at(mudd_gate_column(llmc::kMuddX0, 6), -1, 0),
        "MUDD gate columns: the reference's pre and post layouts; layer 10's x0 and bigram gates scalars");
  int h[llmc::kHeaderInts];
  llmc::header_from_config(c, llmc::kCheckpointVersionBF16, h);
  const std::string d = c.describe();
  check(h[llmc::kFeaturesSlot] == (llmc::kFeatureRecord89Plan | 512) && llmc::config_from_header(h, "mg.bin") == c &&
            d.substr(d.size() - 11) == " mudd-gates" && llmc::mudd_gates_missing(c) == nullptr,
        "speedrun tiny -lp 1 -mg 1: header slot 9 holds 64 | 512 and reads back the same config");
  h[llmc::kFeaturesSlot] = 512;
  h[4] = 12;
  check_throws([&] { llmc::config_from_header(h, "mg.bin"); }, "MUDD gate generators, which need record #89's plan",
               "a header naming the MUDD gates without the plan is refused");
}

// Record #89's plan (-lp 1): 11 layers; no x0 lambdas, attention gates or skip weights; five value
// embeddings and one value scale an attention layer (the value mix's b, without a); x0_gates [10] (one an attention layer, the scalars' role, zero at init), skip_gate [2]
// (skip_lambda -1.5 and g 0.5 at init) and head_gates [2, NH] (layers 3 and 10, 0.25 at init) last,
// their rounding seeds after xsa_alpha's; header slot 9's
// bit 64, whose depth the header's must match. At tiny and d12, alone and with XSA (4 layers: 1, 3, 4
// and 7, each with attention in this plan).
void test_record89_plan_table() {
  for (const char* preset : {"tiny", "d12"}) {
    for (bool xsa : {false, true}) {
      llmc::GPT2Config c = speedrun_preset(preset);
      llmc::set_record89_plan(c, true);
      c.xsa = xsa;
      const llmc::ArchSpec a = llmc::arch_spec(c);
      const ParamTable t = table_of(c);
      const size_t L = 11, La = 10, C = c.channels, Vp = c.padded_vocab_size, NH = c.num_heads;
      const size_t xsa_size = xsa ? 4 * NH : 0, n = llmc::num_parameters(c);
      // train_gpt2.py's count: wte, the head and 5 value embeddings; per layer 8 C^2 of the MLP; per
      // attention layer 4 C^2 and one value scale (b: no a in this plan's value mix); the x0 gates, the
      // skip gate and two layers' head gates.
      const size_t expected = 7 * Vp * C + L * 8 * C * C + La * (4 * C * C + 1) + xsa_size + La + 2 + 2 * NH;
      const std::string order = t.order();
      const std::string want = std::string("wte qkvw attprojw fcw fcprojw headw ve value_scales ") +
                               (xsa ? "xsa_alpha " : "") + "x0_gates skip_gate head_gates";
      const llmc::ParamSpec &gates = t[llmc::kX0Gates], &skip = t[llmc::kSkipGate], &heads = t[llmc::kHeadGates];
      check_verbose(c.num_layers == 11 && !a.x0_lambdas && a.x0_gates && !a.attention_gate &&
                        !llmc::value_mix_learns_a(a) && llmc::value_mix_learns_a(llmc::arch_spec(llmc::Arch::kSpeedrun)) &&
                        !llmc::arch_spec(llmc::Arch::kSpeedrun).x0_gates && n == expected && order == want &&
                        t[llmc::kVe].size == 5 * Vp * C && t[llmc::kAttngate].size == 0 &&
                        t[llmc::kLambdas].size == 0 && t[llmc::kSkipw].size == 0 &&
                        t[llmc::kValueScales].size == La && t[llmc::kXsaAlpha].size == xsa_size &&
                        gates.size == La && skip.size == 2 && heads.size == 2 * NH &&
                        t.offsets[llmc::kX0Gates] == n - La - 2 - 2 * NH &&
                        t.offsets[llmc::kSkipGate] == n - 2 - 2 * NH &&
                        t.offsets[llmc::kHeadGates] == n - 2 * NH,
                    llmc::strformat("speedrun %s -lp 1%s: %zu parameters (%zu), x0_gates [%zu] at %zu, skip_gate "
                                    "[%zu] at %zu, head_gates [%zu] at %zu; tensors %s", preset, xsa ? " -xs 1" : "", n,
                                    expected, gates.size, t.offsets[llmc::kX0Gates], skip.size,
                                    t.offsets[llmc::kSkipGate], heads.size, t.offsets[llmc::kHeadGates],
                                    order.c_str()));
      const llmc::LayerPlan plan = llmc::layer_plan(c);
      const int attention_slabs[] = {0, 1, 2, 3, 4, 5, -1, 6, 7, 8, 9};
      const int xsa_slabs[] = {-1, 0, -1, 1, 2, -1, -1, 3, -1, -1, -1};
      const int head_gate_slabs[] = {-1, -1, -1, 0, -1, -1, -1, -1, -1, -1, 1};
      bool slabs_ok = llmc::param_slab_size(plan, gates) == 1 && llmc::param_slab_size(plan, skip) == 2 &&
                      llmc::param_slab(plan, skip, 6) == 0 && plan.xsa_layers == 4 && plan.head_gate_layers == 2 &&
                      llmc::param_slab_size(plan, heads) == NH && heads.role == llmc::ParamRole::kVector;
      for (int l = 0; l < 11; l++) {
        slabs_ok = slabs_ok && llmc::param_slab(plan, gates, l) == attention_slabs[l] &&
                   llmc::param_slab(plan, t[llmc::kQkvw], l) == attention_slabs[l] &&
                   llmc::param_slab(plan, t[llmc::kXsaAlpha], l) == (xsa ? xsa_slabs[l] : plan[l].xsa_slab) &&
                   llmc::param_slab(plan, heads, l) == head_gate_slabs[l];
      }
      check(slabs_ok && gates.role == llmc::ParamRole::kVector && skip.role == llmc::ParamRole::kVector &&
                gates.stack == llmc::ParamStack::kAttentionLayers && skip.stack == llmc::ParamStack::kWhole &&
                llmc::param_seed_index(llmc::kX0Gates) == llmc::param_seed_index(llmc::kXsaAlpha) + 1 &&
                llmc::param_seed_index(llmc::kSkipGate) == llmc::param_seed_index(llmc::kXsaAlpha) + 2 &&
                llmc::param_seed_index(llmc::kHeadGates) == llmc::param_seed_index(llmc::kXsaAlpha) + 3,
            llmc::strformat("speedrun %s -lp 1%s: the x0 gates a slab an attention layer (layer 6 none, 7 slab "
                            "6), the skip gate whole, the head gates a slab of NH on layers 3 and 10, all the "
                            "scalars' role, seeds the three after xsa_alpha's",
                            preset, xsa ? " -xs 1" : ""));
      const int features = llmc::kFeatureRecord89Plan | (xsa ? llmc::kFeatureXsa : 0);
      check(header_holds(c, features, "plan.bin") && llmc::kFeatureRecord89Plan == 64 &&
                c.describe().size() > 14 && c.describe().substr(c.describe().size() - 14) == " record89-plan",
            llmc::strformat("speedrun %s -lp 1%s: header slot 9 holds %d and reads back the same config (%s)",
                            preset, xsa ? " -xs 1" : "", features, c.describe().c_str()));
      if (std::string(preset) != "tiny") continue;  // the init's values: at tiny
      const std::vector<float> init = llmc::init_params_from_seed(c, 3);
      auto all = [&](int i, float v) {
        return std::all_of(init.begin() + t.offsets[i], init.begin() + t.offsets[i] + t[i].size,
                           [v](float x) { return x == v; });
      };
      const float* fc = init.data() + t.offsets[llmc::kFcw];
      check_verbose(init.size() == n && all(llmc::kX0Gates, 0.0f) && all(llmc::kXsaAlpha, 0.0f) &&
                        all(llmc::kValueScales, 0.5f) && all(llmc::kHeadw, 0.0f) &&
                        init[t.offsets[llmc::kSkipGate]] == -1.5f && init[t.offsets[llmc::kSkipGate] + 1] == 0.5f &&
                        all(llmc::kHeadGates, 0.25f) &&
                        fc[0] != 0.0f && fc[t[llmc::kFcw].size - 1] != 0.0f,
                    llmc::strformat("speedrun tiny -lp 1%s init: the x0 gates zero (the first %g)%s, skip_gate "
                                    "(%g, %g) (-1.5, 0.5), head gates 0.25, value scales 0.5, head zero, fcw drawn "
                                    "in all 11 layers",
                                    xsa ? " -xs 1" : "", init[t.offsets[llmc::kX0Gates]],
                                    xsa ? llmc::strformat(", the XSA strengths zero (the first %g)",
                                                          init[t.offsets[llmc::kXsaAlpha]]).c_str() : "",
                                    init[t.offsets[llmc::kSkipGate]], init[t.offsets[llmc::kSkipGate] + 1]));
    }
  }
  // The header's depth must be the plan's: 11 layers with bit 64, 12 without.
  llmc::GPT2Config twelve, eleven = llmc::make_config(11, 2, 128, 1024, 50257, llmc::Arch::kSpeedrun);
  llmc::config_from_preset("tiny", &twelve, llmc::Arch::kSpeedrun);
  int h[llmc::kHeaderInts];
  llmc::header_from_config(twelve, llmc::kCheckpointVersionBF16, h);
  h[llmc::kFeaturesSlot] = llmc::kFeatureRecord89Plan;
  check_throws([&] { llmc::config_from_header(h, "plan.bin"); },
               "plan.bin: a speedrun model of 12 layers with record #89's plan (header slot 9's bit 64), whose depth "
               "is 11: the header is damaged",
               "a 12-layer speedrun's header naming record #89's plan is refused");
  llmc::header_from_config(eleven, llmc::kCheckpointVersionBF16, h);
  check_throws([&] { llmc::config_from_header(h, "plan.bin"); },
               "plan.bin: a speedrun model of 11 layers without record #89's plan (header slot 9's bit 64), whose "
               "depth is 12: the header is damaged",
               "an 11-layer speedrun's header without record #89's plan is refused");
  check_throws([] { llmc::make_config(10, 2, 128, 1024, 50257, llmc::Arch::kSpeedrun); },
               "invalid speedrun model config L=10 C=128: its references' 12 layers (record #28's; 11 record #89's)",
               "make_config: a speedrun of 10 layers is refused, of 11 (record #89's) and 12 taken");
  llmc::GPT2Config modern;
  llmc::config_from_preset("tiny", &modern, llmc::Arch::kModern);
  llmc::header_from_config(modern, llmc::kCheckpointVersionBF16, h);
  h[llmc::kFeaturesSlot] = llmc::kFeatureRecord89Plan;
  check_throws([&] { llmc::config_from_header(h, "plan.bin"); }, "slot 9 holds features 64",
               "a modern model's header naming record #89's plan is refused");
  llmc::GPT2Config back = eleven;
  llmc::set_record89_plan(back, true);
  const int eleven_layers = back.num_layers;
  llmc::set_record89_plan(back, false);
  llmc::set_record89_plan(modern, true);
  check(eleven_layers == 11 && back.num_layers == 12 && !back.record89_plan && modern.num_layers == 2 &&
            llmc::speedrun_layers(true) == 11 && llmc::speedrun_layers(false) == 12,
        "set_record89_plan: the speedrun's depth 11 with the plan and 12 without; a modern model's kept");
}

// Record #89's smear (SPEC.md "Record #89's embedding"): a speedrun config's switch, its two tensors
// after the value scales (zero at init, the scalars' role), and the header's slot 9 that carries it,
// refused where it names a feature that is not there or an architecture without any.
void test_smear_table() {
  llmc::GPT2Config tiny;
  llmc::config_from_preset("tiny", &tiny, llmc::Arch::kSpeedrun);
  const size_t plain = llmc::num_parameters(tiny);
  tiny.smear = true;
  const ParamTable t = table_of(tiny);
  const std::vector<float> init = llmc::init_params_from_seed(tiny, 3);
  const bool zero = std::all_of(init.begin() + t.offsets[llmc::kSmearw], init.end(), [](float x) { return x == 0.0f; });
  check_verbose(llmc::arch_spec(tiny).smear && !llmc::arch_spec(tiny.arch).smear &&
                    llmc::num_parameters(tiny) == plain + 13 && t[llmc::kSmearw].size == 12 &&
                    t[llmc::kSmearLambda].size == 1 && t.offsets[llmc::kSmearw] + 13 == init.size() && zero &&
                    t[llmc::kSmearw].role == llmc::ParamRole::kVector &&
                    t[llmc::kSmearLambda].role == llmc::ParamRole::kVector,
                llmc::strformat("smear: %zu parameters (%zu + 13), smearw [12] and smear_lambda [1] last, zero, "
                                "the scalars' role", llmc::num_parameters(tiny), plain));
  int h[llmc::kHeaderInts];
  llmc::header_from_config(tiny, llmc::kCheckpointVersionBF16, h);
  check(h[llmc::kFeaturesSlot] == llmc::kFeatureSmear && llmc::config_from_header(h, "smear.bin") == tiny,
        "smear: header slot 9 holds 1 and reads back the same config");
  test_bigram_table(tiny);
  test_bigram_alignment();
  test_ve_gate_table();
  test_resid_lambdas_table();
  test_xsa_table();
  test_record89_plan_table();
  test_attn_lambdas_table();
  test_mudd_gates_table();
  test_mudd_connections_table();
  test_composed_attention_config();
  h[llmc::kFeaturesSlot] = 4096;
  check_throws([&] { llmc::config_from_header(h, "smear.bin"); }, "slot 9 holds features 4096",
               "a header naming an unknown feature is refused");
  llmc::GPT2Config gpt2;
  llmc::config_from_preset("tiny", &gpt2);
  llmc::header_from_config(gpt2, llmc::kCheckpointVersionFP32, h);
  check(h[llmc::kFeaturesSlot] == 0, "GPT-2's header slot 9 holds 0, as llm.c's files");
  h[llmc::kFeaturesSlot] = llmc::kFeatureSmear;
  check_throws([&] { llmc::config_from_header(h, "gpt2.bin"); }, "only the speedrun has any",
               "a GPT-2 header with the smear is refused");
}

// Record #89's rotary layout (-rp 1): a header bit of the modern and speedrun models, which reads back
// into the config and the ArchSpec; GPT-2 has no rotary, and a header naming its pairs is refused.
void test_rotary_pairs_header() {
  int h[llmc::kHeaderInts];
  for (llmc::Arch arch : {llmc::Arch::kModern, llmc::Arch::kSpeedrun}) {
    llmc::GPT2Config c;
    llmc::config_from_preset("tiny", &c, arch);
    const llmc::GPT2Config plain = c;
    c.rotary_pairs = true;
    llmc::header_from_config(c, llmc::kCheckpointVersionBF16, h);
    const llmc::GPT2Config read = llmc::config_from_header(h, "pairs.bin");
    check(h[llmc::kFeaturesSlot] == llmc::kFeatureRotaryPairs && read == c && read != plain &&
              llmc::arch_spec(read).rotary_pairs && !llmc::arch_spec(arch).rotary_pairs &&
              llmc::num_parameters(c) == llmc::num_parameters(plain),
          llmc::strformat("rotary pairs (%s): header slot 9 holds 4 and reads back, no tensor more",
                          llmc::arch_spec(arch).name));
  }
  llmc::GPT2Config gpt2;
  llmc::config_from_preset("tiny", &gpt2);
  llmc::header_from_config(gpt2, llmc::kCheckpointVersionFP32, h);
  h[llmc::kFeaturesSlot] = llmc::kFeatureRotaryPairs;
  check_throws([&] { llmc::config_from_header(h, "gpt2.bin"); }, "GPT-2 has no rotary",
               "a GPT-2 header with the rotary pairs is refused");
}

// One line a plan: each layer's record as "A|- window ve skip:weight kept" (-1: none), and the counts.
std::string plan_text(const llmc::LayerPlan& plan) {
  std::string s;
  for (const llmc::LayerSpec& l : plan.layers) {
    s += llmc::strformat("%s%c%c%d,%d,%d:%d,%d", s.empty() ? "" : " ", l.attention ? 'A' : '-', (char)l.window,
                         l.attention_slab, l.value_embedding, l.skip_source, l.skip_weight, l.kept);
  }
  return s + llmc::strformat(" | %d %d %d %d", plan.attention_layers, plan.value_embeddings, plan.skip_weights,
                             plan.kept_outputs);
}

// The layer plans: the speedrun's reference's 12 layers; GPT-2's and the modern ones with the
// reference's windows at its depth and the long one at others; the windows' blocks; the key offset.
void test_layer_plan() {
  const std::string speedrun = plan_text(llmc::layer_plan(llmc::Arch::kSpeedrun, 12));
  check_verbose(speedrun == "AL0,0,-1:-1,0 AS1,1,-1:-1,1 AS2,2,-1:-1,2 AS3,-1,-1:-1,3 AL4,-1,-1:-1,4 "
                            "AS5,-1,-1:-1,5 AS6,-1,5:0,-1 -L-1,-1,4:1,-1 AS7,-1,3:2,-1 AS8,0,2:3,-1 "
                            "AS9,1,1:4,-1 AL10,2,0:5,-1 | 11 3 6 6",
                "speedrun plan (attention slab, value embedding, skip source:weight, kept slot): " + speedrun);
  const std::string gpt2 = plan_text(llmc::layer_plan(llmc::Arch::kGpt2, 12));
  check_verbose(gpt2 == "AL0,-1,-1:-1,-1 AS1,-1,-1:-1,-1 AS2,-1,-1:-1,-1 AS3,-1,-1:-1,-1 AL4,-1,-1:-1,-1 "
                        "AS5,-1,-1:-1,-1 AS6,-1,-1:-1,-1 AL7,-1,-1:-1,-1 AS8,-1,-1:-1,-1 AS9,-1,-1:-1,-1 "
                        "AS10,-1,-1:-1,-1 AL11,-1,-1:-1,-1 | 12 0 0 0",
                "GPT-2 d12 plan: attention everywhere, the reference's windows: " + gpt2);
  const std::string modern = plan_text(llmc::layer_plan(llmc::Arch::kModern, 12));
  check_verbose(modern == gpt2, "modern d12 plan as GPT-2's: " + modern);
  const std::string tiny = plan_text(llmc::layer_plan(llmc::Arch::kModern, 2));
  check_verbose(tiny == "AL0,-1,-1:-1,-1 AL1,-1,-1:-1,-1 | 2 0 0 0", "modern tiny plan: long windows: " + tiny);
  const llmc::LayerPlan d24 = llmc::layer_plan(llmc::Arch::kGpt2, 24), d13 = llmc::layer_plan(llmc::Arch::kGpt2, 13);
  check(d24.windows() == std::string(24, 'L') && d13.windows() == std::string(13, 'L') &&
            d24.attention_layers == 24 && d13.attention_layers == 13,
        "GPT-2 at 24 and 13 layers: attention and the long window in every layer");
  check_throws([] { llmc::layer_plan(llmc::Arch::kSpeedrun, 8); }, "the speedrun's layers are its reference's 12, not 8",
               "a speedrun plan of 8 layers");
  const llmc::LayerPlan plan = llmc::layer_plan(llmc::Arch::kSpeedrun, 12);
  std::string windows;
  for (const llmc::LayerSpec& l : plan.layers) windows += llmc::strformat(" %d", l.window_blocks(13, 6));
  check_verbose(windows == " 13 6 6 6 13 6 6 13 6 6 6 13" && plan.window_blocks_spanning(4, false) == 8 &&
                    plan.window_blocks_spanning(4, true) == 4 &&
                    llmc::layer_plan(llmc::Arch::kGpt2, 4).window_blocks_spanning(4, false) == 4,
                "layers of windows (6, 13):" + windows + "; the long window that spans 4 blocks: 8 with halves, 4 "
                "with a short one given or no short layers");
  const llmc::LayerPlan gpt2_12 = llmc::layer_plan(llmc::Arch::kGpt2, 12);
  check_verbose(plan.describe(true) == "12; attention AAAAAAA-AAAA; windows LSSSLSSLSSSL; value embeddings 0 1 "
                                       "2 - - - - - - 0 1 2; U-net skips from - - - - - - 5 4 3 2 1 0" &&
                    d24.describe(true) == "24" && gpt2_12.describe(true) == "12; windows LSSSLSSLSSSL" &&
                    gpt2_12.describe(false) == "12",
                "the start-up table's plan: " + plan.describe(true) + "; without a window: " + gpt2_12.describe(false));
  llmc::LayerPlan keyed = plan, tiny_keyed = llmc::layer_plan(llmc::Arch::kModern, 2);
  llmc::plan_key_offsets(keyed);
  llmc::plan_key_offsets(tiny_keyed);
  check_verbose(plan.key_offsets() == "------------" && keyed.key_offsets() == "K---K------K" &&
                    tiny_keyed.key_offsets() == "KK" && plan_text(keyed) == speedrun &&
                    keyed.describe(false) == plan.describe(false) + "; key offset K---K------K",
                "the key offset (-ko 1) on the long-window layers with attention: speedrun " + keyed.key_offsets() +
                    " (layer 7 has none), modern tiny " + tiny_keyed.key_offsets() + "; the rest of the plan kept");
}

// Record #89's plan (layer_plan(kSpeedrun, 11, true)): its lists; layer 6 without attention adds layer
// 3's output through the gate, layers 9 and 10 attend over layer 7's; those two outputs kept (slots 0,
// 1); no U-net skips; the key offset on its long-window layers 3 and 10. Its depth only, and record
// #28's plan at its own.
// Record #89's MUDD gate layouts: each (kind, layer) that a generator gives at its column, the others
// none; every column given once, within its generator's, at a layer whose plan has the gate.
void test_mudd_gate_columns() {
  const llmc::LayerPlan plan = llmc::layer_plan(llmc::Arch::kSpeedrun, 11, true);
  const llmc::MuddGate kinds[] = {llmc::kMuddXsa, llmc::kMuddHeadGate, llmc::kMuddX0, llmc::kMuddBigram,
                                  llmc::kMuddSkip};
  std::string layout;
  std::vector<int> owners[llmc::kMuddGenerators];
  for (int g = 0; g < llmc::kMuddGenerators; g++) owners[g].assign(llmc::kMuddGateColumns[g], 0);
  bool in_plan = true, within = true;
  for (llmc::MuddGate kind : kinds) {
    layout += " |";
    for (int l = -1; l <= 11; l++) {
      const llmc::MuddGateColumn at = llmc::mudd_gate_column(kind, l);
      if (l < 0 || l == 11) {
        within = within && at.generator == -1 && at.column == -1;
        continue;
      }
      layout += at.generator < 0 ? std::string(" -") : llmc::strformat(" %d:%d", at.generator, at.column);
      if (at.generator < 0) continue;
      const llmc::LayerSpec& s = plan.layers[l];
      in_plan = in_plan && (kind == llmc::kMuddXsa ? s.xsa : kind == llmc::kMuddHeadGate ? s.head_gate
                            : kind == llmc::kMuddSkip ? s.gated_skip_source >= 0 : s.attention);
      const int width = kind == llmc::kMuddXsa || kind == llmc::kMuddHeadGate ? llmc::kMuddGateHeads : 1;
      for (int c = at.column; c < at.column + width; c++) {
        within = within && c >= 0 && c < llmc::kMuddGateColumns[at.generator] && c < llmc::kMuddGateStride;
        if (within) owners[at.generator][c]++;
      }
    }
  }
  std::string counts;
  for (int g = 0; g < llmc::kMuddGenerators; g++) {
    counts += " |";
    for (int n : owners[g]) counts += llmc::strformat("%d", n);
  }
  check_verbose(layout == " | - 0:0 - 0:6 1:0 - - 1:6 - - - | - - - 0:12 - - - - - - 1:12"
                          " | 0:18 0:20 0:22 0:24 1:18 1:20 - 1:22 1:24 1:26 -"
                          " | 0:19 0:21 0:23 0:25 1:19 1:21 - 1:23 1:25 1:27 -"
                          " | - - - - - - 1:28 - - - -" &&
                    counts == " |11111111111111111111111111 |11111111111111111111111111111" + std::string(12, '0') &&
                    in_plan && within,
                "MUDD gate columns (generator:column by kind, layers 0-10): " + layout + "; columns' uses" + counts);
}

void test_record89_layer_plan() {
  const llmc::LayerPlan plan = llmc::layer_plan(llmc::Arch::kSpeedrun, 11, true);
  const std::string text = plan_text(plan);
  std::string gated, sources, xsa, head_gates;
  for (const llmc::LayerSpec& l : plan.layers) {
    head_gates += l.head_gate ? llmc::strformat(" %d", l.head_gate_slab) : std::string(" -");
    gated += llmc::strformat(" %d", l.gated_skip_source);
    sources += llmc::strformat(" %d", l.attention_source);
    xsa += l.xsa ? llmc::strformat(" %d", l.xsa_slab) : std::string(" -");
  }
  check_verbose(text == "AS0,-1,-1:-1,-1 AS1,0,-1:-1,-1 AS2,1,-1:-1,-1 AL3,-1,-1:-1,0 AS4,-1,-1:-1,-1 "
                        "AS5,-1,-1:-1,-1 -S-1,-1,-1:-1,-1 AS6,-1,-1:-1,1 AS7,2,-1:-1,-1 AS8,3,-1:-1,-1 "
                        "AL9,4,-1:-1,-1 | 10 5 0 2" &&
                    gated == " -1 -1 -1 -1 -1 -1 3 -1 -1 -1 -1" && sources == " -1 -1 -1 -1 -1 -1 -1 -1 -1 7 7" &&
                    xsa == " - 0 - 1 2 - - 3 - - -" && plan.xsa_layers == 4 && plan.value_embedding_layers == 5 &&
                    head_gates == " - - - 0 - - - - - - 1" && plan.head_gate_layers == 2,
                "record #89's plan (attention slab, value embedding, skip source:weight, kept slot): " + text +
                    "; gated skip sources" + gated + "; attention sources" + sources + "; XSA slabs" + xsa +
                    "; head-gate slabs" + head_gates);
  llmc::LayerPlan keyed = plan;
  llmc::plan_key_offsets(keyed);
  const std::string described = keyed.describe(true);
  check_verbose(described == "11; attention AAAAAA-AAAA; windows SSSLSSSSSSL; value embeddings - 0 1 - - - - - 2 3 4; "
                             "gated skip from - - - - - - 3 - - - -; attention over the output of - - - - - - - - - "
                             "7 7; key offset ---K------K" &&
                    keyed.key_offsets() == "---K------K" && plan.key_offsets() == std::string(11, '-') &&
                    plan_text(keyed) == text &&
                    plan.describe(false) == "11; attention AAAAAA-AAAA; value embeddings - 0 1 - - - - - 2 3 4; "
                                            "gated skip from - - - - - - 3 - - - -; attention over the output of "
                                            "- - - - - - - - - 7 7",
                "the start-up table's plan of record #89 with -ko 1: " + described);
  check_throws([] { llmc::layer_plan(llmc::Arch::kSpeedrun, 12, true); },
               "the speedrun's layers are its reference's 11, not 12", "record #89's plan at 12 layers");
  check_throws([] { llmc::layer_plan(llmc::Arch::kSpeedrun, 11, false); },
               "the speedrun's layers are its reference's 12, not 11", "record #28's plan at 11 layers");
  llmc::GPT2Config c;
  llmc::config_from_preset("tiny", &c, llmc::Arch::kSpeedrun);
  const std::string record28 = plan_text(llmc::layer_plan(c));
  llmc::set_record89_plan(c, true);
  check(plan_text(llmc::layer_plan(c)) == text && record28 == plan_text(llmc::layer_plan(llmc::Arch::kSpeedrun, 12)) &&
            plan_text(llmc::layer_plan(llmc::Arch::kGpt2, 12, true)) ==
                plan_text(llmc::layer_plan(llmc::Arch::kGpt2, 12)),
        "layer_plan(config) follows record89_plan; GPT-2's plan is its own with it");
}

// Record #89's paired heads (-ph 1): its plan's layers 0, 2, 5 and 9 with the feature, none without it
// or without the plan; the start-up table's column; no tensor of their own; header slot 9's bit 128 read
// back, and refused without the plan, without the rotary pairs or with an odd number of heads.
void test_paired_heads_header() {
  llmc::GPT2Config c;
  llmc::config_from_preset("d12", &c, llmc::Arch::kSpeedrun);
  c.rotary_pairs = true;
  llmc::set_record89_plan(c, true);
  const size_t without = llmc::num_parameters(c);
  c.paired_heads = true;
  const llmc::LayerPlan plan = llmc::layer_plan(c);
  const std::string table = plan.describe(false);
  check_verbose(plan.paired_layers() == "P-P--P---P-" && llmc::num_parameters(c) == without &&
                    table.find("; paired heads P-P--P---P-") != std::string::npos &&
                    llmc::layer_plan(llmc::Arch::kSpeedrun, 11, true, false).paired_layers() == "-----------" &&
                    llmc::layer_plan(llmc::Arch::kSpeedrun, 12, false, true).paired_layers() == "------------" &&
                    c.describe().find(" record89-plan paired-heads") != std::string::npos,
                "speedrun d12 -lp 1 -rp 1 -ph 1: paired layers " + plan.paired_layers() + ", the parameters as "
                "without them, none without -ph or -lp; table: " + table + "; config " + c.describe());
  int h[llmc::kHeaderInts];
  llmc::header_from_config(c, llmc::kCheckpointVersionBF16, h);
  const int features = llmc::kFeatureRotaryPairs | llmc::kFeatureRecord89Plan | llmc::kFeaturePairedHeads;
  check(h[llmc::kFeaturesSlot] == features && llmc::config_from_header(h, "paired.bin") == c,
        llmc::strformat("header slot 9 holds %d (bit 128 the paired heads) and reads back the same config", features));
  auto refused = [](llmc::GPT2Config bad, int heads, const char* needle, const char* what) {
    int b[llmc::kHeaderInts];
    llmc::header_from_config(bad, llmc::kCheckpointVersionBF16, b);
    b[5] = heads;
    check_throws([&] { llmc::config_from_header(b, "paired.bin"); }, needle, what);
  };
  llmc::GPT2Config no_pairs = c, no_plan = c;
  no_pairs.rotary_pairs = false;
  llmc::set_record89_plan(no_plan, false);
  refused(no_pairs, c.num_heads, "paired heads, which need record #89's rotary pairs: the header is damaged",
          "a header with the paired heads but not the rotary pairs is refused");
  refused(no_plan, c.num_heads, "paired heads, which need record #89's plan: the header is damaged",
          "a header with the paired heads but not record #89's plan is refused");
  refused(c, 3, "paired heads, which need an even number of heads: the header is damaged",
          "a header with the paired heads and 3 heads is refused");
}

void test_configs() {
  llmc::GPT2Config d12;
  const bool found = llmc::config_from_preset("d12", &d12);
  check_verbose(found && d12.num_layers == 12 &&
                    d12.num_heads == 12 && d12.channels == 768 && d12.max_seq_len == 1024 &&
                    d12.vocab_size == 50257 && d12.padded_vocab_size == 50304,
                "preset d12: " + d12.describe());
  check_verbose(llmc::num_parameters(d12) == 124475904,
                llmc::strformat("d12 has %zu parameters with the padded vocabulary (124475904)",
                                llmc::num_parameters(d12)));
  llmc::GPT2Config other;
  check(!llmc::config_from_preset("d13", &other), "an unknown preset is refused");
  for (const char* name : {"d24", "d36", "d48", "tiny"}) {
    check(llmc::config_from_preset(name, &other) && other.channels % other.num_heads == 0,
          std::string("preset ") + name);
  }
  check_throws([] { llmc::make_config(2, 3, 128, 64, 100); },
               "channels 128 is not divisible by heads 3", "heads must divide channels");
  check_throws([] { llmc::make_config(0, 4, 128, 64, 100); }, "every value must be positive",
               "zero layers");
  check(llmc::pad_vocab(50257) == 50304 && llmc::pad_vocab(128) == 128, "pad_vocab");

  const llmc::GPT2Config tiny = llmc::make_config(2, 4, 64, 16, 300);
  const ParamTable table = table_of(tiny);
  bool contiguous = table.offsets[0] == 0, decay_on_matrices = true;
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    if (i > 0) contiguous = contiguous && table.offsets[i] == table.offsets[i - 1] + table[i - 1].size;
    const bool matrix = i == llmc::kWte || i == llmc::kWpe || i == llmc::kQkvw ||
                        i == llmc::kAttprojw || i == llmc::kFcw || i == llmc::kFcprojw ||
                        i == llmc::kHeadw || i == llmc::kVe || i == llmc::kAttngate || i == llmc::kBigram;
    decay_on_matrices = decay_on_matrices && table[i].decayed == matrix;
  }
  check_verbose(
      contiguous && table.offsets[llmc::kLnfb] + table[llmc::kLnfb].size == llmc::num_parameters(tiny) &&
          table[llmc::kWte].size == 384u * 64 && decay_on_matrices &&
          table[llmc::kAttprojw].residual_projection && table[llmc::kFcprojw].residual_projection,
      "parameter table: contiguous offsets, padded wte, weight decay on the matrices only");
  test_modern_table();
  test_speedrun_table();  test_smear_table();  test_rotary_pairs_header();  test_layer_plan();
  test_record89_layer_plan();
  test_mudd_gate_columns();
  test_paired_heads_header();
}

void test_bf16() {
  const float three_quarters_ulp = 1.0f + 3.0f * std::ldexp(1.0f, -9);  // bf16 ulp at 1 is 2^-7
  check_verbose(
      llmc::bf16_bits_to_float(llmc::float_to_bf16_bits(1.0f)) == 1.0f &&
          llmc::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80 &&         // tie to even
          llmc::float_to_bf16_bits(1.0f + 3.0f * std::ldexp(1.0f, -8)) == 0x3f82 &&  // tie to even
          llmc::float_to_bf16_bits(three_quarters_ulp) == 0x3f81 &&
          std::isnan(llmc::bf16_bits_to_float(llmc::float_to_bf16_bits(NAN))) &&
          std::isinf(llmc::bf16_bits_to_float(llmc::float_to_bf16_bits(INFINITY))),
      "bf16 rounding: nearest, ties to even, NaN stays NaN, inf stays inf");
}

// The CRC-32 against its standard check value and a bit-at-a-time reference, over every length and
// alignment around the 8-byte stride, and continued over pieces as zlib's crc32 is.
void test_crc32() {
  check_verbose(llmc::crc32_update(0, "123456789", 9) == 0xCBF43926u &&
                    llmc::crc32_update(0, "", 0) == 0,
                "CRC-32 of \"123456789\" is cbf43926 (the standard check value), of nothing 0");
  auto bitwise = [](const unsigned char* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
      c ^= p[i];
      for (int bit = 0; bit < 8; bit++) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
  };
  std::vector<unsigned char> bytes(64);
  for (size_t i = 0; i < bytes.size(); i++) bytes[i] = (unsigned char)(i * 151 + 7);
  bool same = true, chained = true;
  for (size_t start = 0; start < 8; start++) {
    for (size_t n = 0; start + n <= bytes.size(); n++) {
      const uint32_t whole = llmc::crc32_update(0, bytes.data() + start, n);
      same = same && whole == bitwise(bytes.data() + start, n);
      const size_t half = n / 3;
      chained = chained && whole == llmc::crc32_update(llmc::crc32_update(0, bytes.data() + start, half),
                                                       bytes.data() + start + half, n - half);
    }
  }
  check_verbose(same, "CRC-32 slicing-by-8 equals the bit-at-a-time CRC at every length and offset");
  check_verbose(chained, "CRC-32 continued over two pieces equals the CRC of the whole");

  // Combined from the pieces' CRCs, and in pieces on threads: the same values.
  std::vector<unsigned char> big(100003);
  for (size_t i = 0; i < big.size(); i++) big[i] = (unsigned char)((i * 2654435761u) >> 13);
  bool combined = true;
  for (size_t split : {(size_t)0, (size_t)1, (size_t)7, (size_t)4096, (size_t)99999, big.size()}) {
    const uint32_t a = llmc::crc32_update(0, big.data(), split);
    const uint32_t b = llmc::crc32_update(0, big.data() + split, big.size() - split);
    combined = combined && llmc::crc32_combine(a, b, big.size() - split) == llmc::crc32_update(0, big.data(), big.size());
  }
  check_verbose(combined, "crc32_combine of two pieces' CRCs equals the CRC of the whole, empty pieces included");
  bool pieces = true;
  for (size_t piece : {(size_t)1000, (size_t)4099, (size_t)50000}) {
    for (int threads : {2, 3, 4}) {
      for (uint32_t start : {0u, 0x12345678u}) {
        pieces = pieces && llmc::crc32_detail::update_in_pieces(start, big.data(), big.size(), piece, threads) ==
                               llmc::crc32_detail::update_serial(start, big.data(), big.size());
      }
    }
  }
  check_verbose(pieces, "CRC-32 in pieces on 2-4 threads equals one thread's, from 0 and continued");
}

// A modern model file says version 6 (FP32) or 7 (BF16) and architecture 1, and loads as one.
void test_modern_checkpoint() {
  const llmc::GPT2Config c = llmc::make_config(2, 1, 64, 16, 300, llmc::Arch::kModern);
  const std::vector<float> params = llmc::init_params_from_seed(c, 7);
  const std::string fp32 = kDir + "/modern.bin", bf16 = kDir + "/modern_bf16.bin";
  llmc::checkpoint_save(fp32, c, params.data(), llmc::kCheckpointVersionFP32);
  llmc::checkpoint_save(bf16, c, params.data(), llmc::kCheckpointVersionBF16);
  int h32[llmc::kHeaderInts], h16[llmc::kHeaderInts];
  llmc::File(fp32, "rb").read(h32, sizeof(h32), "the header");
  llmc::File(bf16, "rb").read(h16, sizeof(h16), "the header");
  std::vector<float> back;
  const llmc::GPT2Config loaded = llmc::checkpoint_load(fp32, &back);
  const llmc::CheckpointParams stored = llmc::checkpoint_read(bf16);
  check_verbose(h32[1] == 6 && h16[1] == 7 && h32[8] == 1 && loaded == c && back == params &&
                    stored.config == c && stored.version == llmc::kCheckpointVersionBF16,
                "modern checkpoints: versions 6 and 7, architecture 1, round trip " + loaded.describe());
  // The same versions with architecture 2 are the speedrun's files; another architecture is damage.
  const llmc::GPT2Config sc = llmc::make_config(12, 2, 64, 16, 300, llmc::Arch::kSpeedrun);
  const std::vector<float> sp = llmc::init_params_from_seed(sc, 7);
  const std::string speedrun = kDir + "/speedrun.bin", damaged = kDir + "/speedrun_damaged.bin";
  llmc::checkpoint_save(speedrun, sc, sp.data(), llmc::kCheckpointVersionBF16);
  llmc::File(speedrun, "rb").read(h16, sizeof(h16), "the header");
  const llmc::CheckpointParams read = llmc::checkpoint_read(speedrun);
  check_verbose(h16[1] == 7 && h16[8] == 2 && read.config == sc && read.version == llmc::kCheckpointVersionBF16,
                "speedrun checkpoint: version 7, architecture 2, read back as " + read.config.describe());
  const std::string text = llmc::read_text_file(speedrun);
  std::vector<char> bytes(text.begin(), text.end());
  memset(bytes.data() + 4 * llmc::kHeaderChecksumKindSlot, 0, 8);  // unchecked, as llm.c's files
  const int unknown_arch = 3;
  memcpy(bytes.data() + 4 * 8, &unknown_arch, 4);
  write_bytes(damaged, bytes.data(), bytes.size());
  check_throws([&] { llmc::checkpoint_load(damaged, &back); },
               damaged + ": version 7 names the modern or speedrun architecture but the header's architecture "
                         "is 3 (expected 1 or 2): the header is damaged; re-create the file",
               "an unknown architecture id is refused as damage");
}

void test_checkpoints() {
  const llmc::GPT2Config c = llmc::make_config(2, 4, 64, 16, 300);
  const size_t n = llmc::num_parameters(c);
  std::vector<float> params(n);
  for (size_t i = 0; i < n; i++) params[i] = std::sin((float)i) * 0.1f;
  const std::string fp32 = kDir + "/model.bin", bf16 = kDir + "/model_bf16.bin";
  llmc::checkpoint_save(fp32, c, params.data(), llmc::kCheckpointVersionFP32);
  llmc::checkpoint_save(bf16, c, params.data(), llmc::kCheckpointVersionBF16);
  std::vector<float> back;
  const llmc::GPT2Config loaded = llmc::checkpoint_load(fp32, &back);
  check_verbose(loaded == c && back == params, "FP32 checkpoint round trip: " + loaded.describe());
  std::vector<float> back_bf16;
  const llmc::GPT2Config loaded_bf16 = llmc::checkpoint_load(bf16, &back_bf16);
  bool rounded = loaded_bf16 == c && back_bf16.size() == n;
  for (size_t i = 0; rounded && i < n; i++) {
    rounded = back_bf16[i] == llmc::bf16_bits_to_float(llmc::float_to_bf16_bits(params[i]));
  }
  check_verbose(rounded, "BF16 checkpoint round trip holds the bf16-rounded values");
  check(!llmc::file_exists(fp32 + ".tmp"), "checkpoint_save leaves no temporary file");
  // checkpoint_read: the parameters as the file stores them (a resume uploads them as they are).
  const llmc::CheckpointParams stored = llmc::checkpoint_read(bf16);
  bool as_stored = stored.config == c && stored.version == llmc::kCheckpointVersionBF16 &&
                   stored.fp32.empty() && stored.bf16;
  for (size_t i = 0; as_stored && i < n; i++) {
    as_stored = stored.bf16[i] == llmc::float_to_bf16_bits(params[i]);
  }
  check_verbose(as_stored, "checkpoint_read gives a BF16 checkpoint's bits as stored");
  test_modern_checkpoint();
  const llmc::CheckpointParams stored_fp32 = llmc::checkpoint_read(fp32);
  check_verbose(stored_fp32.config == c && stored_fp32.version == llmc::kCheckpointVersionFP32 &&
                    stored_fp32.fp32 == params && !stored_fp32.bf16,
                "checkpoint_read gives an FP32 checkpoint's values as stored");

  // Corrupt copies of the FP32 checkpoint, each with one thing wrong: of the checkpoint as written
  // (with a checksum), and of the same file without its checksum (llm.c's kind), where the header
  // checks speak for themselves.
  const std::string good_text = llmc::read_text_file(fp32);
  const std::vector<char> good(good_text.begin(), good_text.end());
  std::vector<char> unchecked_good = good;
  memset(unchecked_good.data() + 4 * llmc::kHeaderChecksumKindSlot, 0, 8);
  auto corrupt_from = [&](const std::vector<char>& original, const std::string& name,
                          int header_index, int value, long new_size) {
    std::vector<char> bytes = original;
    if (header_index >= 0) memcpy(bytes.data() + 4 * header_index, &value, 4);
    bytes.resize(new_size);
    const std::string path = kDir + "/" + name;
    write_bytes(path, bytes.data(), bytes.size());
    return path;
  };
  auto corrupt = [&](const std::string& name, int header_index, int value, long new_size) {
    return corrupt_from(good, name, header_index, value, new_size);
  };
  auto corrupt_unchecked = [&](const std::string& name, int header_index, int value, long new_size) {
    return corrupt_from(unchecked_good, name, header_index, value, new_size);
  };
  auto load = [](const std::string& path) {
    return [path] {
      std::vector<float> p;
      llmc::checkpoint_load(path, &p);
    };
  };
  const long size = (long)good.size();
  std::string p = corrupt("magic.bin", 0, 20240520, size);
  check_throws(load(p), p + ": not a GPT-2 checkpoint (magic 20240520, expected 20240326)",
               "checkpoint with a wrong magic");
  p = corrupt("short_header.bin", -1, 0, 100);
  check_throws(load(p), p + ": file is truncated: reading the checkpoint header at byte 0",
               "checkpoint shorter than its header");
  p = corrupt("checksum_kind.bin", llmc::kHeaderChecksumKindSlot, 7, size);
  check_throws(load(p), p + ": unknown checksum kind 7 in header slot 254",
               "checkpoint with an unknown checksum kind");
  // With a checksum, damage to the header's config or to the size is damage to the file, named.
  for (const auto& damage : {std::make_tuple("heads.bin", 5, 3, size),
                             std::make_tuple("version.bin", 1, 4, size),
                             std::make_tuple("padded.bin", 7, 320, size),
                             std::make_tuple("truncated.bin", -1, 0, size - 4),
                             std::make_tuple("trailing.bin", -1, 0, size + 2)}) {
    p = corrupt(std::get<0>(damage), std::get<1>(damage), std::get<2>(damage), std::get<3>(damage));
    check_throws(load(p), p + ": checksum mismatch (CRC-32 ",
                 std::string("checksummed checkpoint damaged: ") + std::get<0>(damage));
  }
  p = corrupt_unchecked("unchecked_version.bin", 1, 4, size);
  check_throws(load(p), p + ": unsupported checkpoint version 4",
               "checkpoint with a wrong version");
  p = corrupt_unchecked("unchecked_padded.bin", 7, 320, size);
  check_throws(load(p), p + ": padded vocab size 320 does not match vocab 300 padded",
               "checkpoint with a wrong padded vocab");
  p = corrupt_unchecked("unchecked_heads.bin", 5, 3, size);
  check_throws(load(p),
               p + ": invalid model config: channels 64 is not divisible by heads 3: the header is "
                   "damaged; re-create the file",
               "checkpoint with an invalid config names the file and says it is damaged");
  p = corrupt_unchecked("unchecked_truncated.bin", -1, 0, size - 4);
  check_throws(load(p),
               llmc::strformat("%s: checkpoint for %s should be %ld bytes but is %ld (truncated)",
                               p.c_str(), c.describe().c_str(), size, size - 4),
               "truncated checkpoint");
  p = corrupt_unchecked("unchecked_trailing.bin", -1, 0, size + 2);
  check_throws(load(p), "(trailing data)", "checkpoint with trailing bytes");
  p = corrupt_unchecked("unchecked_bf16_size.bin", 1, llmc::kCheckpointVersionBF16, size);
  check_throws(load(p), "(trailing data)", "an FP32 body under a BF16 header");

  // The checksum: damage anywhere in the file is caught, a file without one (llm.c's) loads.
  check(good[4 * llmc::kHeaderChecksumKindSlot] == llmc::kChecksumCrc32,
        "checkpoint_save writes a checksum");
  const uint32_t empty_slot_value = 1u << 20;
  p = corrupt("header_bit.bin", 100, (int)empty_slot_value, size);
  check_throws(load(p), p + ": checksum mismatch (CRC-32 ",
               "checkpoint with a flipped bit in an unused header slot");
  for (const std::string& model : {fp32, bf16}) {
    const std::string text = llmc::read_text_file(model);
    std::vector<char> bytes(text.begin(), text.end());
    bytes[bytes.size() - 3] ^= 0x10;
    p = model + ".payload_bit.bin";
    write_bytes(p, bytes.data(), bytes.size());
    check_throws(load(p), p + ": checksum mismatch (CRC-32 ",
                 "checkpoint with a flipped bit in the parameters (" + model + ")");
    bytes[bytes.size() - 3] ^= 0x10;
    memset(bytes.data() + 4 * llmc::kHeaderChecksumKindSlot, 0, 8);
    p = model + ".no_checksum.bin";
    write_bytes(p, bytes.data(), bytes.size());
    std::vector<float> unchecked, checked;
    llmc::checkpoint_load(p, &unchecked);
    llmc::checkpoint_load(model, &checked);
    check_verbose(unchecked == checked,
                  "a checkpoint without a checksum (llm.c's) loads the same values: " + p);
  }
}

void test_debug_state_header() {
  const llmc::GPT2Config c = llmc::make_config(2, 4, 64, 16, 300);
  int h[llmc::kHeaderInts] = {};
  h[0] = llmc::kDebugStateMagic;
  h[1] = llmc::kDebugStateVersion;
  h[2] = 1;
  h[3] = 4;
  h[4] = 0;
  h[5] = 300;
  auto with = [&](const std::string& name, int index, int value) {
    int copy[llmc::kHeaderInts];
    memcpy(copy, h, sizeof(h));
    copy[index] = value;
    const std::string path = kDir + "/" + name;
    write_bytes(path, copy, sizeof(copy));
    return [path, c] { llmc::debug_state_load(path, c); };
  };
  check_throws(with("debug_magic.bin", 0, 1), "not a debug-state file (magic 1, expected 20240327)",
               "debug state with a wrong magic");
  check_throws(with("debug_version.bin", 1, 2), "debug-state version 2, expected 3",
               "debug state with a wrong version");
  check_throws(with("debug_vocab.bin", 5, 299), "does not fit the model",
               "debug state for another vocab");
  check_throws(with("debug_t.bin", 3, 17), "does not fit the model", "debug state with T > maxT");
  check_throws(with("debug_body.bin", 4, 0), "file is truncated: reading the inputs",
               "debug state without its body");
  h[1] = llmc::kDebugStateVersionRecipe;
  check_throws(with("debug_documents.bin", 21, 2), "documents 2 and window 0 in the header",
               "debug state with documents 2");
  check_throws(with("debug_window.bin", 22, 3), "documents 0 and window 3 in the header",
               "debug state with a window but no documents");
  check_throws(with("debug_eps.bin", 29, 2), "eps placement 2 in the header",
               "debug state with eps placement 2");
  check_throws(with("debug_ns.bin", 23, 5), "Newton-Schulz steps 5, momentum warmup 0",
               "debug state with Newton-Schulz steps but no Muon");
  check_throws(with("debug_ns_row.bin", llmc::kDebugStateNewtonSchulzSlot, 3),
               "Muon's orthogonalisation 3 in the header (0 or more, with Muon only)",
               "debug state with an orthogonalisation but no Muon");
  h[13] = 1;  // Muon
  check_throws(with("debug_ns_row_negative.bin", llmc::kDebugStateNewtonSchulzSlot, -1),
               "Muon's orthogonalisation -1 in the header", "debug state with orthogonalisation -1");
}

// Version 6: version 5's file with, before the step losses, the gradients at the BF16 weights of the
// tensors of at most 8192 entries, read back in place; a file
// without them is cut off.
// `write(name, floats)` writes the header h, version 5's settings and the first `floats` of `body`.
template <typename Write>
void test_debug_state_bf16_weights(const llmc::GPT2Config& c, int h[llmc::kHeaderInts], std::vector<float>& body,
                                   const Write& write) {
  // Of c's tensors only the token embedding (384 x 64) and the blocks' qkvw, fcw and fcprojw (2 layers of
  // 192, 256 and 64 rows of 64, 256 and 256) are larger; attprojw (2 x 64 x 64) is 8192 entries.
  const size_t n = llmc::debug_state_bf16_weights_size(c), C = c.channels;
  check_verbose(n == llmc::num_parameters(c) - c.padded_vocab_size * C - 2 * (3 * C * C + 4 * C * C + 4 * C * C),
                "a version-6 debug state holds the gradients at the BF16 weights of the tensors of 8192 entries "
                "or fewer");
  const size_t grads_end = body.size();
  h[1] = llmc::kDebugStateVersionBf16Weights;
  h[4] = 2;  // two step losses after them
  for (size_t i = 0; i < n + 2; i++) body.push_back((float)(i + 1));
  const llmc::DebugState d = llmc::debug_state_load(write("debug_bf16_weights.bin", body.size()), c);
  const std::vector<float> losses = {(float)n + 1, (float)n + 2};
  check_verbose(d.grads_at_bf16_weights.size() == n && d.grads_at_bf16_weights.front() == 1.0f &&
                    d.grads_at_bf16_weights.back() == (float)n && d.losses == losses,
                "a version-6 debug state's gradients at the BF16 weights read between the gradients and the losses");
  check_throws([&] { llmc::debug_state_load(write("debug_bf16_weights_cut.bin", grads_end + 2), c); },
               "file is truncated", "a version-6 debug state without its gradients at the BF16 weights");
  h[1] = llmc::kDebugStateVersionBf16Weights + 1;
  check_throws([&] { llmc::debug_state_load(write("debug_version7.bin", body.size()), c); },
               "debug-state version 7, expected 3 to 6", "a debug state of version 7");
}

// Version 5: the settings' text and the prefix table after the header, read back; a length out of
// range, a table of other than the padded vocabulary's rows, and a body that does not follow them.
void test_debug_state_settings() {
  const llmc::GPT2Config c = llmc::make_config(2, 4, 64, 16, 300);
  const int B = 1, T = 4, Vp = c.padded_vocab_size;
  int h[llmc::kHeaderInts] = {};
  h[0] = llmc::kDebugStateMagic;
  h[1] = llmc::kDebugStateVersionSettings;
  h[2] = B, h[3] = T, h[4] = 0, h[5] = c.vocab_size;
  const std::string text = "-lc 23.0,5.0 -mtp 1.0,0.5 -pw 0.25";  // 34 bytes, 2 of padding
  std::vector<int> table(Vp, -1);
  table[7] = 3;
  std::vector<float> body(2 * B * T + (size_t)B * T * c.vocab_size + 1 + llmc::num_parameters(c), 0.0f);
  auto write = [&](const std::string& name, int bytes, int rows, size_t body_floats) {
    std::vector<char> file((char*)h, (char*)h + sizeof(h));
    auto put = [&](const void* p, size_t n) { file.insert(file.end(), (const char*)p, (const char*)p + n); };
    put(&bytes, 4);
    std::string padded = text;
    padded.resize((text.size() + 3) / 4 * 4, '\0');
    put(padded.data(), padded.size());
    put(&rows, 4);
    put(table.data(), (size_t)std::max(rows, 0) * 4);
    put(body.data(), body_floats * 4);
    const std::string path = kDir + "/" + name;
    write_bytes(path, file.data(), file.size());
    return path;
  };
  const llmc::DebugState d = llmc::debug_state_load(write("debug_settings.bin", (int)text.size(), Vp, body.size()), c);
  check_verbose(d.settings == text && d.prefix_table == table && d.B == B && d.T == T,
                "a version-5 debug state's settings '" + d.settings + "' and prefix table read back");
  const std::string too_long = write("debug_settings_long.bin", 5000, Vp, body.size());
  check_throws([&] { llmc::debug_state_load(too_long, c); }, "settings of 5000 bytes (0 to 4096)",
               "debug state with settings longer than 4096 bytes");
  const std::string rows = write("debug_settings_rows.bin", (int)text.size(), 7, body.size());
  check_throws([&] { llmc::debug_state_load(rows, c); }, "a prefix table of 7 rows for the model's 384",
               "debug state with a prefix table of 7 rows");
  const std::string short_body = write("debug_settings_body.bin", (int)text.size(), Vp, body.size() - 1);
  check_throws([&] { llmc::debug_state_load(short_body, c); }, "file is truncated",
               "debug state whose body is one value short after its settings");
  test_debug_state_bf16_weights(c, h, body, [&](const std::string& name, size_t floats) {
    return write(name, (int)text.size(), Vp, floats);
  });
}

// Slot 253 names Muon's orthogonalisation where the stage plan leaves it free: a plan of 884 bytes
// or less; a longer one (up to 888 bytes, written before the slot) keeps its text there, and the
// orthogonalisation is the older files' (row 0).
void test_debug_state_newton_schulz_slot() {
  int h[llmc::kHeaderInts] = {};
  h[13] = 1;  // Muon
  h[31] = llmc::kDebugStateStagesBytes;
  h[llmc::kDebugStateNewtonSchulzSlot] = 3;
  const int row = llmc::debug_state_read_newton_schulz_row(h, "d.bin", true);
  h[31] = llmc::kDebugStateStagesBytes + 4;
  h[llmc::kDebugStateNewtonSchulzSlot] = 0x3b312f31;  // "1/1;", the plan's last 4 bytes
  const int older = llmc::debug_state_read_newton_schulz_row(h, "d.bin", true);
  check_verbose(llmc::kDebugStateStagesBytes == 884 && row == 3 && older == 0,
                llmc::strformat("a plan of 884 bytes leaves slot 253 its row (%d); one of 888 fills it (row %d)",
                                row, older));
}

// Walks the table in order, each tensor slab by slab (the layers it is stacked over, the value
// embeddings one by one), against train_gpt2.py's tensors in file order: the same name (of the
// layer the slab belongs to), size and offset, and the same gradients there.
void check_speedrun_gradient_order(const llmc::GPT2Config& c, const llmc::DebugState& d,
                                   const std::string& tensors) {
  struct Named { int tensor; const char* name; };  // train_gpt2.py's name of each table tensor
  const Named names[] = {{llmc::kWte, "transformer.wte.weight"}, {llmc::kQkvw, "attn.c_attn.weight"},
                         {llmc::kAttprojw, "attn.c_proj.weight"}, {llmc::kFcw, "mlp.c_fc.weight"},
                         {llmc::kFcprojw, "mlp.c_proj.weight"}, {llmc::kHeadw, "lm_head.weight"},
                         {llmc::kVe, "transformer.ve.%d.weight"}, {llmc::kAttngate, "attn.gate.weight"},
                         {llmc::kSkipw, "skip_weights"}, {llmc::kLambdas, "lambdas"},
                         {llmc::kValueScales, "attn.value_scales"}};
  llmc::ParamSpec t[llmc::kNumParamTensors];
  size_t offsets[llmc::kNumParamTensors];
  llmc::param_table(c, t);
  llmc::param_offsets(c, offsets);
  const llmc::LayerPlan plan = llmc::layer_plan(c);
  std::vector<std::string> expected;  // "name elements offset" of each slab, in table order
  std::vector<double> sums;
  auto add = [&](const std::string& name, size_t size, size_t offset) {
    double sum = 0.0;
    for (size_t i = offset; i < offset + size; i++) sum += (double)d.grads[i] * d.grads[i];
    expected.push_back(llmc::strformat("%s %zu %zu", name.c_str(), size, offset));
    sums.push_back(sum);
  };
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    if (t[i].size == 0) continue;
    const Named* named = std::find_if(std::begin(names), std::end(names), [i](const Named& n) { return n.tensor == i; });
    if (named == std::end(names)) {
      check(false, std::string("the speedrun table has ") + t[i].name + ", which the test does not know");
      return;
    }
    const size_t slab = llmc::param_slab_size(plan, t[i]);
    if (i == llmc::kVe) {
      for (int k = 0; k < plan.value_embeddings; k++) {
        add(llmc::strformat(named->name, k), t[i].size / 3, offsets[i] + k * (t[i].size / 3));
      }
    } else if (!t[i].per_layer()) {
      add(named->name, t[i].size, offsets[i]);
    }
    for (int l = 0; t[i].per_layer() && l < c.num_layers; l++) {
      const int s = llmc::param_slab(plan, t[i], l);
      if (s >= 0) add(llmc::strformat("transformer.h.%d.%s", l, named->name), slab, offsets[i] + s * slab);
    }
  }
  const std::string text = llmc::read_text_file(tensors);
  size_t line_start = 0, line = 0, mismatches = 0;
  double worst = 0.0;
  for (; line_start < text.size() && line < expected.size(); line++) {
    const size_t end = text.find('\n', line_start);
    const std::string row = text.substr(line_start, end - line_start);
    line_start = end == std::string::npos ? text.size() : end + 1;
    const size_t last_space = row.rfind(' ');
    const double theirs = atof(row.c_str() + last_space + 1);
    const double error = std::fabs(sums[line] - theirs) / std::max(theirs, 1e-30);
    worst = std::max(worst, error);
    if (row.substr(0, last_space) != expected[line] || !(error <= 1e-6) || theirs == 0.0) {
      if (mismatches++ == 0) {
        printf("     first mismatch: train_gpt2.py '%s', the table '%s %.9g'\n", row.c_str(),
               expected[line].c_str(), sums[line]);
      }
    }
  }
  const bool all_lines = line == expected.size() && line_start >= text.size();
  check_verbose(mismatches == 0 && all_lines,
                llmc::strformat("speedrun gradients: %zu of train_gpt2.py's %zu tensors in file order lie at "
                                "the table's offsets with their names and sizes, nonzero (worst relative "
                                "difference of the sums of squares %.1e)", line - mismatches, expected.size(), worst));
}

// --speedrun: train_gpt2.py's files against this model description (dev/test/test_reference_speedrun.sh).
// init: a checkpoint of train_gpt2.py's seeded init (init_weights_speedrun), which must equal
// init_params_from_seed bit for bit; state: a speedrun debug state, whose header must say the
// recipe's settings and whose gradients must lie where the table puts them: tensors lists
// train_gpt2.py's parameters in file order, "name elements offset sum_of_squared_gradients" a line.
void check_speedrun_files(const std::string& init, uint64_t seed, const std::string& state,
                          const std::string& tensors) {
  std::vector<float> values;
  const llmc::GPT2Config c = llmc::checkpoint_load(init, &values);
  llmc::GPT2Config tiny;
  llmc::config_from_preset("tiny", &tiny, llmc::Arch::kSpeedrun);
  const std::vector<float> ours = llmc::init_params_from_seed(c, seed);
  size_t differ = 0;
  for (size_t i = 0; i < ours.size(); i++) differ += memcmp(&ours[i], &values[i], sizeof(float)) != 0;
  check_verbose(c == tiny && ours.size() == values.size() && differ == 0,
                llmc::strformat("speedrun tiny init, seed %llu: %zu of %zu values differ in any bit from "
                                "train_gpt2.py's", (unsigned long long)seed, differ, values.size()));
  const llmc::DebugState d = llmc::debug_state_load(state, c);
  check_verbose(d.muon && d.loss_sum && d.muon_lr == 0.05f && d.muon_weight_decay == 0.0f &&
                    d.muon_momentum == 0.95f && d.lr_embedding == 0.6f && d.lr_head == 0.008f &&
                    d.lr_vector == 0.04f && d.beta1 == 0.8f && d.eps == 1e-10f && d.weight_decay == 0.0f &&
                    d.grad_clip == 0.0f && d.documents && d.window_blocks == 1,
                llmc::strformat("speedrun debug state: Muon lr %g, AdamW lr %g/%g/%g (embeddings, head, "
                                "scalars), eps %g, summed loss, documents, window %d", d.muon_lr,
                                d.lr_embedding, d.lr_head, d.lr_vector, d.eps, d.window_blocks));
  check_verbose(d.newton_schulz_steps == 5 && d.newton_schulz_a == 3.4445f && d.newton_schulz_b == -4.7750f &&
                    d.newton_schulz_c == 2.0315f && d.muon_momentum_start == 0.85f &&
                    d.muon_momentum_warmup == 300 && d.eps_before_correction && d.newton_schulz_row == 2,
                llmc::strformat("speedrun debug state: Newton-Schulz row %d, %d of (%g, %g, %g), momentum %g "
                                "rising over %d steps, eps before the correction", d.newton_schulz_row, d.newton_schulz_steps,
                                d.newton_schulz_a, d.newton_schulz_b, d.newton_schulz_c,
                                d.muon_momentum_start, d.muon_momentum_warmup));
  check_verbose(d.grads.size() == llmc::num_parameters(c) && d.steps >= 2 && d.losses[1] < d.losses[0],
                llmc::strformat("speedrun debug state: %zu gradients, losses %.6f -> %.6f", d.grads.size(),
                                d.losses[0], d.steps >= 2 ? d.losses[1] : 0.0f));
  check_speedrun_gradient_order(c, d, tensors);
}

// --init: a checkpoint of train_gpt2.py's seeded speedrun init (--record_init `init`), which must
// equal init_params_from_seed bit for bit, tensor by tensor of the table.
void check_speedrun_init(const std::string& path, uint64_t seed, llmc::SpeedrunInit init) {
  std::vector<float> values;
  const llmc::GPT2Config c = llmc::checkpoint_load(path, &values);
  const std::vector<float> ours = llmc::init_params_from_seed(c, seed, init);
  check(c.arch == llmc::Arch::kSpeedrun && ours.size() == values.size(),
        llmc::strformat("%s: a speedrun model of %zu values, as the table's %zu", path.c_str(), values.size(),
                        ours.size()));
  if (ours.size() != values.size()) return;
  llmc::ParamSpec table[llmc::kNumParamTensors];
  size_t offsets[llmc::kNumParamTensors];
  llmc::param_table(c, table);
  llmc::param_offsets(c, offsets);
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    if (table[i].size == 0) continue;
    size_t differ = 0, nonzero = 0;
    for (size_t k = offsets[i]; k < offsets[i] + table[i].size; k++) {
      differ += memcmp(&ours[k], &values[k], sizeof(float)) != 0;
      nonzero += ours[k] != 0.0f;
    }
    check_verbose(differ == 0, llmc::strformat("init -ri %d, seed %llu, %s: %zu of %zu values differ in any bit from "
                                               "train_gpt2.py's (%zu nonzero)", (int)init, (unsigned long long)seed,
                                               table[i].name, differ, table[i].size, nonzero));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string mode = argv[1];
    if (!((argc == 6 && mode == "--speedrun") || (argc == 5 && mode == "--init"))) {
      fprintf(stderr, "usage: %s [--speedrun INIT_CHECKPOINT SEED DEBUG_STATE TENSORS | --init CHECKPOINT SEED "
              "RECORD_INIT]\n", argv[0]);
      return 2;
    }
    try {
      if (mode == "--init") {
        check_speedrun_init(argv[2], strtoull(argv[3], nullptr, 10), llmc::parse_speedrun_init("-ri", argv[4]));
      } else {
        check_speedrun_files(argv[2], strtoull(argv[3], nullptr, 10), argv[4], argv[5]);
      }
    } catch (const llmc::Error& e) {
      check(false, std::string("unexpected error: ") + e.what());
    }
    return testing::summary(("test_utils " + mode).c_str());
  }
  try {
    llmc::make_dirs(kDir);
    test_strformat_and_helpers();
    test_file();
    test_staged_files();
    test_glob_and_make_dirs();
    test_configs();
    test_bf16();
    test_crc32();
    test_checkpoints();
    test_debug_state_header();
    test_debug_state_settings();
    test_debug_state_newton_schulz_slot();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_utils");
}
