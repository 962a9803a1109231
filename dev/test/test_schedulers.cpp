// Tests llmc/schedulers.h: warmup, endpoints, monotonicity, the wsd phases, a stage's multiplier
// of each schedule, the cooldown to an absolute floor (record #89's values), name parsing, and
// bit-exact agreement with train_gpt2.py's learning_rate(); Muon's momentum with its warmup and
// cooldown against train_gpt2.py's muon_momentum() and the recipes' (llmc/recipe.h); the attention
// window's schedule and per-layer pattern; and the recipes' validation batches on N processes.
// Every step of a stage plan's rates against train_gpt2.py's: dev/test/test_documents.sh.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/recipe.h"
#include "llmc/schedulers.h"

using llmc::LrSchedule;
using llmc::make_lr_schedule;
using testing::check;
using testing::check_throws;
using testing::check_verbose;

namespace {

bool close(double a, double b) { return std::fabs(a - b) <= 1e-12 * std::fmax(1.0, std::fabs(b)); }

void test_warmup() {
  for (const char* name : {"cosine", "linear", "constant", "wsd"}) {
    const LrSchedule s = make_lr_schedule(name, "-k", 6e-4, 10, 100, 0.1);
    bool rising = true;
    for (long step = 0; step < 10; step++) {
      rising = rising && close(s.at(step), 6e-4 * (step + 1) / 10);
    }
    check_verbose(
        rising && close(s.at(0), 6e-5) && close(s.at(9), 6e-4) && close(s.at(10), 6e-4),
        llmc::strformat("%s: warmup rises linearly from lr/W at step 0 to lr at W-1 and W", name));
  }
  const LrSchedule no_warmup = make_lr_schedule("cosine", "-k", 1e-3, 0, 50, 0.0);
  check_verbose(no_warmup.at(0) == 1e-3, "without warmup step 0 runs at the peak lr");
}

void test_endpoints_and_monotonicity() {
  const double lr = 6e-4, frac = 0.1, min_lr = lr * frac;
  const long W = 10, N = 210;
  for (const char* name : {"cosine", "linear", "constant", "wsd"}) {
    const LrSchedule s = make_lr_schedule(name, "-k", lr, W, N, frac);
    bool non_increasing = true, bounded = true;
    for (long step = W; step < N; step++) {
      non_increasing = non_increasing && s.at(step + 1) <= s.at(step);
      bounded = bounded && s.at(step) <= lr && s.at(step) >= min_lr;
    }
    const bool constant = std::string(name) == "constant";
    const double end = s.at(N);
    check_verbose(non_increasing && bounded && close(end, constant ? lr : min_lr) &&
                      s.at(N - 1) > (constant ? 0.0 : min_lr),
                  llmc::strformat("%s: after warmup non-increasing within [min_lr, lr]; step N-1 "
                                  "%.4e, step N %.4e", name, s.at(N - 1), end));
  }
  const LrSchedule cosine = make_lr_schedule("cosine", "-k", lr, W, N, frac);
  check_verbose(close(cosine.at(W + (N - W) / 2), (lr + min_lr) / 2),
                "cosine: half way through the decay it is half way between lr and min_lr");
  const LrSchedule linear = make_lr_schedule("linear", "-k", lr, W, N, frac);
  check_verbose(close(linear.at(W + (N - W) / 4), lr - (lr - min_lr) / 4),
                "linear: a quarter of the way through the decay it has dropped a quarter");
  check_verbose(close(make_lr_schedule("cosine", "-k", lr, W, N, frac).at(N + 50), min_lr),
                "steps past N stay at min_lr");
}

void test_wsd_phases() {
  const double lr = 1e-3;
  const LrSchedule s = make_lr_schedule("wsd", "-k", lr, 20, 1000, 0.0);
  bool stable = true;
  for (long step = 20; step <= 800; step++) stable = stable && s.at(step) == lr;
  check_verbose(stable && s.at(801) < lr && close(s.at(900), lr / 2) && close(s.at(1000), 0.0),
                "wsd: stable at lr through step 800, then linear to min_lr over the last fifth");
  const LrSchedule long_warmup = make_lr_schedule("wsd", "-k", lr, 900, 1000, 0.0);
  check_verbose(long_warmup.at(899) == lr && close(long_warmup.at(950), lr / 2),
                "wsd: a warmup longer than the stable phase decays straight after warmup");
  const LrSchedule tiny = make_lr_schedule("wsd", "-k", lr, 0, 3, 0.0);
  check_verbose(tiny.at(0) == lr && tiny.at(2) == lr,
                "wsd: a run shorter than 5 steps has no decay (and no division by zero)");
}

// Values printed by train_gpt2.py's learning_rate(step, args) as float.hex, for a few
// schedules at the steps around each phase change.
struct PythonCase {
  const char* name;
  double lr;
  long warmup, total;
  double frac;
  std::vector<std::pair<long, double>> values;
};

void test_matches_train_gpt2_py() {
  const std::vector<PythonCase> cases = {
      {"cosine", 0.0006, 700, 18865, 0.0,
       {{0, 0x1.cc2cd138104f1p-21}, {350, 0x1.3b78b96def2e3p-12}, {699, 0x1.3a92a30553261p-11},
        {700, 0x1.3a92a30553261p-11}, {701, 0x1.3a92a2dddc285p-11}, {9782, 0x1.3a9999c0346e3p-12},
        {15091, 0x1.02a619671e49bp-14}, {15092, 0x1.028444a4085d6p-14},
        {15093, 0x1.026271d6a7a6dp-14}, {18863, 0x1.3bb7edf6fd21fp-36},
        {18864, 0x1.3bb7ee147ae14p-38}}},
      {"cosine", 0.0003, 10, 100, 0.1,
       {{0, 0x1.f75104d551d68p-16}, {5, 0x1.797cc39ffd60ep-13}, {9, 0x1.3a92a30553261p-12},
        {10, 0x1.3a92a30553260p-12}, {11, 0x1.3a7c8fa4edd34p-12}, {55, 0x1.5a07b352a8437p-13},
        {79, 0x1.0f44bbee55484p-14}, {80, 0x1.024d511207660p-14}, {81, 0x1.ebba5fb5954dcp-15},
        {98, 0x1.fcd56ec454e13p-16}, {99, 0x1.f8b23adba7040p-16}}},
      {"linear", 0.001, 5, 50, 0.25,
       {{0, 0x1.a36e2eb1c432dp-13}, {2, 0x1.3a92a30553262p-11}, {4, 0x1.0624dd2f1a9fcp-10},
        {5, 0x1.0624dd2f1a9fcp-10}, {6, 0x1.01c66207eb3f4p-10}, {27, 0x1.4c0c8fa210a84p-11},
        {39, 0x1.c66207eb3f370p-12}, {40, 0x1.b4e81b4e81b4ep-12}, {41, 0x1.a36e2eb1c432cp-12},
        {48, 0x1.2918b66895a40p-12}, {49, 0x1.179ec9cbd821ep-12}}},
      {"wsd", 0.0006, 20, 1000, 0.0,
       {{0, 0x1.f75104d551d68p-16}, {10, 0x1.5a07b352a8437p-12}, {19, 0x1.3a92a30553261p-11},
        {20, 0x1.3a92a30553261p-11}, {21, 0x1.3a92a30553261p-11}, {510, 0x1.3a92a30553261p-11},
        {799, 0x1.3a92a30553261p-11}, {800, 0x1.3a92a30553261p-11}, {801, 0x1.38fffbce4217dp-11},
        {998, 0x1.92a737110e480p-18}, {999, 0x1.92a737110e400p-19}}},
      {"wsd", 0.001, 2, 13, 0.5,
       {{0, 0x1.0624dd2f1a9fcp-11}, {1, 0x1.0624dd2f1a9fcp-10}, {2, 0x1.0624dd2f1a9fcp-10},
        {3, 0x1.0624dd2f1a9fcp-10}, {7, 0x1.0624dd2f1a9fcp-10}, {10, 0x1.0624dd2f1a9fcp-10},
        {11, 0x1.0624dd2f1a9fcp-10}, {12, 0x1.89374bc6a7efap-11}}},
      {"constant", 0.0002, 3, 10, 0.3,
       {{0, 0x1.179ec9cbd821ep-14}, {1, 0x1.179ec9cbd821ep-13}, {2, 0x1.a36e2eb1c432dp-13},
        {3, 0x1.a36e2eb1c432dp-13}, {4, 0x1.a36e2eb1c432dp-13}, {6, 0x1.a36e2eb1c432dp-13},
        {7, 0x1.a36e2eb1c432dp-13}, {8, 0x1.a36e2eb1c432dp-13}, {9, 0x1.a36e2eb1c432dp-13}}},
  };
  int compared = 0, equal = 0;
  for (const PythonCase& c : cases) {
    const LrSchedule s = make_lr_schedule(c.name, "-k", c.lr, c.warmup, c.total, c.frac);
    for (const auto& [step, expected] : c.values) {
      compared++;
      equal += s.at(step) == expected;
      check(s.at(step) == expected,
            llmc::strformat("%s lr=%g W=%ld N=%ld frac=%g step %ld: %a, train_gpt2.py %a", c.name,
                            c.lr, c.warmup, c.total, c.frac, step, s.at(step), expected));
    }
  }
  check_verbose(equal == compared,
                llmc::strformat("%d of %d values of 6 schedules equal train_gpt2.py's bit for bit",
                                equal, compared));
}

// A stage's multiplier m scales the whole of every schedule but the cooldown: at(s, m) is at(s) * m
// bit for bit, as the trainer computed it before the cooldown.
void test_stage_multiplier() {
  bool same = true;
  for (const char* name : {"cosine", "linear", "constant", "wsd"}) {
    LrSchedule s = make_lr_schedule(name, "-k", 6e-4, 10, 200, 0.1);
    s.decay_fraction = std::string(name) == "wsd" ? 0.45 : 0.0;
    for (long step = 0; step <= 210; step++) {
      for (double m : {1.0, 0.5, 1.52, 0.3333333333333333}) same = same && s.at(step, m) == s.at(step) * m;
    }
  }
  check_verbose(same, "cosine, linear, constant, wsd (-kd 0 and 0.45): a stage's rate is the schedule's times its "
                      "multiplier, bit for bit");
}

// Record #89: N = 1,270 scheduled steps, cooldown fraction 0.6 from int(1270 x 0.4) = 508, floor 0.15
// of the peak; stages of m = 1, 1.52, 1.73 ending at 423, 847, 1,270, then the extension.
void test_cooldown() {
  LrSchedule s = make_lr_schedule("cooldown", "-k", 1.0, 0, 1270, 0.15);
  s.cooldown_fraction = 0.6;
  const double at846 = s.at(846, 1.52), at847 = s.at(847, 1.73);
  check_verbose(s.cooldown_start() == 508 && s.at(507, 1.52) == 1.52 && s.at(508, 1.52) == 1.52 &&
                    s.at(509, 1.52) < 1.52 && std::fabs(at846 - 0.912) < 5e-4 && std::fabs(at847 - 1.027) < 5e-4 &&
                    close(at846, 1.52 * (1 - 338.0 / 762) + 0.15 * 338.0 / 762),
                llmc::strformat("record #89: m until step 508, then m (1 - t) + 0.15 t: %.6f at step 846 (m 1.52), "
                                "%.6f at 847 (m 1.73)", at846, at847));
  bool floor = true;
  for (long step = 1270; step <= 1285; step++) {
    for (double m : {1.0, 1.52, 1.73, 4.0}) floor = floor && s.at(step, m) == 0.15;
  }
  check_verbose(floor && s.at(1269, 1.73) > 0.15,
                "from step N (the extension) the rate is the floor 0.15 of the peak, whatever the multiplier");
  LrSchedule fifth = make_lr_schedule("cooldown", "-k", 1e-3, 0, 1000, 0.0);
  LrSchedule long_warmup = make_lr_schedule("cooldown", "-k", 1e-3, 900, 1000, 0.0);
  long_warmup.cooldown_fraction = 0.5;
  check_verbose(fifth.cooldown_start() == 800 && fifth.at(800, 2.0) == 2e-3 && close(fifth.at(900, 2.0), 1e-3) &&
                    long_warmup.cooldown_start() == 900 && long_warmup.at(899, 2.0) == 2e-3 &&
                    close(long_warmup.at(950, 2.0), 1e-3),
                "cooldown fraction 0: the last fifth; a warmup past int(N (1 - c)): the cooldown starts after it");
  check_verbose(make_lr_schedule("cooldown", "-k", 1.0, 0, 3, 0.1).at(2, 1.0) == 1.0 &&
                    make_lr_schedule("cooldown", "-k", 1.0, 0, 3, 0.1).at(3, 1.0) == 0.1,
                "a run shorter than 5 steps: no cooldown inside it, the floor after it (no division by zero)");
}

// Values printed by train_gpt2.py's learning_rate(step, args, None, m) as float.hex for
// --lr_schedule cooldown: record #89's (0.023, 0.6, 0.15) and one with a warmup (0.001, 10 steps,
// 0.45, 0.1), each step with its multiplier.
void test_cooldown_matches_train_gpt2_py() {
  struct Value {
    long step;
    double multiplier, expected;
  };
  struct Case {
    double lr;
    long warmup, total;
    double frac, cooldown;
    std::vector<Value> values;
  };
  const std::vector<Case> cases = {
      {0.023, 0, 1270, 0.15, 0.6,
       {{0, 1.0, 0x1.78d4fdf3b645ap-6}, {507, 1.52, 0x1.1e646f1561911p-5}, {508, 1.52, 0x1.1e646f1561911p-5},
        {509, 1.52, 0x1.1e0db68e2ddcbp-5}, {846, 1.52, 0x1.57c999263aa79p-6}, {847, 1.73, 0x1.830a02a7585b5p-6},
        {1000, 1.73, 0x1.0b7dcad7a1558p-6}, {1269, 1.73, 0x1.ca7302cd99ac1p-9}, {1270, 1.0, 0x1.c432ca57a786cp-9},
        {1284, 1.0, 0x1.c432ca57a786cp-9}}},
      {0.001, 10, 100, 0.1, 0.45,
       {{0, 2.0, 0x1.a36e2eb1c432dp-13}, {9, 2.0, 0x1.0624dd2f1a9fcp-9}, {10, 2.0, 0x1.0624dd2f1a9fcp-9},
        {54, 2.0, 0x1.0624dd2f1a9fcp-9}, {55, 2.0, 0x1.0624dd2f1a9fcp-9}, {56, 0.5, 0x1.017bd14992c15p-11},
        {99, 0.5, 0x1.c8b68dde03266p-14}}},
  };
  int compared = 0, equal = 0;
  for (const Case& c : cases) {
    LrSchedule s = make_lr_schedule("cooldown", "-k", c.lr, c.warmup, c.total, c.frac);
    s.cooldown_fraction = c.cooldown;
    for (const Value& v : c.values) {
      compared++;
      equal += s.at(v.step, v.multiplier) == v.expected;
      check(s.at(v.step, v.multiplier) == v.expected,
            llmc::strformat("cooldown lr=%g W=%ld N=%ld c=%g step %ld m %g: %a, train_gpt2.py %a", c.lr, c.warmup,
                            c.total, c.cooldown, v.step, v.multiplier, s.at(v.step, v.multiplier), v.expected));
    }
  }
  check_verbose(equal == compared, llmc::strformat("cooldown: %d of %d values equal train_gpt2.py's bit for bit",
                                                   equal, compared));
}

void test_parsing() {
  check(llmc::parse_lr_schedule("cosine", "-k") == llmc::LrScheduleKind::kCosine &&
            llmc::parse_lr_schedule("linear", "-k") == llmc::LrScheduleKind::kLinear &&
            llmc::parse_lr_schedule("constant", "-k") == llmc::LrScheduleKind::kConstant &&
            llmc::parse_lr_schedule("wsd", "-k") == llmc::LrScheduleKind::kWsd &&
            llmc::parse_lr_schedule("cooldown", "-k") == llmc::LrScheduleKind::kCooldown,
        "every schedule name parses");
  check_throws(
      [] { llmc::parse_lr_schedule("cosin", "-k"); },
      "unknown learning-rate schedule 'cosin' for -k: use one of cosine, linear, constant, wsd, cooldown",
      "a misspelt schedule name");
  check_throws([] { make_lr_schedule("cosine", "-k", 1e-3, -1, 10, 0.0); }, "warmup steps -1",
               "negative warmup");
  check_throws([] { make_lr_schedule("cosine", "-k", 1e-3, 0, 0, 0.0); }, "total steps 0",
               "zero total steps");
  check_throws([] { make_lr_schedule("cosine", "-k", 1e-3, 0, 10, 1.5); }, "within [0, 1]",
               "final fraction above 1");
  check_throws([] { make_lr_schedule("cosine", "-k", -1.0, 0, 10, 0.0); }, "must be >= 0",
               "negative learning rate");
}

// Record #89's momentum: 0.85 rising to 0.95 over 300 steps, back to 0.85 over the last 50 of 1,285;
// values printed by train_gpt2.py's muon_momentum(step, args, 1285) as float.hex.
void test_momentum_cooldown() {
  llmc::MomentumSchedule record89;
  record89.warmup_steps = 300;
  record89.cooldown_steps = 50;
  record89.resolve(1285, "-mc", "-x 1270 and -sp's 15 extension steps");
  const std::vector<std::pair<long, double>> python = {
      {0, 0x1.b333333333333p-1},    {299, 0x1.e63ab596de8cap-1},  {300, 0x1.e666666666666p-1},
      {1235, 0x1.e666666666666p-1}, {1236, 0x1.e5604189374bcp-1}, {1260, 0x1.cccccccccccccp-1},
      {1284, 0x1.b4395810624ddp-1}, {1285, 0x1.b333333333333p-1}};
  int equal = 0;
  for (const auto& [step, expected] : python) {
    equal += record89.at(step) == expected;
    check(record89.at(step) == expected, llmc::strformat("momentum with its cooldown at step %ld: %a, train_gpt2.py "
                                                         "%a", step, record89.at(step), expected));
  }
  bool falling = true;
  for (long step = 1236; step <= 1285; step++) falling = falling && record89.at(step) < record89.at(step - 1);
  check_verbose(equal == (int)python.size() && falling && std::fabs(record89.at(1284) - 0.852) < 1e-12,
                llmc::strformat("record #89's momentum: 0.95 through step 1235, falling at every step to %.6f at the "
                                "last (1284) and 0.85 at 1285; %d of %zu steps equal train_gpt2.py's", record89.at(1284),
                                equal, python.size()));
  llmc::MomentumSchedule overlap;
  overlap.warmup_steps = 10;
  overlap.cooldown_steps = 8;
  overlap.resolve(12, "-mc", "-x 12");
  check_verbose(overlap.at(5) == 0.5 * 0.85 + 0.5 * 0.95 && overlap.at(10) == 0.95 - 6.0 / 8 * (0.95 - 0.85),
                "where the warmup and the cooldown overlap the warmup comes first");
  llmc::MomentumSchedule whole;
  whole.cooldown_steps = 20;
  whole.resolve(20, "-mc", "-x 20");
  check_verbose(whole.at(0) == 0.95 && whole.at(20) == 0.85, "a cooldown as long as the run: from step 1 on");
  check_throws([] {
    llmc::MomentumSchedule m;
    m.cooldown_steps = 51;
    m.resolve(50, "-mc", "-x 40 and -sp's 10 extension steps");
  }, "-mc 51: the momentum's cooldown is longer than the run's 50 steps (-x 40 and -sp's 10 extension steps): give "
     "-mc 50 or less", "a cooldown longer than the run");
}

// Values printed by train_gpt2.py's muon_momentum(step, args) as float.hex under --recipe speedrun
// (0.85 rising to 0.95 over 300 steps), around the warmup's ends and past it.
void test_muon_momentum() {
  llmc::MomentumSchedule speedrun;
  speedrun.warmup_steps = 300;
  const std::vector<std::pair<long, double>> python = {
      {0, 0x1.b333333333333p-1},   {1, 0x1.b35ee402bb0cfp-1},   {2, 0x1.b38a94d242e6bp-1},
      {7, 0x1.b46508dfea279p-1},   {100, 0x1.c444444444445p-1}, {150, 0x1.cccccccccccccp-1},
      {200, 0x1.d555555555556p-1}, {298, 0x1.e60f04c756b2dp-1}, {299, 0x1.e63ab596de8cap-1},
      {300, 0x1.e666666666666p-1}, {301, 0x1.e666666666666p-1}, {1694, 0x1.e666666666666p-1}};
  int equal = 0;
  for (const auto& [step, expected] : python) {
    equal += speedrun.at(step) == expected;
    check(speedrun.at(step) == expected, llmc::strformat("momentum at step %ld: %a, train_gpt2.py %a", step,
                                                         speedrun.at(step), expected));
  }
  check_verbose(equal == (int)python.size(),
                llmc::strformat("speedrun momentum: %d of %zu steps equal train_gpt2.py's bit for bit", equal,
                                python.size()));
  bool rising = true;
  for (long step = 1; step <= 300; step++) rising = rising && speedrun.at(step) > speedrun.at(step - 1);
  check_verbose(rising && speedrun.at(0) == 0.85 && speedrun.at(300) == 0.95,
                "speedrun momentum: 0.85 at step 0, rising at every step to 0.95 at step 300");
  // The modern and GPT-2 recipes: 0.95 at every step, and 0.95f where Muon takes it, as before.
  bool constant = true;
  for (const llmc::Recipe* r : {&llmc::recipe_modern(), &llmc::recipe_gpt2()}) {
    for (long step : {0L, 1L, 150L, 299L, 300L, 5000L}) {
      constant = constant && r->muon_momentum.at(step) == 0.95 && (float)r->muon_momentum.at(step) == 0.95f;
    }
  }
  check_verbose(constant, "modern and GPT-2 recipes: momentum 0.95 (0.95f) at every step");
  test_momentum_cooldown();
  const llmc::NewtonSchulz& ns = llmc::recipe_modern().muon_newton_schulz;
  check_verbose(std::string(ns.name) == "baseline" && ns.steps == 12 && ns.polynomial[11].a == 2.0f &&
                    ns.polynomial[11].b == -1.5f && ns.polynomial[11].c == 0.5f &&
                    llmc::recipe_modern().muon_scale_tall && llmc::recipe_gpt2().muon_scale_tall &&
                    std::string(llmc::recipe_gpt2().muon_newton_schulz.name) == "baseline",
                "modern and GPT-2 recipes: 12 Newton-Schulz steps of (2, -1.5, 0.5), tall matrices scaled");
}

// modded-nanogpt's attention window: 1 block at step 0, 14 (1728 tokens rounded up) at step N,
// growing by at most a block a step when N >= 14, and the per-layer long/short pattern.
void test_attention_window() {
  bool ends = true, steady = true;
  for (long n : {1L, 14L, 100L, 1750L, 3250L}) {
    ends = ends && llmc::attention_window_blocks(0, n) == 1 &&
           llmc::attention_window_blocks(n, n) == 14;
    for (long s = 1; n >= 14 && s <= n; s++) {
      const int grew =
          llmc::attention_window_blocks(s, n) - llmc::attention_window_blocks(s - 1, n);
      steady = steady && (grew == 0 || grew == 1);
    }
  }
  check_verbose(ends && steady, "window: 1 block at step 0 and 14 at step N (N = 1, 14, 100, 1750, "
                                "3250), rising a block at a time");
  check_verbose(llmc::attention_window_blocks(1625, 3250) == 7 &&
                    llmc::attention_window_blocks(1, 1728) == 1 &&
                    llmc::attention_window_blocks(129, 1728) == 2 &&
                    llmc::attention_window_blocks(1000, 1728) == 8,
                "window: 864 tokens half way -> 7 blocks; 1, 129, 1000 of 1728 steps -> 1, 2, 8");
  check_verbose(llmc::run_window_blocks(5, 7, 10) == 5 && llmc::run_window_blocks(0, 7, 10) == 0 &&
                    llmc::run_window_blocks(llmc::kWindowSchedule, 1625, 3250) == 7 &&
                    llmc::run_window_blocks_max(5) == 5 && llmc::run_window_blocks_max(0) == 0 &&
                    llmc::run_window_blocks_max(llmc::kWindowSchedule) == 14,
                "a run's window: -aw 5 at every step, 0 none, -1 the schedule's (7 half way), at most 5, 0, 14");
  check_throws([] { llmc::attention_window_blocks(11, 10); },
               "attention window of step 11 of 10: the step must be within 0..10", "a step past N");
}

// -m's default: the speedrun's 40 batches are shared by the processes (5 each on the reference's
// 8), the other recipes' are each process's; a count the processes cannot share is refused.
void test_validation_batches() {
  const llmc::Recipe& speedrun = llmc::recipe_speedrun();
  check_verbose(llmc::recipe_val_batches(speedrun, 1) == 40 && llmc::recipe_val_batches(speedrun, 2) == 20 &&
                    llmc::recipe_val_batches(speedrun, 8) == 5 && llmc::recipe_val_batches(speedrun, 40) == 1,
                "speedrun: 40 validation batches in all, 40, 20, 5, 1 a process on 1, 2, 8, 40");
  check_verbose(llmc::recipe_val_batches(llmc::recipe_gpt2(), 8) == 20 &&
                    llmc::recipe_val_batches(llmc::recipe_modern(), 3) == 20,
                "GPT-2 and modern: 20 batches a process on any number of processes");
  check_throws([&] { llmc::recipe_val_batches(speedrun, 3); },
               "-m: -recipe speedrun validates on 40 batches in all, which 3 processes cannot share evenly: "
               "give -m, the batches of each process",
               "speedrun on 3 processes");
}

}  // namespace

int main() {
  try {
    test_warmup();
    test_endpoints_and_monotonicity();
    test_wsd_phases();
    test_matches_train_gpt2_py();
    test_stage_multiplier();
    test_cooldown();
    test_cooldown_matches_train_gpt2_py();
    test_parsing();
    test_muon_momentum();
    test_attention_window();
    test_validation_batches();
  } catch (const llmc::Error& e) {
    check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_schedulers");
}
