// Tests llmc/stages.h: the plan's text (shares as decimals and fractions, extension steps, every
// key, values kept from the stage before), the stage ends of record #89's thirds of 1,270 steps and
// its 15 extension steps, the plan of each step (tokens, micro steps, the window's schedule, the
// rate multiplier), the tokens a run has seen, record #89's (short, long) windows and its final
// validation's window, record #89's loss weights a step (mtp=, pw=), YaRN's frequencies and scale at
// record #89's window changes (llmc/yarn.h, against torch's float32), and one error per malformed plan.
// With --dump it prints a plan's steps for dev/test/test_documents.sh to compare with
// train_gpt2.py's:
//   build/test_stages --dump PLAN B T Z AW AWF WORLD STEPS
// (AW as -aw: N or S/L; AWF as -awf) one line a step s = 0 .. N+E: "s stage T tokens micro_steps cap
// long_window short_window lr_multiplier"; and with
// --dump-rates each step's learning rate (llmc/schedulers.h's LrSchedule at the step's stage
// multiplier, as the CUDA trainer takes it) and Muon's momentum over the plan's N+E steps:
//   build/test_stages --dump-rates PLAN STEPS SCHEDULE LR WARMUP FINAL_FRAC COOLDOWN_FRAC
//                                  MOMENTUM_START MOMENTUM_END MOMENTUM_WARMUP MOMENTUM_COOLDOWN
// one line a step: "s lr momentum" (%.17g); and with --dump-loss each step's loss weights over a
// plan whose first stage takes -mtp MTP and -pw PW:
//   build/test_stages --dump-loss PLAN STEPS MTP PW
// one line a step: "s w0,w1,... prefix" (%.9g, each a float).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/flags.h"
#include "llmc/stages.h"
#include "llmc/yarn.h"

using llmc::StagePlan;
using llmc::StepPlan;
using testing::check_throws;
using testing::check_verbose;

namespace {

StagePlan resolved(const std::string& text, long steps, int T = 256, long tokens = -1, int window = 0) {
  StagePlan plan(text, "-sp", T, tokens, {window});
  plan.resolve(steps);
  return plan;
}

void test_one_stage() {
  const StagePlan plan = resolved("", 100, 1024, 524288, llmc::kWindowSchedule);
  bool same = plan.stages().size() == 1 && plan.total_steps() == 100;
  for (long s = 0; s <= 100; s++) {
    const StepPlan p = plan.at(s, 16, 2);
    same = same && p.stage == 0 && p.T == 1024 && p.tokens == 524288 && p.micro_steps == 16 && p.cap == 0 &&
           p.windows.long_blocks == llmc::run_window_blocks(llmc::kWindowSchedule, s, 100) &&
           p.windows.short_blocks == p.windows.long_blocks / 2 && p.lr_multiplier == 1.0;
  }
  check_verbose(same, "no plan: one stage of the flags at every step (the window's schedule over -x)");
  check_verbose(resolved(" ", 0).total_steps() == 0, "an empty plan takes -x 0 (evaluation only)");
}

void test_record89_ends() {
  const StagePlan plan = resolved("1/3 t=16384 z=131072 cap=896 aw=3; 1/3 t=32768 z=262144 cap=2048 aw=7 lr=1.52; "
                                  "1/3 t=49152 z=393216 aw=11 lr=1.73; +15 aw=13 lr=1", 1270, 2048);
  const std::vector<llmc::Stage>& s = plan.stages();
  check_verbose(s.size() == 4 && s[0].end == 423 && s[1].end == 847 && s[2].end == 1270 && s[3].end == 1285 &&
                    plan.total_steps() == 1285 && plan.scheduled_steps() == 1270,
                "thirds of 1,270 steps end at 423, 847 and 1,270 (round half to even), then 15 extension steps");
  const StepPlan a = plan.at(422, 1, 1), b = plan.at(423, 1, 1), c = plan.at(1269, 1, 1), d = plan.at(1270, 1, 1),
                 e = plan.at(1285, 1, 1);
  check_verbose(a.stage == 0 && a.T == 16384 && a.micro_steps == 8 && a.cap == 896 && a.windows.long_blocks == 3 &&
                    b.stage == 1 && b.T == 32768 && b.micro_steps == 8 && b.cap == 2048 && b.lr_multiplier == 1.52 &&
                    c.stage == 2 && c.cap == 2048 && c.windows.long_blocks == 11 && d.stage == 3 && d.T == 49152 &&
                    d.micro_steps == 8 && d.windows.long_blocks == 13 && d.lr_multiplier == 1.0 && e.stage == 3,
                "steps 422, 423, 1269, 1270, 1285: each stage's values, kept from the stage before where not set");
  check_verbose(plan.tokens_through(1285, 1, 1) == 423L * 131072 + 424L * 262144 + 423L * 393216 + 15L * 393216 &&
                    plan.tokens_through(500, 1, 1) == 423L * 131072 + 77L * 262144,
                "tokens seen through steps of different stages");
  check_verbose(plan.max_T() == 49152 && plan.max_window() == 13 && plan.has_cap() && plan.first_length_change() == 1 &&
                    plan.max_step_tokens_per_process(1, 2) == 4L * 49152,
                "the largest stage sizes the buffers");
  // round(0.5 * 5) = 2 (half to even), round(0.5 * 7) = 4
  check_verbose(resolved("0.5; 0.5", 5).stages()[0].end == 2 && resolved("0.5; 0.5", 7).stages()[0].end == 4,
                "a share's end rounds half to even, as Python's round");
}

void test_schedule_window() {
  const StagePlan plan = resolved("0.5 aw=-1; 0.5 aw=4; +2 aw=-1", 10, 256, -1, 0);
  bool ok = true;
  for (long s = 0; s <= 12; s++) {
    const int expected = s < 5 || s >= 10 ? llmc::attention_window_blocks(s, 12) : 4;
    const llmc::StepWindows w = plan.at(s, 2, 1).windows;
    ok = ok && w.long_blocks == expected && w.short_blocks == expected / 2;
  }
  check_verbose(ok && plan.max_window() == 14, "aw=-1 takes the window's schedule over all N + E steps");
  const StepPlan p = resolved("1 z=-1 t=512", 4, 256, 4096).at(0, 2, 2);
  check_verbose(p.T == 512 && p.tokens == 2048 && p.micro_steps == 1, "z=-1: one micro batch of the stage's t");
}

bool windows_are(const StepPlan& p, int long_blocks, int short_blocks) {
  return p.windows.long_blocks == long_blocks && p.windows.short_blocks == short_blocks;
}

// Record #89's (short, long) pair a stage and its final validation's long window of 20, the short
// staying the last stage's.
void test_record89_windows() {
  StagePlan plan = resolved("1/3 aw=1/3; 1/3 aw=3/7; 1/3 aw=5/11; +15 aw=6/13", 1270, 2048);
  check_verbose(windows_are(plan.at(0, 1, 1), 3, 1) && windows_are(plan.at(422, 1, 1), 3, 1) &&
                    windows_are(plan.at(423, 1, 1), 7, 3) && windows_are(plan.at(1269, 1, 1), 11, 5) &&
                    windows_are(plan.at(1270, 1, 1), 13, 6) && windows_are(plan.at(1285, 1, 1), 13, 6) &&
                    plan.max_window() == 13,
                "aw=S/L: each stage's short and long windows, (1, 3), (3, 7), (5, 11), extension (6, 13)");
  plan.set_final_window(20, "-awf");
  check_verbose(windows_are(plan.at(1284, 1, 1), 13, 6) && windows_are(plan.at(1285, 1, 1), 20, 6) &&
                    plan.max_window() == 20 && plan.final_window() == 20,
                "-awf 20: the validation after the last step at (6, 20), the last step's at (6, 13); the scratch "
                "sized for 20");
  plan.set_final_window(0, "-awf");
  check_verbose(windows_are(plan.at(1285, 1, 1), 13, 6) && plan.max_window() == 13, "-awf 0: the last stage's");
  const StagePlan halves = resolved("1/2 aw=2/8 lr=2; 1/2 lr=1; +2 aw=9", 10, 256, -1, 4);
  check_verbose(windows_are(halves.at(0, 1, 1), 8, 2) && windows_are(halves.at(5, 1, 1), 8, 2) &&
                    windows_are(halves.at(10, 1, 1), 9, 4),
                "a short window holds until a stage sets aw=N again, whose short is half of N");
  const StagePlan flags("1/2; 1/2 aw=6", "-sp", 256, -1, {4, 3});
  check_verbose(flags.stages()[0].window.text() == "3/4" && flags.stages()[1].window.text() == "6" &&
                    flags.stages()[0].window.describe() == "4 blocks, short 3",
                "the flags' -aw 3/4 fills the first stage");
  check_throws([] { resolved("1 aw=2/5", 10).set_final_window(1, "-awf"); },
               "-awf 1 is below the last stage's short window of 2 blocks, which the final validation keeps: give "
               "-awf 2 or more", "a final window below the last short one");
  check_throws([] { resolved("1/2 aw=3; 1/2 aw=0", 10).set_final_window(20, "-awf"); },
               "-awf 20 sets the long window of the validation after the last step, and the last stage has no window",
               "a final window where the last stage has none");
}

bool loss_is(const StepPlan& p, std::vector<float> next_tokens, float prefix) {
  const llmc::PredictionWeights& w = p.loss.next_tokens;
  return w.count == (int)next_tokens.size() && std::equal(next_tokens.begin(), next_tokens.end(), w.weight) &&
         p.loss.prefix == prefix;
}

// Record #89's loss weights: stage 1 (1, 0.5, 0.25 -> 0) and 0.25, stage 2 (1, 0.5 -> 0) and 0.25 -> 0,
// stage 3 and the extension (1) and 0; each ramp from its start at the stage's first step towards its
// end, which the next stage's first step would reach.
// YaRN over record #89's plan (long windows 3, 7, 11, then 13 blocks of 128 tokens; the final
// validation's 20 is none of its changes), from its base scale 0.1 and a head size 128's base
// frequencies ((1/1024)^(j/31) rounded once to float, then 32 unturned): the frequencies after each
// change as torch computes them on float32 tensors (pinned bit for bit from torch 1.13 on a CPU:
// r = old f / (2 pi), w = clamp((r - 1) / 31, 0, 1), f *= old/new + w (1 - old/new)), the scale as
// Python's doubles (0.11695, 0.12752, 0.13178, the notes' values); a step's state derived from the
// start equals the one advanced step by step (a resume's), and steps without a change keep it.
void test_yarn() {
  StagePlan plan = resolved("1/3 aw=1/3; 1/3 aw=3/7; 1/3 aw=5/11; +15 aw=6/13", 1270, 2048);
  plan.set_final_window(20, "-awf");
  llmc::YarnState base;
  for (int j = 0; j < 32; j++) base.freq.push_back((float)std::pow(1.0 / 1024.0, j / 31.0));
  base.freq.resize(64, 0.0f);
  base.scale = 0.1;
  struct Pinned {
    long step;
    double scale;
    float f5, f10, f12, f20, f31;
  };
  const Pinned pinned[] = {
      {0, 0.1, base.freq[5], base.freq[10], base.freq[12], base.freq[20], base.freq[31]},
      {423, 0.11694595720774409, 0x1.049d9p-2f, 0x1.d09338p-5f, 0x1.10bf94p-5f, 0x1.40e73cp-8f, 0x1.b6db6ep-12f},
      {847, 0.12751752379570258, 0x1.049d9p-2f, 0x1.4e42a8p-5f, 0x1.731dcp-6f, 0x1.986c1ep-9f, 0x1.1745d2p-12f},
      {1270, 0.1317779884389435, 0x1.049d9p-2f, 0x1.285846p-5f, 0x1.41873cp-6f, 0x1.59969p-9f, 0x1.d89d8cp-13f},
      {1285, 0.1317779884389435, 0x1.049d9p-2f, 0x1.285846p-5f, 0x1.41873cp-6f, 0x1.59969p-9f, 0x1.d89d8cp-13f},
  };
  llmc::YarnState stepped = base;  // a run's, one step at a time
  long at = 0;
  for (const Pinned& p : pinned) {
    while (at < p.step) llmc::yarn_advance(stepped, plan, ++at);
    const llmc::YarnState y = llmc::yarn_at(plan, p.step, base);
    const bool unturned = std::all_of(y.freq.begin() + 32, y.freq.end(), [](float f) { return f == 0.0f; });
    check_verbose(y.scale == p.scale && y.freq[0] == 1.0f && y.freq[5] == p.f5 && y.freq[10] == p.f10 &&
                      y.freq[12] == p.f12 && y.freq[20] == p.f20 && y.freq[31] == p.f31 && unturned &&
                      y.freq == stepped.freq && y.scale == stepped.scale,
                  llmc::strformat("YaRN at step %ld: scale %.17g (torch's %.17g), f[10] %a (%a), f[31] %a (%a); the "
                                  "unturned 0; stepped from the start the same", p.step, y.scale, p.scale, y.freq[10],
                                  p.f10, y.freq[31], p.f31));
  }
  const llmc::YarnState before = llmc::yarn_at(plan, 422, base), after = llmc::yarn_at(plan, 423, base);
  check_verbose(before.freq == base.freq && before.scale == 0.1 && after.scale != 0.1,
                "YaRN: step 422 keeps the base (the first stage's window), step 423 takes the change 384 -> 896");
  check_throws([] { llmc::yarn_check(resolved("1/2 aw=3; 1/2 aw=0", 10), "-yn"); },
               "-yn 1 rescales the rotary at the stage plan's changes of the long window, and stage 2 of 2 has no "
               "window", "YaRN over a stage without a window");
  check_throws([] { llmc::yarn_check(resolved("", 10), "-yn"); }, "stage 1 of 1 has no window",
               "YaRN without a window");
}

void test_record89_loss_weights() {
  const StagePlan plan = resolved("1/3 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/3 mtp=1,0.5>1,0 pw=0.25>0; 1/3 mtp=1 pw=0; "
                                  "+15", 1270);
  check_verbose(loss_is(plan.at(0, 1, 1), {1.0f, 0.5f, 0.25f}, 0.25f) &&
                    loss_is(plan.at(422, 1, 1), {1.0f, 0.5f, (float)(0.25 - 0.25 * (422.0 / 423.0))}, 0.25f) &&
                    loss_is(plan.at(423, 1, 1), {1.0f, 0.5f}, 0.25f) &&
                    loss_is(plan.at(846, 1, 1), {1.0f, (float)(0.5 - 0.5 * (423.0 / 424.0))},
                            (float)(0.25 - 0.25 * (423.0 / 424.0))) &&
                    loss_is(plan.at(847, 1, 1), {1.0f}, 0.0f) && loss_is(plan.at(1270, 1, 1), {1.0f}, 0.0f) &&
                    loss_is(plan.at(1285, 1, 1), {1.0f}, 0.0f) && plan.has_prefix_term(),
                "record #89: 3, 2 and 1 weights, w2 0.25 -> 0 in stage 1, w1 and the prefix 0.5 and 0.25 -> 0 in "
                "stage 2, then 1 and 0");
  const StagePlan fifths = resolved("1/2 mtp=1,1>1,0 pw=0>1; 1/2", 10);
  check_verbose(loss_is(fifths.at(1, 1, 1), {1.0f, 0.8f}, 0.2f) && loss_is(fifths.at(4, 1, 1), {1.0f, 0.2f}, 0.8f) &&
                    loss_is(fifths.at(5, 1, 1), {1.0f, 1.0f}, 0.0f) && loss_is(fifths.at(9, 1, 1), {1.0f, 0.2f}, 0.8f) &&
                    loss_is(fifths.at(10, 1, 1), {1.0f, 0.0f}, 1.0f),
                "a + (b - a) t with t = (s - first) / (end - first): 0.8, 0.2 at steps 1 and 4 of 5; a stage without "
                "mtp= and pw= repeats the stage before's ramp; the final evaluation's step at t = 1");
  llmc::LossWeights flags;
  flags.next_tokens = {2, {1.0f, 0.5f, 0.0f}};
  flags.prefix = 0.25f;
  StagePlan flagged("1/2; 1/2 pw=0", "-sp", 256, -1, {}, flags);
  flagged.resolve(10);
  check_verbose(loss_is(flagged.at(0, 1, 1), {1.0f, 0.5f}, 0.25f) && !resolved("", 10).has_prefix_term() &&
                    loss_is(resolved("", 10).at(3, 1, 1), {1.0f}, 0.0f) && plan.has_loss_ramp() &&
                    !flagged.has_loss_ramp() && !resolved("1/2 mtp=1,0.5; 1/2 pw=0.25>0.25", 10).has_loss_ramp(),
                "-mtp and -pw fill the first stage; no plan: the next token alone; ramps told from constants");
  check_verbose(plan.describe(1, 1).find("mtp 1,0.5,0.25>1,0.5,0, pw 0.25; 2:") != std::string::npos &&
                    plan.describe(1, 1).find("mtp 1,0.5>1,0, pw 0.25>0; 3:") != std::string::npos,
                "the start-up table names each stage's weights");
}

void test_errors() {
  auto bad = [](const std::string& text, long steps, const std::string& needle) {
    check_throws([&] { resolved(text, steps); }, needle, "-sp \"" + text + "\"");
  };
  bad("0.5; 0.25", 10, "sum to 0.75");
  bad("1 t=0", 10, "t=0: give an integer from 1");
  bad("1 t=12x", 10, "t=12x");
  bad("1 t=64 t=128", 10, "sets t twice");
  bad("1 depth=3", 10, "unknown setting 'depth'");
  bad("1 t", 10, "settings are KEY=VALUE");
  bad("1;", 10, "stage 2: empty");
  bad("+5; 1", 10, "comes after the extension steps");
  bad("+5", 10, "only extension steps");
  bad("1; +0", 10, "'+0': give extension steps");
  bad("0/3; 1", 10, "'0/3'");
  bad("x; 1", 10, "share 'x'");
  bad("-0.5; 1.5", 10, "share '-0.5'");
  bad("1 lr=-1", 10, "lr=-1");
  bad("1 z=0", 10, "z=0");
  bad("1 aw=-2", 10, "-sp: stage 1: aw=-2: give a window of 1 or more blocks, -1 for the schedule or 0 for none");
  bad("1 aw=5/3", 10, "aw=5/3: the short window 5 is not within 1 and the long window 3: give S/L with 1 <= S <= L");
  bad("1 aw=0/3", 10, "aw=0/3: the short window 0 is not within 1 and the long window 3");
  bad("1 aw=2/0", 10, "aw=2/0: a short window takes a fixed long one of 1 or more blocks");
  bad("1 aw=1/-1", 10, "aw=1/-1: a short window takes a fixed long one");
  bad("1 aw=1/x", 10, "aw=1/x: give the window in blocks of 128 tokens");
  bad("1 aw=/3", 10, "aw=/3: give the window in blocks");
  bad("1 aw=1/2/3", 10, "aw=1/2/3: give the window in blocks");
  bad("1 t=+64", 10, "t=+64");      // plain numbers, as train_gpt2.py reads them
  bad("+1/2; 1/2", 10, "'+1/2'");
  bad("0x1p-1; 0x1p-1", 10, "share '0x1p-1'");
  bad("1; ++2", 10, "'++2'");
  bad("1 lr=0x1p0", 10, "lr=0x1p0");
  bad("0.95; 0.05", 5, "stage 2 of 2 gets no step of -x 5");
  bad("1 mtp=1,0.5,0.25,0.1", 10, "-sp: stage 1: mtp=1,0.5,0.25,0.1: give 1 to 3 next-token weights within [0, 1]");
  bad("1 mtp=1,1.5", 10, "mtp=1,1.5: give 1 to 3");
  bad("1 mtp=1,", 10, "mtp=1,: give 1 to 3");
  bad("1 mtp=1>", 10, "mtp=1>: give 1 to 3");
  bad("1 mtp=1>0.5>0", 10, "mtp=1>0.5>0: give 1 to 3");
  bad("1 mtp=0x1p0", 10, "mtp=0x1p0: give 1 to 3");
  bad("1 mtp=1,0.5>1", 10, "-sp: stage 1: mtp=1,0.5>1: 2 weights at the start and 1 at the end: give as many at each end");
  bad("1 pw=-0.5", 10, "-sp: stage 1: pw=-0.5: give the prefix term's weight within [0, 1], or START>END");
  bad("1 pw=0.25>x", 10, "pw=0.25>x: give the prefix term's weight");
  bad("1 mtp=0>1", 10, "-sp: stage 1: mtp 0>1, pw 0: every term of the loss starts at weight 0");
  bad("1/2; 1/2 mtp=0,0 pw=0>0.5", 10, "stage 2: mtp 0,0, pw 0>0.5: every term of the loss starts at weight 0");
  bad("1 mtp=1 mtp=1", 10, "sets mtp twice");
  check_throws([] { resolved("1 z=1000", 4).at(0, 2, 1); }, "-z 1000 is not a multiple of B*T*processes",
               "one stage's z that B*T*processes does not divide names -z");
  check_throws([] { resolved("0.5; 0.5 z=1000", 4).at(3, 2, 1); }, "z 1000 is not a multiple of B*T*processes = "
               "2*256*1 = 512: use z=512", "a stage's z of several: the stage's setting");
}

// --dump PLAN B T Z AW AWF WORLD STEPS
int dump(char** argv) {
  const int B = atoi(argv[3]), world = atoi(argv[8]);
  StagePlan plan(argv[2], "-sp", atoi(argv[4]), atol(argv[5]), llmc::parse_window_setting(argv[6], "AW"));
  plan.resolve(atol(argv[9]));
  plan.set_final_window(atoi(argv[7]), "-awf");
  for (long s = 0; s <= plan.total_steps(); s++) {
    const StepPlan p = plan.at(s, B, world);
    printf("%ld %d %d %ld %d %d %d %d %.17g\n", s, p.stage, p.T, p.tokens, p.micro_steps, p.cap, p.windows.long_blocks,
           p.windows.short_blocks, p.lr_multiplier);
  }
  return 0;
}

// --dump-loss PLAN STEPS MTP PW (MTP and PW as -mtp and -pw)
int dump_loss(char** argv) {
  llmc::LossWeights flags;
  flags.next_tokens = llmc::parse_prediction_weights("-mtp", argv[4]);
  flags.prefix = llmc::parse_float("-pw", argv[5], 0.0f, 1.0f);
  StagePlan plan(argv[2], "-sp", 128, -1, {}, flags);
  plan.resolve(atol(argv[3]));
  for (long s = 0; s <= plan.total_steps(); s++) {
    const llmc::LossWeights w = plan.at(s, 1, 1).loss;
    std::string next_tokens;
    for (int k = 0; k < w.next_tokens.count; k++) next_tokens += llmc::strformat(k ? ",%.9g" : "%.9g", w.next_tokens.weight[k]);
    printf("%ld %s %.9g\n", s, next_tokens.c_str(), w.prefix);
  }
  return 0;
}

// --dump-rates PLAN STEPS SCHEDULE LR WARMUP FINAL_FRAC COOLDOWN_FRAC MOMENTUM_START MOMENTUM_END
//              MOMENTUM_WARMUP MOMENTUM_COOLDOWN; the numbers read as train_gpt2.py reads them (strtod)
int dump_rates(char** argv) {
  StagePlan plan(argv[2], "-sp", 128, -1, {});
  plan.resolve(atol(argv[3]));
  llmc::LrSchedule schedule = llmc::make_lr_schedule(argv[4], "-k", strtod(argv[5], nullptr), atol(argv[6]),
                                                     std::max(1L, plan.scheduled_steps()), strtod(argv[7], nullptr));
  schedule.cooldown_fraction = strtod(argv[8], nullptr);
  llmc::MomentumSchedule momentum;
  momentum.start = strtod(argv[9], nullptr);
  momentum.end = strtod(argv[10], nullptr);
  momentum.warmup_steps = atol(argv[11]);
  momentum.cooldown_steps = atol(argv[12]);
  momentum.resolve(plan.total_steps(), "-mc", "the plan's");
  for (long s = 0; s <= plan.total_steps(); s++) {
    printf("%ld %.17g %.17g\n", s, schedule.at(s, plan.at(s, 1, 1).lr_multiplier), momentum.at(s));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string mode = argv[1];
    if (!(mode == "--dump" && argc == 10) && !(mode == "--dump-rates" && argc == 13) &&
        !(mode == "--dump-loss" && argc == 6)) {
      fprintf(stderr, "usage: %s [--dump PLAN B T Z AW AWF WORLD STEPS | --dump-rates PLAN STEPS SCHEDULE LR WARMUP "
              "FINAL_FRAC COOLDOWN_FRAC MOMENTUM_START MOMENTUM_END MOMENTUM_WARMUP MOMENTUM_COOLDOWN | --dump-loss "
              "PLAN STEPS MTP PW]\n", argv[0]);
      return 2;
    }
    try {
      if (mode == "--dump-loss") return dump_loss(argv);
      return mode == "--dump" ? dump(argv) : dump_rates(argv);
    } catch (const llmc::Error& e) {
      fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  try {
    test_one_stage();
    test_record89_ends();
    test_schedule_window();
    test_record89_windows();
    test_record89_loss_weights();
    test_yarn();
    test_errors();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_stages");
}
