// The command line both trainers share. One table of flags drives parsing (each flag's setter
// checks its range and names the flag in its error), the --help text with every default, and the
// start-up table of every setting. train_flags() holds the flags both trainers take, with their
// defaults (TrainFlags), ranges and help; a program appends its own flags to them, so the shared
// ones cannot drift apart between the CPU and the CUDA trainer.
//
// Every flag takes one value: "-x 100". --help prints the usage, and so does -h where the program
// has no -h flag of its own (the CUDA trainer's -h is HellaSwag, and takes a value like any flag).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_blocks.h"
#include "gpt2.h"
#include "recipe.h"
#include "schedulers.h"
#include "stages.h"
#include "tokenizer.h"
#include "utils.h"

namespace llmc {

struct Flag {
  const char* name;   // "-b"
  const char* label;  // its row in the start-up table
  const char* help;   // its line in --help
  std::function<void(const char* text)> set;  // parses and range-checks the value, or fails
  std::function<std::string()> show;          // the current value
  const void* value = nullptr;                // the setting it writes (recipe_flags)
};

// "0 or 1", "within [0, 1]", "at least 1", "at most 2147483647": the range that `value` is
// outside of, for error messages; a range up to the type's limit is named by the bound it breaks.
inline std::string range_text(long value, long min, long max) {
  if (min == 0 && max == 1) return "0 or 1";
  if (max != INT32_MAX && max != LONG_MAX) return strformat("within [%ld, %ld]", min, max);
  return value < min ? strformat("at least %ld", min) : strformat("at most %ld", max);
}

inline long parse_int(const char* flag, const char* text, long min, long max) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (!*text || *end || errno) LLMC_FAIL("%s '%s': not an integer", flag, text);
  if (v < min || v > max) LLMC_FAIL("%s %ld: must be %s", flag, v, range_text(v, min, max).c_str());
  return v;
}

// -ri's init of a speedrun model from the seed: 0 (record #28's) or 89 (record #89's).
inline SpeedrunInit parse_speedrun_init(const char* flag, const char* text) {
  const long v = parse_int(flag, text, 0, INT32_MAX);
  if (v != (long)SpeedrunInit::kRecord28 && v != (long)SpeedrunInit::kRecord89) {
    LLMC_FAIL("%s %ld: no such init; give 89 (record #89's) or 0 (record #28's, the speedrun's own)", flag, v);
  }
  return (SpeedrunInit)v;
}

// A number read as its type (float: strtof, double: strtod, so each is the nearest to the text).
template <typename Real>
Real parse_real(const char* flag, const char* text, Real min, Real max) {
  char* end = nullptr;
  errno = 0;
  Real v;
  if constexpr (std::is_same_v<Real, float>) {
    v = strtof(text, &end);
  } else {
    v = strtod(text, &end);
  }
  if (!*text || *end || errno || !std::isfinite(v)) LLMC_FAIL("%s '%s': not a number", flag, text);
  if (v < min || v > max) {
    const std::string range = max == std::numeric_limits<Real>::max()
                                  ? strformat("at least %g", (double)min)
                                  : strformat("within [%g, %g]", (double)min, (double)max);
    LLMC_FAIL("%s %g: must be %s", flag, (double)v, range.c_str());
  }
  return v;
}

inline float parse_float(const char* flag, const char* text, float min, float max) {
  return parse_real(flag, text, min, max);
}

// -lc's value: the cap within [1, 40], or the cap and the sigmoid cap's shift within [-100, 100]
// ("23,5"): record #89's 23 sigmoid((z + 5) / 7.5); a third item "bf16" rounds the sigmoid to BF16
// in training ("23,5,bf16"), as record #89's loss kernel does.
inline LogitCapSetting parse_logit_cap_setting(const char* flag, const char* text) {
  const std::string all = text;
  const size_t comma = all.find(','), second = comma == std::string::npos ? comma : all.find(',', comma + 1);
  LogitCapSetting s;
  s.cap = parse_float(flag, all.substr(0, comma).c_str(), 1.0f, 40.0f);
  if (comma == std::string::npos) return s;
  s.shift = parse_float(flag, all.substr(comma + 1, second - comma - 1).c_str(), -100.0f, 100.0f);
  if (second == std::string::npos) return s;
  if (all.substr(second + 1) != "bf16") {
    LLMC_FAIL("%s %s: the third item rounds the sigmoid to BF16 and can only be bf16 (e.g. 23,5,bf16)", flag, text);
  }
  s.bf16_sigmoid = true;
  return s;
}

// -fhs's value: the FP8 head's three scales over 448, "X,W,G" (Fp8HeadScales), X 0 for sqrt(C)
// and W, G above 0 ("100,1.6,0.75": record #89's).
inline Fp8HeadScales parse_fp8_head_scales(const char* flag, const char* text) {
  const std::string all = text;
  const size_t first = all.find(','), second = first == std::string::npos ? first : all.find(',', first + 1);
  if (second == std::string::npos || all.find(',', second + 1) != std::string::npos) {
    LLMC_FAIL("%s %s: give three numbers apart by commas, X,W,G (x_s = X/448 with 0 for sqrt(C)/448, w_s = W/448, "
              "grad_s = G/448), e.g. 100,1.6,0.75", flag, text);
  }
  constexpr double kMax = 1e6, kMin = 1e-6;
  Fp8HeadScales s;
  s.input = parse_real(flag, all.substr(0, first).c_str(), 0.0, kMax);
  s.weight = parse_real(flag, all.substr(first + 1, second - first - 1).c_str(), kMin, kMax);
  s.grad = parse_real(flag, all.substr(second + 1).c_str(), kMin, kMax);
  return s;
}

// -fhs's text of the scales: each with 6 significant digits, or more where it needs them to read
// back as its double.
inline std::string fp8_head_scales_text(const Fp8HeadScales& s) {
  auto text_of = [](double v) {
    for (int digits = 6;; digits++) {
      const std::string text = strformat("%.*g", digits, v);
      if (strtod(text.c_str(), nullptr) == v) return text;
    }
  };
  return text_of(s.input) + "," + text_of(s.weight) + "," + text_of(s.grad);
}

// -mt's value (`flag`): Muon's rate of a tensor's matrices over its own (-ml), "NAME=X,..." with NAME a
// tensor Muon takes (the parameter table's matrices) and X positive: "fcw=2,fcprojw=4" (record #89's);
// "" none (train_gpt2.py's --muon_tensor_lr).
inline TensorMultipliers parse_muon_tensor_lr(const char* flag, const std::string& text) {
  TensorMultipliers x = tensor_multipliers_one();
  std::vector<bool> named(kNumParamTensors, false);
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string pair = text.substr(start, end - start);
    start = end + 1;
    const size_t eq = pair.find('=');
    const std::string name = pair.substr(0, eq);
    const int tensor = param_tensor_index(name);
    if (tensor < 0 || param_tensor_spec(tensor).role != ParamRole::kMatrix) {
      std::string names;
      for (int i = 0; i < kNumParamTensors; i++) {
        if (param_tensor_spec(i).role == ParamRole::kMatrix) names += strformat(names.empty() ? "%s" : ", %s", param_tensor_name(i));
      }
      LLMC_FAIL("%s %s: '%s' is not a tensor Muon takes: name one of %s", flag, text.c_str(), name.c_str(),
                names.c_str());
    }
    if (eq == std::string::npos) {
      LLMC_FAIL("%s %s: give NAME=X, X the tensor's multiplier of -ml, positive: 'fcprojw=4'", flag, pair.c_str());
    }
    const float value = parse_float(strformat("%s %s", flag, name.c_str()).c_str(), pair.c_str() + eq + 1, 0.0f,
                                    FLT_MAX);
    if (!(value > 0.0f)) {
      LLMC_FAIL("%s %s: give NAME=X, X the tensor's multiplier of -ml, positive: 'fcprojw=4'", flag, pair.c_str());
    }
    if (named[tensor]) LLMC_FAIL("%s %s: %s is named twice: give it once", flag, text.c_str(), name.c_str());
    named[tensor] = true;
    x[tensor] = value;
  }
  return x;
}

// -mt's text of the multipliers other than 1, "fcw=2,fcprojw=4" ("" none), which parse_muon_tensor_lr
// reads back exactly.
inline std::string muon_tensor_lr_text(const TensorMultipliers& x) {
  std::string text;
  for (int i = 0; i < kNumParamTensors; i++) {
    if (x[i] != 1.0f) text += (text.empty() ? "" : ",") + std::string(param_tensor_name(i)) + "=" + float_text(x[i]);
  }
  return text;
}

// -ar's value (`flag`): AdamW tensors' own rows, "NAME:key=value,...;NAME:..." with NAME a tensor
// of the parameter table (the start-up table's names) and keys lr (times its role's rate) or rate
// (its own rate), b1, b2 (its betas, within (0, 1)), wd (times its role's decay) or decay (its
// own), and bf16 (none, weight or all: what of its step BF16 builds round to nearest BF16, in place
// of its role's): "ve:lr=75,b1=0.75,b2=0.95,wd=5,bf16=weight"; "" none.
inline AdamTensorRows parse_adam_rows(const char* flag, const std::string& text) {
  AdamTensorRows rows;
  std::vector<bool> named(kNumParamTensors, false);
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find(';', start), text.size());
    const std::string row_text = text.substr(start, end - start);
    start = end + 1;
    const size_t colon = row_text.find(':');
    if (colon == std::string::npos || colon + 1 == row_text.size()) {
      LLMC_FAIL("%s '%s': a row is NAME:key=value,... (keys lr, rate, b1, b2, wd, decay, bf16): "
                "\"ve:lr=75,b1=0.75,b2=0.95,wd=5\"",
                flag, row_text.c_str());
    }
    const std::string name = row_text.substr(0, colon);
    const int tensor = param_tensor_index(name);
    if (tensor < 0) {
      std::string names;
      for (int i = 0; i < kNumParamTensors; i++) names += strformat(i ? ", %s" : "%s", param_tensor_name(i));
      LLMC_FAIL("%s %s: no parameter tensor '%s': name one of %s", flag, row_text.c_str(), name.c_str(),
                names.c_str());
    }
    if (named[tensor]) LLMC_FAIL("%s %s: %s has two rows: give it one", flag, text.c_str(), name.c_str());
    named[tensor] = true;
    AdamTensorRow& row = rows[tensor];
    for (size_t at = colon + 1; at <= row_text.size();) {
      const size_t stop = std::min(row_text.find(',', at), row_text.size());
      const std::string pair = row_text.substr(at, stop - at);
      at = stop + 1;
      const size_t eq = pair.find('=');
      const std::string key = pair.substr(0, eq);
      const std::string label = strformat("%s %s:%s", flag, name.c_str(), key.c_str());
      const char* value = eq == std::string::npos ? "" : pair.c_str() + eq + 1;
      if (key == "lr" || key == "wd") {
        (key == "lr" ? row.lr : row.weight_decay) = parse_float(label.c_str(), value, 0.0f, FLT_MAX);
      } else if (key == "rate" || key == "decay") {
        (key == "rate" ? row.rate : row.decay) = parse_float(label.c_str(), value, 0.0f, FLT_MAX);
      } else if (key == "b1" || key == "b2") {
        const float beta = parse_float(label.c_str(), value, 0.0f, 1.0f);
        if (beta == 0.0f || beta == 1.0f) LLMC_FAIL("%s %g: must be within (0, 1)", label.c_str(), beta);
        (key == "b1" ? row.beta1 : row.beta2) = beta;
      } else if (key == "bf16") {
        const AdamBf16 kinds[] = {AdamBf16::kNone, AdamBf16::kWeight, AdamBf16::kAll};
        const AdamBf16* kind = std::find_if(std::begin(kinds), std::end(kinds),
                                            [&](AdamBf16 k) { return std::string(adam_bf16_name(k)) == value; });
        if (kind == std::end(kinds)) {
          LLMC_FAIL("%s '%s': give none (FP32), weight (the weight rounded to BF16) or all (the moments too)",
                    label.c_str(), value);
        }
        row.bf16 = *kind;
      } else {
        LLMC_FAIL("%s %s: '%s' is not key=value of lr, rate, b1, b2, wd, decay or bf16", flag, row_text.c_str(),
                  pair.c_str());
      }
    }
    const bool rate_twice = row.rate && row.lr != 1.0f, decay_twice = row.decay && row.weight_decay != 1.0f;
    if (rate_twice || decay_twice) {
      LLMC_FAIL("%s %s: %s sets its own %s and a multiplier of its role's: give one of %s", flag, row_text.c_str(),
                name.c_str(), rate_twice ? "rate" : "decay", rate_twice ? "rate and lr" : "decay and wd");
    }
  }
  return rows;
}

// A debug state's settings of train_gpt2cu's flags (version 5: DebugState::settings), which its
// header does not hold: the loss's (-lc, -mtp, -pw), the untie step (-ut), the windows' unit (-awt),
// Muon's NorMuon (-mn) and Q and K blocks (-mq), AdamW's interval (-ao) and tensors' rows (-ar), the FP8
// head's scales (-fhs), the key offset (-ko), the attention's scale (-asc), YaRN (-yn), Muon's rates of
// tensors (-mt), the cautious weight decay (-cd) and the MLP backward from ReLU^2's output (-mr).
struct DebugStateSettings {
  LogitCapSetting logit_cap;
  PredictionWeights next_token_weights;
  float prefix_weight = 0.0f;
  int untie_step = -1;
  WindowUnit window_unit = WindowUnit::kBlocks;  // -awt 1: windows counted in tokens
  int normuon = 0;
  int adam_every = 1;
  int muon_qk_heads = 0;
  Fp8HeadScales fp8_head_scales;
  int key_offset = 0;
  AdamTensorRows adam_rows;
  double attention_scale = 0.0;  // 0: the architecture's
  int yarn = 0;
  TensorMultipliers muon_tensor_lr = tensor_multipliers_one();  // -mt
  int cautious_decay = 0;                                        // -cd
  int mlp_from_output = 0;                                       // -mr
  int fp8_mlp = 0;                                               // -fm
};

// -asc's value: the attention's softmax scale, positive and finite (record #89's 0.1).
inline double parse_attention_scale(const char* flag, const char* text) {
  const double scale = parse_real(flag, text, -DBL_MAX, DBL_MAX);
  if (!(scale > 0.0)) {
    LLMC_FAIL("%s %g: the attention's softmax scale must be positive (record #89's 0.1; leave %s out for the "
              "architecture's)", flag, scale, flag);
  }
  return scale;
}

// -mtp's value: 1 to 3 weights within [0, 1] apart by commas ("1,0.5,0.25").
inline PredictionWeights parse_prediction_weights(const char* flag, const char* text) {
  const std::string all = text;
  PredictionWeights w;
  w.count = 0;
  for (size_t start = 0;;) {
    if (w.count == kMaxPredictedTokens) {
      LLMC_FAIL("%s %s: more than %d weights (the next token's and the %d after it)", flag, text, kMaxPredictedTokens,
                kMaxPredictedTokens - 1);
    }
    const size_t end = std::min(all.find(',', start), all.size());
    w.weight[w.count++] = parse_float(flag, all.substr(start, end - start).c_str(), 0.0f, 1.0f);
    if (end == all.size()) return w;
    start = end + 1;
  }
}

// A data tool's "--flag value" pairs, in order, each given to set (false: not a flag of the
// tool); -h or --help prints usage and exits. Errors end with where the flags are listed.
inline void parse_tool_flags(int argc, char** argv, const char* usage,
                             const std::function<bool(const std::string& flag, const std::string& value)>& set) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      printf("%s", usage);
      exit(0);
    }
    if (i + 1 >= argc) {
      LLMC_FAIL("%s needs a value (or is not a flag); --help lists the flags", flag.c_str());
    }
    if (!set(flag, argv[i + 1])) LLMC_FAIL("unknown flag '%s'; --help lists the flags", flag.c_str());
  }
}

inline Flag text_flag(const char* name, const char* label, const char* help, std::string* value) {
  return {name, label, help, [value](const char* text) { *value = text; },
          [value] { return value->empty() ? std::string("none") : *value; }, value};
}

template <typename Int>
Flag int_flag(const char* name, const char* label, const char* help, Int* value, long min,
              long max) {
  return {name, label, help,
          [=](const char* text) { *value = (Int)parse_int(name, text, min, max); },
          [value] { return std::to_string(*value); }, value};
}

inline Flag float_flag(const char* name, const char* label, const char* help, float* value,
                       float min, float max) {
  return {name, label, help, [=](const char* text) { *value = parse_float(name, text, min, max); },
          [value] { return strformat("%g", *value); }, value};
}

// A setting that must be read as exactly as train_gpt2.py reads it (a Python float is a double).
inline Flag double_flag(const char* name, const char* label, const char* help, double* value,
                        double min, double max) {
  return {name, label, help, [=](const char* text) { *value = parse_real(name, text, min, max); },
          [value] { return strformat("%g", *value); }, value};
}

// The settings of the shared flags, with their defaults: the run's record (Recipe, GPT-2's until
// a recipe fills it), which holds the flags a recipe sets, and the others.
struct TrainFlags : Recipe {
  std::string train_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_train_*.bin";
  std::string val_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_val_*.bin";
  std::string model = "d12";
  std::string output_dir;
  std::string tokenizer;  // none: kDefaultTokenizer where it exists (resolve_tokenizer)
  int warmup = 0;
  int sample_every = 20;
  int gen_len = 0;  // 0 until resolve_sample_length
  int overfit = 0;
  int seed = 42;
};

// The settings a debug state names, the defaults where it names none (its prefix table also beside
// -pw 0, where its stage plan's pw= weights the prefix term); `path` names the file.
inline DebugStateSettings debug_state_settings(const DebugState& d, const std::string& path) {
  DebugStateSettings s;
  std::vector<std::string> words;
  for (size_t at = 0; at < d.settings.size();) {
    const size_t end = std::min(d.settings.find(' ', at), d.settings.size());
    if (end > at) words.push_back(d.settings.substr(at, end - at));
    at = end + 1;
  }
  for (size_t i = 0; i < words.size(); i += 2) {
    const std::string& flag = words[i];
    if (i + 1 == words.size() ||
        (flag != "-lc" && flag != "-mtp" && flag != "-pw" && flag != "-ut" && flag != "-awt" && flag != "-mn" &&
         flag != "-ao" && flag != "-mq" && flag != "-fhs" && flag != "-ko" && flag != "-ar" && flag != "-asc" &&
         flag != "-yn" && flag != "-mt" && flag != "-cd" && flag != "-mr" && flag != "-fm")) {
      LLMC_FAIL("%s: settings '%s' are not pairs of -lc, -mtp, -pw, -ut, -awt, -mn, -ao, -mq, -fhs, -ko, -ar, "
                "-asc, -yn, -mt, -cd, -mr and -fm: re-create it with train_gpt2.py",
                path.c_str(), d.settings.c_str());
    }
    const char* value = words[i + 1].c_str();
    if (flag == "-lc") s.logit_cap = parse_logit_cap_setting("-lc", value);
    if (flag == "-mtp") s.next_token_weights = parse_prediction_weights("-mtp", value);
    if (flag == "-pw") s.prefix_weight = parse_float("-pw", value, 0.0f, 1.0f);
    if (flag == "-ut") s.untie_step = (int)parse_int("-ut", value, -1, INT32_MAX);
    if (flag == "-awt") s.window_unit = parse_int("-awt", value, 0, 1) ? WindowUnit::kTokens : WindowUnit::kBlocks;
    if (flag == "-mn") s.normuon = (int)parse_int("-mn", value, 0, 1);
    if (flag == "-ao") s.adam_every = (int)parse_int("-ao", value, 1, kMaxAdamEvery);
    if (flag == "-mq") s.muon_qk_heads = (int)parse_int("-mq", value, 1, INT32_MAX);
    if (flag == "-fhs") s.fp8_head_scales = parse_fp8_head_scales("-fhs", value);
    if (flag == "-ko") s.key_offset = (int)parse_int("-ko", value, 0, 1);
    if (flag == "-ar") s.adam_rows = parse_adam_rows("-ar", value);
    if (flag == "-asc") s.attention_scale = parse_attention_scale("-asc", value);
    if (flag == "-yn") s.yarn = (int)parse_int("-yn", value, 0, 1);
    if (flag == "-mt") s.muon_tensor_lr = parse_muon_tensor_lr("-mt", value);
    if (flag == "-cd") s.cautious_decay = (int)parse_int("-cd", value, 0, 1);
    if (flag == "-mr") s.mlp_from_output = (int)parse_int("-mr", value, 0, 1);
    if (flag == "-fm") s.fp8_mlp = (int)parse_int("-fm", value, 0, 1);
  }
  if (s.prefix_weight > 0.0f && d.prefix_table.empty()) {
    LLMC_FAIL("%s: -pw %g and no prefix table: the file is damaged; re-create it with train_gpt2.py", path.c_str(),
              s.prefix_weight);
  }
  return s;
}

// The shared flags, then the program's own (`own`); a name in both is a programming error.
inline std::vector<Flag> train_flags(TrainFlags& f, const std::vector<Flag>& own = {}) {
  constexpr long kIntMax = INT32_MAX;
  Flag schedule = text_flag("-k", "lr schedule",
                            "learning-rate schedule: cosine linear constant wsd cooldown", &f.schedule);
  schedule.set = [&f](const char* text) {
    parse_lr_schedule(text, "-k");
    f.schedule = text;
  };
  std::vector<Flag> flags = {
      text_flag("-i", "train data", "train token shards (a glob pattern: quote it)",
                &f.train_pattern),
      text_flag("-j", "val data", "validation token shards (a glob pattern: quote it)",
                &f.val_pattern),
      text_flag("-e", "model",
                "checkpoint file, or a preset initialised from the seed: d12 d24 d36 d48 tiny",
                &f.model),
      text_flag("-o", "output dir",
                "output directory for main.log and checkpoints (none: no output)", &f.output_dir),
      text_flag("-tk", "tokenizer",
                "GPT-2 vocabulary file, to print samples as text (none: tiny shakespeare's where "
                "it exists, else token ids)", &f.tokenizer),
      int_flag("-b", "micro batch B", "micro batch size: sequences per process and micro step",
               &f.B, 1, kIntMax),
      int_flag("-t", "sequence length T",
               "sequence length (0: the model's maximum, 1024 for d12 to d48, 64 for tiny)", &f.T,
               0, kIntMax),
      int_flag("-z", "total batch (tokens)",
               "tokens per step, a multiple of B*T*processes (-1: B*T*processes, no accumulation)",
               &f.total_batch, -1, LONG_MAX),
      float_flag("-l", "learning rate", "peak learning rate", &f.lr, 0.0f, FLT_MAX),
      int_flag("-u", "warmup steps", "learning-rate warmup steps", &f.warmup, 0, kIntMax),
      float_flag("-q", "final lr fraction", "final learning rate as a fraction of the peak",
                 &f.final_lr_frac, 0.0f, 1.0f),
      schedule,
      float_flag("-c", "weight decay", "weight decay of the 2-D matrices", &f.weight_decay, 0.0f,
                 FLT_MAX),
      float_flag("-gc", "grad clip", "gradient clipping norm (0: off)", &f.grad_clip, 0.0f,
                 FLT_MAX),
      int_flag("-x", "steps",
               "training steps (-1: one epoch of the training data, 0: evaluate only)",
               &f.max_steps, -1, kIntMax),
      int_flag("-v", "val every", "validation loss every N steps (0: never)", &f.val_every, 0,
               kIntMax),
      int_flag("-m", "val batches", "validation batches per evaluation and process (0: no validation)",
               &f.val_batches, 0, kIntMax),
      int_flag("-s", "sample every", "sample from the model every N steps (0: never)",
               &f.sample_every, 0, kIntMax),
      int_flag("-g", "sample length",
               "tokens generated per sample, at most the model's maximum sequence length - 1 (0: "
               "64, or that limit where it is less)", &f.gen_len, 0, kIntMax),
      int_flag("-a", "overfit one batch", "1: train on the first batch over and over (debugging)",
               &f.overfit, 0, 1),
      int_flag("-S", "seed", "seed of the initialisation, the data order and sampling", &f.seed, 0,
               kIntMax),
  };
  for (const Flag& extra : own) {
    for (const Flag& existing : flags) {
      if (std::string(extra.name) == existing.name) {
        LLMC_FAIL("flag %s is defined twice: it is one of the shared flags of llmc/flags.h",
                  extra.name);
      }
    }
    flags.push_back(extra);
  }
  return flags;
}

// Parses args (the words after the program name) into the flags' settings. Returns false when
// the usage was asked for. `program` names the program in the message about an unknown flag;
// `fail_foreign`, where given, sees an unknown flag first and may fail with a message of its own
// (the CPU trainer names the CUDA trainer's flags as such).
inline bool parse_flags(const std::vector<std::string>& args, const std::vector<Flag>& flags,
                        const char* program,
                        const std::function<void(const std::string& name)>& fail_foreign = {}) {
  for (size_t i = 0; i < args.size(); i += 2) {
    const std::string& name = args[i];
    const Flag* flag = nullptr;
    for (const Flag& f : flags) {
      if (name == f.name) flag = &f;
    }
    const bool has_value = i + 1 < args.size();
    if (name == "--help" || (name == "-h" && !flag)) return false;
    if (!flag) {
      if (name.empty() || name[0] != '-') {
        LLMC_FAIL("'%s' is not a flag: flags start with '-' and take one value each (quote a glob "
                  "pattern, -i 'dir/*.bin', or the shell expands it into several words)",
                  name.c_str());
      }
      if (fail_foreign) fail_foreign(name);
      LLMC_FAIL("unknown flag '%s': %s --help lists the flags", name.c_str(), program);
    }
    if (!has_value) {
      LLMC_FAIL("flag %s needs a value: %s (--help for the usage)", flag->name, flag->help);
    }
    flag->set(args[i + 1].c_str());
  }
  return true;
}

// The flags that write the run's record (their settings lie in `record`, the Recipe part of the
// settings they write), in the record's order: those whose defaults -recipe sets.
inline std::vector<const Flag*> recipe_flags(const Recipe& record, const std::vector<Flag>& flags) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(&record), end = begin + sizeof(Recipe);
  std::vector<const Flag*> out;
  for (const Flag& f : flags) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(f.value);
    if (at >= begin && at < end) out.push_back(&f);
  }
  std::sort(out.begin(), out.end(), [](const Flag* x, const Flag* y) {
    return reinterpret_cast<uintptr_t>(x->value) < reinterpret_cast<uintptr_t>(y->value);
  });
  return out;
}

// The width --help and the start-up table keep within: a terminal's 80 columns and then some, and
// a log viewer's line.
constexpr size_t kScreenWidth = 100;

// text cut at its spaces into lines of at most `width` characters (the spaces at a cut are
// dropped, the others kept); a word longer than a line is cut into pieces that fill lines.
inline std::vector<std::string> text_wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines(1);
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = text.find_first_not_of(' ', pos);
    if (start == std::string::npos) break;
    const size_t end = std::min(text.find(' ', start), text.size());
    std::string word = text.substr(start, end - start);
    const size_t gap = lines.back().empty() ? 0 : start - pos;
    if (!lines.back().empty() && lines.back().size() + gap + word.size() > width) {
      lines.emplace_back();
    }
    if (!lines.back().empty()) lines.back() += text.substr(pos, gap);
    for (; word.size() > width; word = word.substr(width)) {
      lines.back() += word.substr(0, width);
      lines.emplace_back();
    }
    lines.back() += word;
    pos = end;
  }
  return lines;
}

// prefix + text within kScreenWidth, its later lines indented to where the text began.
inline std::vector<std::string> hanging_lines(const std::string& prefix, const std::string& text) {
  std::vector<std::string> lines = text_wrap(text, kScreenWidth - prefix.size());
  for (size_t i = 0; i < lines.size(); i++) {
    lines[i] = (i == 0 ? prefix : std::string(prefix.size(), ' ')) + lines[i];
  }
  return lines;
}

// A flag's lines in --help: its help, and its default after it, kept whole on a line.
inline std::vector<std::string> flag_usage_lines(const Flag& f) {
  const std::string prefix = strformat("  %-5s ", f.name);
  std::vector<std::string> lines = hanging_lines(prefix, f.help);
  const std::string fallback = strformat("(default %s)", f.show().c_str());
  if (lines.back().size() + 1 + fallback.size() <= kScreenWidth) {
    lines.back() += " " + fallback;
    return lines;
  }
  for (const std::string& line : hanging_lines(std::string(prefix.size(), ' '), fallback)) {
    lines.push_back(line);
  }
  return lines;
}

// The --help text. `about` says what the program is; `quick_start`, a first command to try.
inline std::vector<std::string> usage_lines(const char* program, const char* about,
                                            const char* quick_start,
                                            const std::vector<Flag>& flags) {
  std::vector<std::string> out =
      hanging_lines(strformat("usage: %s ", program), strformat("[flags]   (%s)", about));
  const auto add = [&out](const std::vector<std::string>& lines) {
    out.insert(out.end(), lines.begin(), lines.end());
  };
  add(hanging_lines("a quick first run: ", quick_start));
  bool own_h = false;
  for (const Flag& f : flags) {
    add(flag_usage_lines(f));
    own_h = own_h || std::string(f.name) == "-h";
  }
  add(hanging_lines("  --help ", own_h ? "prints this (-h is a flag of its own above: it takes a value)"
                                       : "prints this, and so does -h"));
  return out;
}

inline void print_usage(const char* program, const char* about, const char* quick_start,
                        const std::vector<Flag>& flags) {
  for (const std::string& line : usage_lines(program, about, quick_start, flags)) {
    printf("%s\n", line.c_str());
  }
}

// -t 0 becomes the model's maximum sequence length; a longer -t fails.
inline void resolve_sequence_length(TrainFlags& f, int max_seq_len) {
  if (f.T == 0) f.T = max_seq_len;
  if (f.T > max_seq_len) {
    LLMC_FAIL("-t %d is above the model's maximum sequence length %d: use -t %d or less", f.T,
              max_seq_len, max_seq_len);
  }
}

// -g 0 becomes 64 tokens, or fewer where the model's maximum sequence length leaves less room (a
// sample starts from one token); a longer -g fails.
inline void resolve_sample_length(TrainFlags& f, int max_seq_len) {
  const int limit = max_seq_len - 1;
  if (f.gen_len == 0) f.gen_len = std::min(64, limit);
  if (f.gen_len > limit) {
    LLMC_FAIL("-g %d is above the model's maximum sequence length - 1 = %d (a sample starts from "
              "one token): use -g %d or less", f.gen_len, limit, limit);
  }
}

// The vocabulary file tinyshakespeare.sh writes beside its shards.
constexpr const char* kDefaultTokenizer = "dev/data/tinyshakespeare/gpt2_tokenizer.bin";

// -tk none becomes kDefaultTokenizer where that exists (else samples are printed as token ids); a
// -tk that names no vocabulary file fails, by the file's header, before anything is set up.
inline void resolve_tokenizer(TrainFlags& f) {
  if (f.tokenizer.empty()) {
    if (file_exists(kDefaultTokenizer)) f.tokenizer = kDefaultTokenizer;
    return;
  }
  const char* path = f.tokenizer.c_str();
  const char* fix = "make one with dev/data/tinyshakespeare.sh (DIR/gpt2_tokenizer.bin), or leave "
                    "-tk out to print samples as token ids";
  switch (path_kind(f.tokenizer)) {
    case PathKind::kMissing: LLMC_FAIL("-tk %s: no such vocabulary file; %s", path, fix);
    case PathKind::kDirectory: LLMC_FAIL("-tk %s is a folder, not a vocabulary file; %s", path, fix);
    case PathKind::kOther: LLMC_FAIL("-tk %s is not a regular file; %s", path, fix);
    case PathKind::kFile: break;
  }
  File file(f.tokenizer, "rb");
  tokenizer_read_header(file, strformat("-tk %s", path));
}

// The tokens of one optimizer step and the micro steps of B*T tokens per process that make it.
struct StepBatch {
  long tokens;
  int micro_steps;
};

// From -z (or B*T*processes without it), once -t is resolved; fails unless -z is a multiple of
// B*T*processes that one step can take.
inline StepBatch step_batch(const TrainFlags& f, int processes) {
  const int micro_steps = micro_steps_of(f.total_batch, f.B, f.T, processes, "-z");
  return {(long)micro_steps * f.B * f.T * processes, micro_steps};
}

// The CUDA trainer's -pd (documents) and -aw (window, llmc/stages.h's WindowSetting: N blocks,
// kWindowSchedule or 0, or S/L), which the CPU trainer refuses.
inline WindowSetting parse_window_flag(const char* flag, const char* text) {
  return parse_window_setting(text, strformat("%s %s", flag, text));
}

// The checks between -pd, -aw, -t (resolved) and -x, as train_gpt2.py's check_document_args: a
// window cuts document-causal attention; the attention kernels take whole blocks of 128 tokens;
// and document-aligned sequences have no epoch to count the steps by.
inline void check_document_flags(int documents, int window, int T, int max_steps) {
  if (window != 0 && !documents) {
    LLMC_FAIL("-aw %d windows document-causal attention; add -pd 1", window);
  }
  if (!documents) return;
  if (T % 128 != 0) {
    LLMC_FAIL("-pd 1 attends within whole blocks of 128 tokens: -t %d is not a multiple of 128; use -t %d",
              T, T < 128 ? 128 : T / 128 * 128);
  }
  if (max_steps < 0) {
    LLMC_FAIL("-pd 1 reads document-aligned sequences, which have no epoch to count the steps by: give "
              "the steps with -x");
  }
  if (window == kWindowSchedule && max_steps == 0) {
    LLMC_FAIL("-aw %d grows the window over the run's steps, and -x 0 has none: give -x 1 or more, or a "
              "fixed window (-aw N)", window);
  }
}

// -aw N (or S/N) against the longest sequence the run attends over (length_flag's `length` tokens, a
// multiple of 128): a long window wider than what spans it changes nothing, so it is taken for a
// slip (tokens given for blocks). The schedule (-1) grows to its own end whatever the length.
inline void check_window_length(const WindowSetting& window, const char* length_flag, int length,
                                const LayerPlan& plan) {
  const int blocks = length / 128, spanning = plan.window_blocks_spanning(blocks, window.short_given());
  if (window.long_blocks <= spanning) return;
  const bool halves = plan.has_short_windows() && !window.short_given();
  LLMC_FAIL("-aw %s counts blocks of 128 tokens, and %s %d is %d block%s: -aw %d already attends to all of it%s; "
            "use -aw %d or less%s", window.text().c_str(), length_flag, length, blocks, blocks == 1 ? "" : "s",
            spanning, halves ? " (the short layers take half the window)" : "", spanning,
            window.short_given() ? " (the long one)" : " (0: no window)");
}

// The start-up table: rows of a setting and its value in a box as wide as its longest key and
// value, or kScreenWidth where a value is longer: such a value goes on over rows of its own below
// its key; rule() separates groups of rows.
class StartupTable {
 public:
  void row(const std::string& key, const std::string& value) {
    rows_.push_back({false, key, value});
  }
  void rule() { rows_.push_back({true, "", ""}); }

  // One row per flag, "-b    micro batch B", with its value.
  void flag_rows(const std::vector<Flag>& flags) {
    for (const Flag& f : flags) row(strformat("%-5s %s", f.name, f.label), f.show());
  }

  std::vector<std::string> lines() const {
    size_t key_width = 0, value_width = 0;
    for (const Row& r : rows_) {
      key_width = std::max(key_width, r.key.size());
      value_width = std::max(value_width, r.value.size());
    }
    // "| key | value |" takes 7 columns besides the two; a key too long for the screen still
    // leaves its value a column of kMinValueWidth.
    constexpr size_t kMinValueWidth = 20;
    const size_t room = kScreenWidth - std::min(kScreenWidth, key_width + 7);
    value_width = std::min(value_width, std::max(kMinValueWidth, room));
    const std::string rule_line =
        "+" + std::string(key_width + 2, '-') + "+" + std::string(value_width + 2, '-') + "+";
    std::vector<std::string> out = {rule_line};
    for (const Row& r : rows_) {
      if (r.is_rule) {
        out.push_back(rule_line);
        continue;
      }
      const std::vector<std::string> parts = text_wrap(r.value, value_width);
      for (size_t i = 0; i < parts.size(); i++) {
        out.push_back(strformat("| %-*s | %-*s |", (int)key_width, i == 0 ? r.key.c_str() : "",
                                (int)value_width, parts[i].c_str()));
      }
    }
    out.push_back(rule_line);
    return out;
  }

  void print() const {
    for (const std::string& line : lines()) printf("%s\n", line.c_str());
  }

 private:
  struct Row {
    bool is_rule;
    std::string key, value;
  };
  std::vector<Row> rows_;
};

}  // namespace llmc
