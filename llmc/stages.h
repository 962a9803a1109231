// The stage plan: a run as a list of stages, each with its share of the scheduled steps and what
// holds in it (tokens a sequence and a step, the document cap, the attention window, the
// learning-rate multiplier), plus extension steps after the schedule. The CUDA trainer's -sp and
// train_gpt2.py's --stages read the same text, and both compute the same plan of every step.
//
// PLAN: stages separated by ';', each words separated by blanks. The first word is the stage's
// share of the N scheduled steps (-x): a decimal ("0.25") or a fraction of positive integers
// ("1/3"); or "+E", E extension steps after the N (the last stage only). Then KEY=VALUE words:
//   t=N    tokens a sequence (-t)              z=N    tokens a step, all processes (-z; -1: one
//   cap=N  tokens of a document a sequence            micro batch of the stage's t)
//          takes (0: all)                      aw=N   attention window (-aw; -1: the schedule), or
//   lr=X   learning-rate multiplier            aw=S/L short and long windows (1 <= S <= L)
//   mtp=W  the loss's next-token weights (-mtp: 1 to 3 within [0, 1], "1,0.5")
//   pw=P   the loss's prefix-term weight (-pw)
//   mtp=A>B, pw=A>B: A at the stage's first step, linear towards B at its end (as many weights at
//          each; LossWeightRamp)
// A key not given keeps the stage before's value; the first stage's come from the flags (cap 0,
// lr 1). An empty plan is one stage of the flags: every recipe's today. aw=N sets both windows:
// the short one is half the long, rounded down.
//
// Stage i of the scheduled ones ends at round(c_i N), c_i the shares summed left to right in
// double and rounded half to even (Python's round); the last ends at N. Step s belongs to the
// first stage that ends after it; from N on, to the extension stage (else the last). The run
// trains N + E steps; step N + E is its final evaluation, whose long window a final window (-awf)
// may widen, the short one staying the last stage's.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "recipe.h"
#include "schedulers.h"
#include "utils.h"

namespace llmc {

// A plan's numbers are plain, as train_gpt2.py reads them: an integer's digits (a minus where -1 is
// taken), a decimal's digits, point and exponent; no plus sign, hex or inf.
inline bool plain_integer(const std::string& s) {
  const size_t digits = !s.empty() && s[0] == '-' ? 1 : 0;
  return s.size() > digits && s.find_first_not_of("0123456789", digits) == std::string::npos;
}
inline bool plain_decimal(const std::string& s) {
  return !s.empty() && (std::isdigit((unsigned char)s[0]) || s[0] == '.') &&
         s.find_first_not_of("0123456789.eE+-") == std::string::npos;
}

// -aw's value and a stage's aw=: the long window (N blocks, kWindowSchedule or 0 for none) and the
// short one (kShortWindowHalf: half the long, rounded down).
struct WindowSetting {
  int long_blocks = 0;
  int short_blocks = kShortWindowHalf;

  bool short_given() const { return short_blocks != kShortWindowHalf; }
  // As given: "7" or "3/7".
  std::string text() const {
    return short_given() ? strformat("%d/%d", short_blocks, long_blocks) : std::to_string(long_blocks);
  }
  // The start-up table's: "the schedule's", "none", "7 blocks" or "7 blocks, short 3".
  std::string describe() const {
    if (long_blocks == kWindowSchedule) return "the schedule's";
    if (long_blocks == 0) return "none";
    const std::string blocks = strformat("%d block%s", long_blocks, long_blocks == 1 ? "" : "s");
    return short_given() ? blocks + strformat(", short %d", short_blocks) : blocks;
  }
};

// "L" or "S/L" as a WindowSetting (`what` names it in messages: "-aw 5/3", "-sp: stage 2: aw=5/3"). A
// short window takes a fixed long one: the schedule's grows from 1 block, and 0 is none.
inline WindowSetting parse_window_setting(const std::string& text, const std::string& what) {
  const size_t slash = text.find('/');
  auto blocks = [&](const std::string& digits) {
    char* end = nullptr;
    errno = 0;
    const long n = strtol(digits.c_str(), &end, 10);
    if (!plain_integer(digits) || *end != '\0' || errno != 0 || n < INT32_MIN || n > INT32_MAX) {
      LLMC_FAIL("%s: give the window in blocks of 128 tokens (N, %d for the schedule, 0 for none), or the short "
                "and the long window as S/L", what.c_str(), kWindowSchedule);
    }
    return (int)n;
  };
  WindowSetting w;
  w.long_blocks = blocks(slash == std::string::npos ? text : text.substr(slash + 1));
  if (w.long_blocks < kWindowSchedule) {
    LLMC_FAIL("%s: give a window of 1 or more blocks, %d for the schedule or 0 for none", what.c_str(),
              kWindowSchedule);
  }
  if (slash == std::string::npos) return w;
  w.short_blocks = blocks(text.substr(0, slash));
  if (w.long_blocks <= 0) {
    LLMC_FAIL("%s: a short window takes a fixed long one of 1 or more blocks (the schedule's grows from 1, 0 is "
              "none): give S/L with 1 <= S <= L, or the long window alone", what.c_str());
  }
  if (w.short_blocks < 1 || w.short_blocks > w.long_blocks) {
    LLMC_FAIL("%s: the short window %d is not within 1 and the long window %d: give S/L with 1 <= S <= L",
              what.c_str(), w.short_blocks, w.long_blocks);
  }
  return w;
}

// The training loss's weights at one step: the next tokens' (-mtp) and the prefix term's (-pw).
struct LossWeights {
  PredictionWeights next_tokens;
  float prefix = 0.0f;

  bool any_positive() const {
    return prefix > 0.0f || std::any_of(next_tokens.weight, next_tokens.weight + next_tokens.count,
                                        [](float w) { return w > 0.0f; });
  }
};

// A stage's loss weights (mtp=, pw=): `start` at its first step, linear to `end` at the step it ends
// before, as record #89's TrainingSchedule: at step s of a stage from `first` to `end`, with
// t = (s - first) / (end - first) in double, each weight a + (b - a) t in double rounded to float
// (its float32 tensor of Python floats); a + 0 t = a where the two ends are equal.
struct LossWeightRamp {
  LossWeights start, end;

  LossWeights at(double t) const {
    LossWeights w = start;
    auto lerp = [t](float a, float b) { return (float)((double)a + ((double)b - (double)a) * t); };
    for (int k = 0; k < w.next_tokens.count; k++) {
      w.next_tokens.weight[k] = lerp(start.next_tokens.weight[k], end.next_tokens.weight[k]);
    }
    w.prefix = lerp(start.prefix, end.prefix);
    return w;
  }
  bool ramps() const {
    return start.prefix != end.prefix || !std::equal(start.next_tokens.weight,
                                                     start.next_tokens.weight + start.next_tokens.count,
                                                     end.next_tokens.weight);
  }
  // "mtp 1,0.5,0.25>1,0.5,0, pw 0.25" for the start-up table.
  std::string describe() const {
    auto ends = [](const std::string& a, const std::string& b) { return a == b ? a : a + ">" + b; };
    return "mtp " + ends(prediction_weights_text(start.next_tokens), prediction_weights_text(end.next_tokens)) +
           ", pw " + ends(strformat("%g", start.prefix), strformat("%g", end.prefix));
  }
};

// What a stage sets; the flags' values fill the first stage.
struct Stage {
  double share = 1.0;       // of the scheduled steps (0 for the extension stage)
  long extension_steps = 0; // "+E": E steps after the scheduled ones
  int T = 0;                // t
  long tokens = -1;         // z (-1: B*T*processes)
  int cap = 0;              // the document cap in tokens (0: none)
  WindowSetting window;     // aw
  double lr_multiplier = 1.0;
  LossWeightRamp loss;      // mtp, pw
  long end = 0;             // the step it ends before (resolved)
};

// What holds at one step.
struct StepPlan {
  int stage = 0;
  int T = 0;
  long tokens = 0;       // of all processes
  int micro_steps = 1;   // of B*T tokens a process
  int cap = 0;
  StepWindows windows;   // in blocks at this step (long 0: none)
  double lr_multiplier = 1.0;
  LossWeights loss;

  // Whether a loader reading `other` reads other sequences than one reading this.
  bool same_sequences(const StepPlan& other) const {
    return T == other.T && micro_steps == other.micro_steps && cap == other.cap;
  }
};

// The micro steps of B*T tokens a process that make `tokens` over `processes` (-1: one); `what`
// names the tokens' setting for the messages ("-z", "-sp stage 2's z").
inline int micro_steps_of(long tokens, int B, int T, int processes, const std::string& what) {
  const long per_micro_step = (long)B * T * processes;
  if (tokens == -1) return 1;
  if (tokens <= 0 || tokens % per_micro_step != 0) {
    const std::string fix = strformat(what == "-z" ? "-z %ld" : "z=%ld", per_micro_step * std::max(1L, tokens / per_micro_step));
    LLMC_FAIL("%s %ld is not a multiple of B*T*processes = %d*%d*%d = %ld: use %s or another multiple", what.c_str(),
              tokens, B, T, processes, per_micro_step, fix.c_str());
  }
  if (tokens / per_micro_step > INT32_MAX) {
    LLMC_FAIL("%s %ld is %ld micro steps of B*T*processes = %ld tokens, more than the %d one step can take: "
              "use a smaller %s", what.c_str(), tokens, tokens / per_micro_step, per_micro_step, INT32_MAX,
              what.c_str());
  }
  return (int)(tokens / per_micro_step);
}

class StagePlan {
 public:
  StagePlan() = default;

  // The plan of `text` (`flag` names it in messages) over the flags' T, tokens, window and loss
  // weights.
  StagePlan(const std::string& text, const char* flag, int T, long tokens, const WindowSetting& window,
            const LossWeights& loss = {})
      : flag_(flag) {
    Stage first;
    first.T = T;
    first.tokens = tokens;
    first.window = window;
    first.loss = {loss, loss};
    if (text.find_first_not_of(" \t") == std::string::npos) {
      stages_.push_back(first);
      return;
    }
    size_t begin = 0;
    while (true) {
      const size_t end = text.find(';', begin);
      stages_.push_back(parse_stage(text.substr(begin, end - begin), stages_.empty() ? first : stages_.back()));
      if (end == std::string::npos) break;
      begin = end + 1;
    }
    check_shares();
  }

  // Shares out N scheduled steps; fails for a stage that gets none.
  void resolve(long scheduled_steps) {
    scheduled_ = scheduled_steps;
    double cumulative = 0.0;
    long previous = 0;
    const int last = scheduled_count() - 1;
    for (int i = 0; i <= last; i++) {
      cumulative += stages_[i].share;
      stages_[i].end = i == last ? scheduled_steps : (long)std::nearbyint(cumulative * (double)scheduled_steps);
      if (stages_[i].end <= previous && scheduled_count() > 1) {
        LLMC_FAIL("%s: stage %d of %d gets no step of -x %ld (its share ends at step %ld, the stage before's at "
                  "%ld): give -x more steps, or the stage a larger share", flag_, i + 1, scheduled_count(),
                  scheduled_steps, stages_[i].end, previous);
      }
      previous = stages_[i].end;
    }
    if (has_extension()) stages_.back().end = scheduled_steps + stages_.back().extension_steps;
  }

  // The long window of the final evaluation (step N + E) in blocks, in place of the last stage's
  // (0: the last stage's); its short window stays the last stage's. Once resolved; `flag` names it.
  void set_final_window(int long_blocks, const char* flag) {
    final_window_ = 0;
    if (long_blocks == 0) return;
    const StepWindows last = windows_at(total_steps());
    if (last.long_blocks == 0) {
      LLMC_FAIL("%s %d sets the long window of the validation after the last step, and the last stage has no "
                "window: give it one (aw=, or -aw, with documents), or drop %s", flag, long_blocks, flag);
    }
    if (long_blocks < last.short_blocks) {
      LLMC_FAIL("%s %d is below the last stage's short window of %d blocks, which the final validation keeps: give "
                "%s %d or more", flag, long_blocks, last.short_blocks, flag, last.short_blocks);
    }
    final_window_ = long_blocks;
  }
  int final_window() const { return final_window_; }

  const std::vector<Stage>& stages() const { return stages_; }
  bool has_extension() const { return stages_.back().extension_steps > 0; }
  int scheduled_count() const { return (int)stages_.size() - (has_extension() ? 1 : 0); }
  long scheduled_steps() const { return scheduled_; }
  long total_steps() const { return scheduled_ + (has_extension() ? stages_.back().extension_steps : 0); }

  // The stage of step s (0 <= s <= total_steps()).
  int stage_of(long step) const {
    for (int i = 0; i < scheduled_count(); i++) {
      if (step < stages_[i].end) return i;
    }
    return (int)stages_.size() - 1;
  }

  // The windows of step s (0 <= s <= total_steps()): its stage's, the final window's long one at N + E.
  StepWindows windows_at(long step) const {
    StepWindows w = stage_windows_at(step);
    if (step == total_steps() && final_window_ > 0) w.long_blocks = final_window_;
    return w;
  }
  // Its stage's alone, at N + E too (the windows YaRN follows: llmc/yarn.h).
  StepWindows stage_windows_at(long step) const {
    const Stage& s = stages_[stage_of(step)];
    return step_windows(run_window_blocks(s.window.long_blocks, step, total_steps()), s.window.short_blocks);
  }

  // What holds at step s of B sequences a process on `processes` processes.
  StepPlan at(long step, int B, int processes) const {
    StepPlan p;
    p.stage = stage_of(step);
    const Stage& s = stages_[p.stage];
    p.T = s.T;
    p.micro_steps = micro_steps_of(s.tokens, B, s.T, processes, tokens_name());
    p.tokens = (long)p.micro_steps * B * s.T * processes;
    p.cap = s.cap;
    p.windows = windows_at(step);
    p.lr_multiplier = s.lr_multiplier;
    const long first = p.stage == 0 ? 0 : stages_[p.stage - 1].end;
    p.loss = s.loss.at(s.end > first ? (double)(step - first) / (double)(s.end - first) : 0.0);
    return p;
  }

  // "-z", or where the plan has several stages "z" (a stage's messages name the stage first).
  std::string tokens_name() const { return stages_.size() == 1 ? "-z" : "z"; }

  // The tokens of steps 0 to steps - 1 (of all processes).
  long tokens_through(long steps, int B, int processes) const {
    long tokens = 0, first = 0;
    for (int i = 0; i < (int)stages_.size() && first < steps; i++) {
      const long last = i == (int)stages_.size() - 1 ? steps : std::min(steps, stages_[i].end);
      tokens += (last - first) * at(first, B, processes).tokens;
      first = last;
    }
    return tokens;
  }
  // The most tokens a process takes in one step (its micro steps' B*T), over every stage.
  long max_step_tokens_per_process(int B, int processes) const {
    long tokens = 0;
    for (size_t i = 0; i < stages_.size(); i++) {
      const Stage& s = stages_[i];
      tokens = std::max(tokens, (long)micro_steps_of(s.tokens, B, s.T, processes, tokens_name()) * B * s.T);
    }
    return tokens;
  }

  int max_T() const {
    int T = 0;
    for (const Stage& s : stages_) T = std::max(T, s.T);
    return T;
  }
  // The largest long window of any step, the final one's among them (0: none): no short window
  // is wider.
  int max_window() const {
    int blocks = final_window_;
    for (const Stage& s : stages_) blocks = std::max(blocks, run_window_blocks_max(s.window.long_blocks));
    return blocks;
  }
  bool has_cap() const {
    for (const Stage& s : stages_) {
      if (s.cap > 0) return true;
    }
    return false;
  }
  // Whether a stage's loss weights change within it (mtp=A>B, pw=A>B), over steps that resolve gives.
  bool has_loss_ramp() const {
    for (const Stage& s : stages_) {
      if (s.loss.ramps()) return true;
    }
    return false;
  }
  // Whether a stage's prefix term has a weight, so the run needs the prefix table.
  bool has_prefix_term() const {
    for (const Stage& s : stages_) {
      if (s.loss.start.prefix > 0.0f || s.loss.end.prefix > 0.0f) return true;
    }
    return false;
  }
  // The first stage whose t differs from the first's (0: none).
  int first_length_change() const {
    for (size_t i = 1; i < stages_.size(); i++) {
      if (stages_[i].T != stages_[0].T) return (int)i;
    }
    return 0;
  }

  // The start-up table's row, one stage a line: "1: steps 0-422, t 256, 8192 tokens a step (1 micro
  // step), documents capped at 896 tokens, window 3 blocks, short 1, lr x 1, mtp 1,0.5,0.25>1,0.5,0,
  // pw 0.25" (with B and processes for the micro steps).
  std::string describe(int B, int processes) const {
    std::string out;
    for (size_t i = 0; i < stages_.size(); i++) {
      const Stage& s = stages_[i];
      const long first = i == 0 ? 0 : stages_[i - 1].end;
      const int micro = micro_steps_of(s.tokens, B, s.T, processes, tokens_name());
      out += strformat("%s%zu: steps %ld-%ld%s, t %d, %ld tokens a step (%d micro step%s), %s, window %s, lr x %g, %s",
                       i == 0 ? "" : "; ", i + 1, first, s.end - 1, s.extension_steps ? " (extension)" : "",
                       s.T, (long)micro * B * s.T * processes, micro, micro == 1 ? "" : "s",
                       s.cap ? strformat("documents capped at %d tokens", s.cap).c_str() : "no document cap",
                       s.window.describe().c_str(), s.lr_multiplier, s.loss.describe().c_str());
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    LLMC_FAIL("%s: stage %zu: %s", flag_, stages_.size() + 1, what.c_str());
  }

  double parse_share(const std::string& word) const {
    const size_t slash = word.find('/');
    if (slash != std::string::npos) {
      const long a = parse_count(word.substr(0, slash), word), b = parse_count(word.substr(slash + 1), word);
      return (double)a / (double)b;
    }
    char* end = nullptr;
    errno = 0;
    const double share = strtod(word.c_str(), &end);
    if (!plain_decimal(word) || *end != '\0' || errno != 0 || !(share > 0.0) || !std::isfinite(share)) {
      fail(strformat("share '%s' is not a positive number, a fraction like 1/3, or +E extension steps", word.c_str()));
    }
    return share;
  }

  long parse_count(const std::string& digits, const std::string& word) const {
    char* end = nullptr;
    errno = 0;
    const long n = strtol(digits.c_str(), &end, 10);
    if (!plain_integer(digits) || *end != '\0' || errno != 0 || n <= 0 || n > INT32_MAX) {
      fail(strformat("'%s': give a share as a fraction of positive integers (1/3), a decimal, or +E", word.c_str()));
    }
    return n;
  }

  long parse_extension(const std::string& word) const {
    char* end = nullptr;
    errno = 0;
    const long n = strtol(word.c_str() + 1, &end, 10);
    if (!plain_integer(word.substr(1)) || *end != '\0' || errno != 0 || n < 1 || n > INT32_MAX) {
      fail(strformat("'%s': give extension steps as +E, E a whole number from 1", word.c_str()));
    }
    return n;
  }

  long parse_value(const std::string& key, const std::string& value, long lo, long hi) const {
    char* end = nullptr;
    errno = 0;
    const long n = strtol(value.c_str(), &end, 10);
    if (!plain_integer(value) || *end != '\0' || errno != 0 || n < lo || n > hi) {
      fail(strformat("%s=%s: give an integer from %ld to %ld", key.c_str(), value.c_str(), lo, hi));
    }
    return n;
  }

  void set_key(Stage& s, const std::string& key, const std::string& value) const {
    if (key == "t") {
      s.T = (int)parse_value(key, value, 1, INT32_MAX);
    } else if (key == "z") {
      s.tokens = parse_value(key, value, -1, LONG_MAX);
      if (s.tokens == 0) fail("z=0: give the tokens a step, or -1 for one micro batch");
    } else if (key == "cap") {
      s.cap = (int)parse_value(key, value, 0, INT32_MAX);
    } else if (key == "aw") {
      s.window = parse_window_setting(value, strformat("%s: stage %zu: aw=%s", flag_, stages_.size() + 1, value.c_str()));
    } else if (key == "lr") {
      char* end = nullptr;
      s.lr_multiplier = strtod(value.c_str(), &end);
      if (!plain_decimal(value) || *end != '\0' || !(s.lr_multiplier >= 0.0) || !std::isfinite(s.lr_multiplier)) {
        fail(strformat("lr=%s: give the learning-rate multiplier, a number of 0 or more", value.c_str()));
      }
    } else if (key == "mtp") {
      parse_ramp(key, value, [&](const std::string& text, LossWeights& w) {
        w.next_tokens = parse_next_token_weights(text, value);
      }, s.loss);
    } else if (key == "pw") {
      parse_ramp(key, value, [&](const std::string& text, LossWeights& w) {
        if (!parse_weight(text, &w.prefix)) {
          fail(strformat("pw=%s: give the prefix term's weight within [0, 1], or START>END", value.c_str()));
        }
      }, s.loss);
    } else {
      fail(strformat("unknown setting '%s': a stage sets t, z, cap, aw, lr, mtp and pw (KEY=VALUE)", key.c_str()));
    }
  }

  // A loss weight: a plain decimal within [0, 1], read as -mtp and -pw read theirs (strtof).
  static bool parse_weight(const std::string& text, float* weight) {
    char* end = nullptr;
    *weight = strtof(text.c_str(), &end);
    return plain_decimal(text) && *end == '\0' && *weight >= 0.0f && *weight <= 1.0f;
  }

  // mtp='s weights at one end of the stage: 1 to kMaxPredictedTokens apart by commas.
  PredictionWeights parse_next_token_weights(const std::string& text, const std::string& value) const {
    PredictionWeights w;
    w.count = 0;
    for (size_t start = 0;;) {
      const size_t comma = std::min(text.find(',', start), text.size());
      if (w.count == kMaxPredictedTokens || !parse_weight(text.substr(start, comma - start), &w.weight[w.count])) {
        fail(strformat("mtp=%s: give 1 to %d next-token weights within [0, 1] apart by commas (1,0.5,0.25), or "
                       "START>END", value.c_str(), kMaxPredictedTokens));
      }
      w.count++;
      if (comma == text.size()) return w;
      start = comma + 1;
    }
  }

  // mtp='s or pw='s VALUE, "A" (constant) or "A>B", each end set into `ramp` by parse_end.
  template <typename ParseEnd>
  void parse_ramp(const std::string& key, const std::string& value, ParseEnd parse_end, LossWeightRamp& ramp) const {
    const size_t arrow = value.find('>');
    parse_end(value.substr(0, arrow), ramp.start);
    parse_end(arrow == std::string::npos ? value : value.substr(arrow + 1), ramp.end);
    if (ramp.start.next_tokens.count != ramp.end.next_tokens.count) {
      fail(strformat("%s=%s: %d weights at the start and %d at the end: give as many at each end", key.c_str(),
                     value.c_str(), ramp.start.next_tokens.count, ramp.end.next_tokens.count));
    }
  }

  Stage parse_stage(const std::string& text, const Stage& before) const {
    const std::vector<std::string> words = split_words(text);
    if (words.empty()) fail("empty: give its share of the steps (0.5, 1/3, or +E extension steps), then KEY=VALUE settings");
    if (!stages_.empty() && stages_.back().extension_steps > 0) {
      fail("comes after the extension steps (+E), which must be the last stage");
    }
    Stage s = before;
    s.extension_steps = 0;
    if (words[0][0] == '+') {
      s.extension_steps = parse_extension(words[0]);
      s.share = 0.0;
    } else {
      s.share = parse_share(words[0]);
    }
    std::vector<std::string> keys;
    for (size_t i = 1; i < words.size(); i++) {
      const size_t eq = words[i].find('=');
      if (eq == std::string::npos) {
        fail(strformat("'%s': settings are KEY=VALUE (t, z, cap, aw, lr, mtp, pw)", words[i].c_str()));
      }
      const std::string key = words[i].substr(0, eq);
      if (std::count(keys.begin(), keys.end(), key)) fail(strformat("sets %s twice", key.c_str()));
      keys.push_back(key);
      set_key(s, key, words[i].substr(eq + 1));
    }
    if (!s.loss.start.any_positive()) {
      fail(strformat("%s: every term of the loss starts at weight 0: give the next token a weight (mtp=1)",
                     s.loss.describe().c_str()));
    }
    return s;
  }

  void check_shares() const {
    double sum = 0.0;
    for (const Stage& s : stages_) sum += s.share;
    if (scheduled_count() == 0) {
      LLMC_FAIL("%s: only extension steps: give the scheduled stages' shares first (1 for one stage)", flag_);
    }
    if (std::fabs(sum - 1.0) > 1e-6) {
      LLMC_FAIL("%s: the stages' shares of the steps sum to %.9g, not 1: make them add up to 1 (1/3 1/3 1/3, or "
                "0.25 0.75)", flag_, sum);
    }
  }

  static std::vector<std::string> split_words(const std::string& text) {
    std::vector<std::string> words;
    size_t i = 0;
    while (true) {
      i = text.find_first_not_of(" \t", i);
      if (i == std::string::npos) return words;
      const size_t end = text.find_first_of(" \t", i);
      words.push_back(text.substr(i, end == std::string::npos ? std::string::npos : end - i));
      if (end == std::string::npos) return words;
      i = end;
    }
  }

  const char* flag_ = "-sp";
  std::vector<Stage> stages_;
  long scheduled_ = 0;
  int final_window_ = 0;
};

}  // namespace llmc
