// Tests llmc/record_flags.h, the CUDA trainer's flags that write the run's record, through a
// command line parsed as train_gpt2.cu parses it (-recipe read first, its record the defaults):
// -recipe record89 is the command of dev/notes/record89-reference.md ("Our flags for record #89")
// field by field, bit for bit, but what no flag says: its AdamW rows by tensor, which are the
// reference's (train_gpt.py's param_table: rate, betas, decay), and Muon's rates of the MLP's
// matrices, whose effective rates are the reference's; the rows as -ar's text read back exactly;
// the resolved optimizer table tensor by tensor; -recipe speedrun still record #28's; record #89's
// switches among the flags a recipe sets.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dev/test/testing.h"
#include "llmc/record_flags.h"

using llmc::Recipe;
using llmc::RoleOptimizer;
using testing::check;
using testing::check_verbose;

namespace {

// The settings as train_gpt2.cu's TrainArgs holds them: the shared flags', the record's, -recipe.
struct Args : llmc::TrainFlags {
  const Recipe* recipe = &llmc::recipe_gpt2();
};

std::vector<llmc::Flag> flags_of(Args& a) {
  std::vector<llmc::Flag> own = {{"-recipe", "recipe", "the recipe",
                                  [&a](const char* text) { a.recipe = &llmc::recipe_by_name(text, "-recipe"); },
                                  [&a] { return std::string(a.recipe->name); }}};
  const std::vector<llmc::Flag> record = llmc::record_flags(a);
  own.insert(own.end(), record.begin(), record.end());
  return llmc::train_flags(a, own);
}

Args parse(const std::vector<std::string>& words) {
  Args a;
  static_cast<Recipe&>(a) = llmc::recipe_of_args(words);
  llmc::parse_flags(words, flags_of(a), "./train_gpt2cu");
  return a;
}

// Exact texts of each kind of setting: floats and doubles in hexadecimal.
std::string text_of(int v) { return std::to_string(v); }
std::string text_of(long v) { return std::to_string(v); }
std::string text_of(bool v) { return v ? "true" : "false"; }
std::string text_of(float v) { return llmc::strformat("%a", (double)v); }
std::string text_of(double v) { return llmc::strformat("%a", v); }
std::string text_of(const std::string& v) { return "\"" + v + "\""; }
std::string text_of(const char* v) { return text_of(std::string(v)); }
std::string text_of(llmc::Arch v) { return std::to_string((int)v); }
std::string text_of(llmc::OptimizerKind v) { return llmc::optimizer_name(v); }
std::string text_of(llmc::SpeedrunInit v) { return std::to_string((int)v); }
std::string text_of(const std::optional<float>& v) { return v ? text_of(*v) : "-"; }
std::string text_of(const llmc::PredictionWeights& w) {
  std::string text = text_of(w.count);
  for (float x : w.weight) text += " " + text_of(x);
  return text;
}
std::string text_of(const llmc::LogitCapSetting& s) {
  return text_of(s.cap) + " " + text_of(s.shift) + " " + text_of(s.bf16_sigmoid);
}
std::string text_of(const llmc::Fp8HeadScales& s) {
  return text_of(s.input) + " " + text_of(s.weight) + " " + text_of(s.grad);
}
std::string text_of(const llmc::MomentumSchedule& m) {
  return text_of(m.start) + " " + text_of(m.end) + " " + text_of(m.warmup_steps) + " " + text_of(m.cooldown_steps) +
         " " + text_of(m.run_steps);
}
std::string text_of(const llmc::NewtonSchulz& ns) {
  std::string text = text_of(ns.name) + " " + text_of(ns.steps) + " " + text_of(ns.norm_scale) + " " +
                     text_of(ns.norm_eps);
  for (const llmc::NewtonSchulzStep& p : ns.polynomial) {
    text += " (" + text_of(p.a) + " " + text_of(p.b) + " " + text_of(p.c) + ")";
  }
  return text;
}
std::string text_of(const llmc::TensorMultipliers& x) {
  std::string text;
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    if (x[i] != 1.0f) text += std::string(" ") + llmc::param_tensor_name(i) + "=" + text_of(x[i]);
  }
  return text;
}
std::string text_of(const llmc::AdamTensorRows& rows) {
  std::string text;
  for (int i = 0; i < llmc::kNumParamTensors; i++) {
    const llmc::AdamTensorRow& r = rows[i];
    if (r == llmc::AdamTensorRow()) continue;
    text += llmc::strformat(" %s(lr %s rate %s b1 %s b2 %s wd %s decay %s bf16 %s)", llmc::param_tensor_name(i),
                            text_of(r.lr).c_str(), text_of(r.rate).c_str(), text_of(r.beta1).c_str(),
                            text_of(r.beta2).c_str(), text_of(r.weight_decay).c_str(), text_of(r.decay).c_str(),
                            r.bf16 ? llmc::adam_bf16_name(*r.bf16) : "-");
  }
  return text;
}

using Fields = std::vector<std::pair<std::string, std::string>>;

// Every field of the record, by name (llmc/recipe.h's struct Recipe, in its order).
Fields fields_of(const Recipe& r) {
  Fields f;
#define FIELD(x) f.emplace_back(#x, text_of(r.x))
  FIELD(name), FIELD(arch), FIELD(optimizer), FIELD(lr), FIELD(weight_decay), FIELD(grad_clip), FIELD(schedule);
  FIELD(decay_fraction), FIELD(cooldown_fraction), FIELD(final_lr_frac), FIELD(total_batch), FIELD(B), FIELD(T);
  FIELD(max_steps), FIELD(val_every), FIELD(val_batches), FIELD(val_T), FIELD(shuffle), FIELD(documents);
  FIELD(window_blocks), FIELD(short_window_blocks), FIELD(final_window_blocks), FIELD(window_tokens), FIELD(stages);
  FIELD(muon_lr), FIELD(muon_weight_decay), FIELD(cautious_decay), FIELD(normuon), FIELD(muon_high_bits);
  FIELD(adam_every), FIELD(untie_step), FIELD(muon_qk_heads), FIELD(muon_tensor_lr);
  FIELD(adam_rows), FIELD(zero_stage);
  FIELD(divided_optimizers), FIELD(fp8_head), FIELD(fp8_mlp), FIELD(fp8_head_scales), FIELD(beta1), FIELD(beta2), FIELD(eps);
  FIELD(decay_vectors), FIELD(eps_before_correction), FIELD(bf16_embeddings), FIELD(role_lr[0]), FIELD(role_lr[1]);
  FIELD(role_lr[2]), FIELD(role_lr[3]), FIELD(lr_help), FIELD(muon_momentum), FIELD(muon_newton_schulz);
  FIELD(muon_scale_tall), FIELD(loss_sum), FIELD(next_token_weights), FIELD(logit_cap), FIELD(prefix_weight);
  FIELD(attention_scale), FIELD(key_offset), FIELD(yarn), FIELD(mlp_from_output), FIELD(val_batches_shared);
  FIELD(smear), FIELD(bigram);
  FIELD(rotary_pairs), FIELD(record_init), FIELD(ve_gates), FIELD(resid_lambdas), FIELD(xsa), FIELD(record89_plan);
  FIELD(paired_heads), FIELD(attn_lambdas), FIELD(mudd_gates), FIELD(composed_attention), FIELD(mudd_connections);
#undef FIELD
  return f;
}

// The fields in which x and y differ, "name: x's / y's" each, "" where none does.
std::string differing_fields(const Recipe& x, const Recipe& y, const std::vector<std::string>& skipped = {}) {
  const Fields fx = fields_of(x), fy = fields_of(y);
  std::string text;
  for (size_t i = 0; i < fx.size(); i++) {
    if (fx[i].second == fy[i].second) continue;
    if (std::count(skipped.begin(), skipped.end(), fx[i].first)) continue;
    text += "\n     " + fx[i].first + ": " + fx[i].second + " / " + fy[i].second;
  }
  return text;
}

// The record #89 command of the notes, but -i, -j and -tk (the data's, the user's), and without
// -recipe: the command line gives the recipe.
const std::vector<std::string> kRecord89Flags = {
    "-e", "d12", "-lp", "1", "-ph", "1", "-rp", "1", "-awt", "1", "-ko", "1", "-yn", "1", "-mr", "1", "-fm", "1",
    "-asc", "0.1", "-sm", "1",
    "-bg", "1", "-vg", "1", "-rl", "1", "-xs", "1", "-al", "1", "-mg", "1", "-ca", "1", "-md", "1", "-ri", "89", "-x", "1270",
    "-sp",
    "1/3 t=16384 z=131072 cap=896 aw=1/3 lr=1 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/3 t=32768 z=262144 cap=2048 "
    "aw=3/7 lr=1.52 mtp=1,0.5>1,0 pw=0.25>0; 1/3 t=49152 z=393216 aw=5/11 lr=1.73 mtp=1 pw=0; +15 aw=6/13",
    "-awf", "20", "-k", "cooldown", "-kc", "0.6", "-q", "0.15", "-mc", "50", "-ns", "polar", "-mn", "1", "-mk", "1",
    "-mq", "2", "-cd", "1", "-ml", "0.023", "-mw", "1.2", "-c", "0.005", "-ao", "2", "-ut", "847", "-lc", "23,5,bf16", "-fhs",
    "100,1.6,0.75", "-pw", "0.25", "-v", "250", "-vt", "262144", "-m", "40"};
const std::vector<std::string> kData = {"-i", "TRAIN_*.bin", "-j", "VAL_*.bin", "-tk", "VOCAB.bin"};

std::vector<std::string> words(const std::vector<std::string>& a, const std::vector<std::string>& b,
                               const std::vector<std::string>& c = {}) {
  std::vector<std::string> all = a;
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  return all;
}

// One tensor of the reference's table (train_gpt.py 2026-2068: Adam's rate 0.008 and decay 0.005
// times lr_mul and wd_mul, its betas) as the tensor of ours it maps to, and whether the reference
// keeps it in BF16 (2242-2254: its Embedding and Linear modules' weights, value_embeds, ve_gate_bank
// and the MUDD tensors but _mudd_gate_scale), whose Adam state is FP32 nonetheless (554).
struct ReferenceRow {
  int tensor;
  double lr_mul, wd_mul, beta1, beta2;
  bool bf16;
};

const ReferenceRow kReferenceRows[] = {
    {llmc::kWte, 1.0, 150.0, 0.5, 0.95, true},  // embed
    {llmc::kHeadw, 1.0, 150.0, 0.5, 0.95, true},  // lm_head
    {llmc::kVe, 75.0, 5.0, 0.75, 0.95, true},  // value_embeds
    {llmc::kBigram, 75.0, 5.0, 0.75, 0.95, true},  // bigram_embed
    {llmc::kAttnLambdas, 5.0, 0.0, 0.9, 0.99, false},  // scalars: the attention lambdas
    {llmc::kSmearLambda, 5.0, 0.0, 0.9, 0.99, false},  // scalars: smear_lambda
    {llmc::kSkipGate, 5.0, 0.0, 0.9, 0.99, false},  // scalars: skip_lambda
    {llmc::kSmearw, 0.01, 0.0, 0.9, 0.99, true},  // smear_gate
    {llmc::kVegate, 1.0, 1.0, 0.9, 0.99, true},  // ve_gate_bank
    {llmc::kResidLambdas, 5.0, 0.0, 0.9, 0.95, false},
    {llmc::kPostLambdas, 1.0, 0.0, 0.9, 0.95, false},
    {llmc::kMuddGateW1, 0.1, 1.0, 0.9, 0.99, true},
    {llmc::kMuddGateW2, 0.1, 1.0, 0.9, 0.99, true},
    {llmc::kMuddGateB2, 0.1, 0.0, 0.9, 0.99, true},
    {llmc::kMuddGateScale, 0.1, 0.0, 0.9, 0.99, false},  // _mudd_gate_scale
    {llmc::kMuddW1, 0.25, 1.0, 0.9, 0.99, true},
    {llmc::kMuddW2, 0.25, 1.0, 0.9, 0.99, true},
    {llmc::kMuddB2, 0.25, 0.0, 0.9, 0.99, true},
};

std::string row_text(const RoleOptimizer& r) {
  return llmc::strformat("%s lr %a betas %a %a eps %a decay %a %s %s", llmc::optimizer_name(r.method), r.lr, r.beta1,
                         r.beta2, r.eps, r.weight_decay, llmc::weight_decay_name(r.decay),
                         llmc::adam_bf16_name(r.bf16));
}

// -recipe record89 against the notes' command: every field but the name, what -l means and what no
// flag of the command says (AdamW's rows, Muon's per-tensor rates).
void test_record89_is_the_command() {
  const Args recipe = parse(words({"-recipe", "record89"}, kData));
  const Args command = parse(words({"-recipe", "speedrun"}, kRecord89Flags, kData));
  const std::string differing =
      differing_fields(recipe, command, {"name", "lr_help", "adam_rows", "muon_tensor_lr"});
  check_verbose(differing.empty(), llmc::strformat("-recipe record89: each of the record's %zu fields the command's "
                                                   "(but the name, -l's meaning, the AdamW rows and Muon's rates)%s",
                                                   fields_of(recipe).size(), differing.c_str()));
  check_verbose(recipe.train_pattern == command.train_pattern && recipe.model == command.model &&
                    recipe.tokenizer == "VOCAB.bin" && recipe.seed == command.seed,
                "-recipe record89 -i -j -tk: the data and the model (d12) the command's");
  check_verbose(command.adam_rows == llmc::AdamTensorRows() && command.muon_tensor_lr == llmc::tensor_multipliers_one(),
                "the command sets no AdamW row and no Muon rate of a tensor");
}

// The rows record #89's recipe sets are the reference's: each mapped tensor's rate, decay and betas
// the reference's products rounded once to float, the rest the role's; -ar's text of them reads back
// the same rows, so the command with that -ar is the recipe but for Muon's rates.
void test_record89_adam_rows() {
  const Recipe& r = llmc::recipe_record89();
  llmc::AdamTensorRows expected;
  for (const ReferenceRow& ref : kReferenceRows) {
    llmc::AdamTensorRow& row = expected[ref.tensor];
    row.rate = (float)(0.008 * ref.lr_mul);
    row.decay = (float)(0.005 * ref.wd_mul);
    row.beta1 = (float)ref.beta1;
    row.beta2 = (float)ref.beta2;
    if (ref.bf16) row.bf16 = llmc::AdamBf16::kWeight;
  }
  check_verbose(r.adam_rows == expected, "record89's AdamW rows: the reference's, tensor by tensor:" +
                                             text_of(r.adam_rows));
  const std::string text = llmc::adam_rows_text(r.adam_rows);
  check_verbose(llmc::parse_adam_rows("-ar", text) == r.adam_rows, "-ar " + text + ": reads back as the rows");
  const Args command = parse(words({"-recipe", "speedrun"}, kRecord89Flags, words(kData, {"-ar", text})));
  const std::string differing = differing_fields(llmc::recipe_record89(), command, {"name", "lr_help", "muon_tensor_lr"});
  check_verbose(differing.empty(), "the command with -ar of those rows: the recipe's rows, and every field but Muon's "
                                   "rates" + differing);
  // With -mt of its Muon rates too, the command is the recipe but its name and what -l means.
  const std::string rates = llmc::muon_tensor_lr_text(r.muon_tensor_lr);
  const Args whole = parse(words({"-recipe", "speedrun"}, kRecord89Flags, words(kData, {"-ar", text, "-mt", rates})));
  const std::string rest = differing_fields(llmc::recipe_record89(), whole, {"name", "lr_help"});
  check_verbose(rest.empty(), "the command with -ar of those rows and -mt " + rates + ": every field the recipe's" + rest);
}

// The resolved optimizer table, tensor by tensor (both builds): each mapped tensor's row the
// reference's rate, betas and decay exactly, AdamW's, eps and the cautious decay as the command's;
// every other tensor's row the command's.
void test_record89_table() {
  const Args recipe = parse(words({"-recipe", "record89"}, kData));
  const Args command = parse(words({"-recipe", "speedrun"}, kRecord89Flags, kData));
  for (bool bf16_build : {true, false}) {
    const llmc::OptimizerTable got = llmc::optimizer_table(recipe, bf16_build);
    const llmc::OptimizerTable base = llmc::optimizer_table(command, bf16_build);
    std::string wrong;
    for (int i = 0; i < llmc::kNumParamTensors; i++) {
      RoleOptimizer want = base.of_tensor(i);
      for (const ReferenceRow& ref : kReferenceRows) {
        if (ref.tensor != i) continue;
        want.lr = (float)(0.008 * ref.lr_mul);
        want.weight_decay = (float)(0.005 * ref.wd_mul);
        want.beta1 = (float)ref.beta1;
        want.beta2 = (float)ref.beta2;
        if (ref.bf16) want.bf16 = bf16_build ? llmc::AdamBf16::kWeight : llmc::AdamBf16::kNone;
        check(want.method == llmc::OptimizerKind::kAdamW, llmc::param_tensor_name(i) + std::string(" is AdamW's"));
      }
      const std::string g = row_text(got.of_tensor(i)), w = row_text(want);
      if (g != w) wrong += llmc::strformat("\n     %s: %s, not %s", llmc::param_tensor_name(i), g.c_str(), w.c_str());
    }
    check_verbose(wrong.empty(), llmc::strformat("record89's table (%s build): each of the %d tensors' rows the "
                                                 "reference's or the command's%s", bf16_build ? "BF16" : "FP32",
                                                 llmc::kNumParamTensors, wrong.c_str()));
    check_verbose(got.of_tensor(llmc::kWte).lr == 0.008f && got.of_tensor(llmc::kVe).lr == 0.6f &&
                      got.of_tensor(llmc::kSmearw).lr == (float)(0.008 * 0.01) &&
                      got.of_tensor(llmc::kResidLambdas).weight_decay == 0.0f &&
                      got.of_tensor(llmc::kHeadw).weight_decay == 0.75f &&
                      got.of_tensor(llmc::kVe).weight_decay == 0.025f,
                  "wte 0.008, ve 0.6, smearw 8e-05; decays resid_lambdas 0, headw 0.75, ve 0.025");
  }
}

// Muon's rates: the reference's lr_eff of each matrix is 0.023 times its stored shape's scale
// sqrt(max(1, rows / cols)) times its per-matrix multiplier; its Q and K blocks [256, 768], V and O
// [768, 768] take 1, the MLP's up [3072, 768] 2 and down [3072, 768] 2 x 2. Ours: the tall scale
// where muon_scale_tall, times Recipe::muon_tensor_lr.
void test_record89_muon_rates() {
  const Recipe& r = llmc::recipe_record89();
  const struct {
    int tensor;
    double reference;
  } matrices[] = {{llmc::kQkvw, 1.0}, {llmc::kAttprojw, 1.0}, {llmc::kFcw, 2.0}, {llmc::kFcprojw, 4.0}};
  std::string rates;
  bool same = true;
  for (const auto& m : matrices) {
    const llmc::ParamSpec spec = llmc::param_tensor_spec(m.tensor);
    const double tall = r.muon_scale_tall && spec.rows > spec.cols ? std::sqrt((double)spec.rows / spec.cols) : 1.0;
    const double ours = tall * r.muon_tensor_lr[m.tensor];
    same = same && ours == m.reference;
    rates += llmc::strformat(" %s %g (reference %g)", spec.name, ours, m.reference);
  }
  check_verbose(same, "record89's Muon rates over -ml, tensor by tensor:" + rates);
  const llmc::OptimizerTable t = llmc::optimizer_table(r, true);
  check_verbose(t.muon_tensor_lr == r.muon_tensor_lr && !t.muon_scale_tall &&
                    t.of(llmc::ParamRole::kMatrix).lr == 0.023f,
                "the table takes them, Muon's rate 0.023, tall matrices unscaled as record #28's");
}

// -recipe speedrun stays record #28's: it differs from GPT-2's record in these fields alone, with
// these values; none of record #89's.
void test_speedrun_unchanged() {
  const Args parsed = parse({"-recipe", "speedrun"});
  check_verbose(differing_fields(parsed, llmc::recipe_speedrun()).empty(), "-recipe speedrun: its record");
  const Fields speedrun = fields_of(llmc::recipe_speedrun()), gpt2 = fields_of(llmc::recipe_gpt2());
  std::string differing;
  for (size_t i = 0; i < speedrun.size(); i++) {
    if (speedrun[i].second != gpt2[i].second && speedrun[i].first != "lr_help") {
      differing += " " + speedrun[i].first + "=" + speedrun[i].second;
    }
  }
  const std::string expected =
      " name=\"speedrun\" arch=2 optimizer=muon lr=0x1p+0 weight_decay=0x0p+0 grad_clip=0x0p+0 schedule=\"wsd\" "
      "decay_fraction=0x1.ccccccp-2 final_lr_frac=0x1.99999ap-4 total_batch=393216 B=1 T=49152 max_steps=1695 "
      "val_every=125 val_batches=40 val_T=262144 shuffle=0 documents=1 window_blocks=-1 muon_lr=0x1.99999ap-5 "
      "muon_weight_decay=0x0p+0 zero_stage=0 divided_optimizers=1 fp8_head=1 beta1=0x1.99999ap-1 eps=0x1.b7cdfep-34 "
      "eps_before_correction=true bf16_embeddings=true role_lr[0]=0x1.333334p-1 role_lr[1]=0x1.0624dep-7 "
      "role_lr[2]=0x1.47ae14p-5 role_lr[3]=0x1.0624dep-7 muon_momentum=0x1.b333333333333p-1 0x1.e666666666666p-1 300 "
      "0 0 muon_newton_schulz=\"speedrun\" 5 0x1p+0 0x1.ad7f2ap-24 (0x1.b8e56p+1 -0x1.31999ap+2 0x1.040832p+1) "
      "(0x1.b8e56p+1 -0x1.31999ap+2 0x1.040832p+1) (0x1.b8e56p+1 -0x1.31999ap+2 0x1.040832p+1) (0x1.b8e56p+1 "
      "-0x1.31999ap+2 0x1.040832p+1) (0x1.b8e56p+1 -0x1.31999ap+2 0x1.040832p+1) (0x0p+0 0x0p+0 0x0p+0) (0x0p+0 "
      "0x0p+0 0x0p+0) (0x0p+0 0x0p+0 0x0p+0) (0x0p+0 0x0p+0 0x0p+0) (0x0p+0 0x0p+0 0x0p+0) (0x0p+0 0x0p+0 0x0p+0) "
      "(0x0p+0 0x0p+0 0x0p+0) muon_scale_tall=false loss_sum=true val_batches_shared=true";
  check_verbose(differing == expected, "record #28's fields where they are not GPT-2's:" + differing);
}

// Record #89's switches are the record's, so -recipe's help names them among the flags it sets.
void test_switches_in_record() {
  Args a;
  const std::vector<llmc::Flag> flags = flags_of(a);
  std::string names;
  for (const llmc::Flag* f : llmc::recipe_flags(a, flags)) names += std::string(" ") + f->name + " ";
  std::string missing;
  for (const char* flag : {"-awf", "-awt", "-ko", "-yn", "-mr", "-fm", "-ut", "-sm", "-bg", "-rp", "-ri", "-vg", "-rl", "-xs",
                           "-lp", "-ph", "-al", "-mg", "-ca"}) {
    if (names.find(std::string(" ") + flag + " ") == std::string::npos) missing += std::string(" ") + flag;
  }
  check_verbose(missing.empty(), "record #89's switches among the flags a recipe sets" +
                                     (missing.empty() ? std::string() : ", but" + missing));
}

}  // namespace

int main() {
  try {
    test_record89_is_the_command();
    test_record89_adam_rows();
    test_record89_table();
    test_record89_muon_rates();
    test_speedrun_unchanged();
    test_switches_in_record();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_record_flags");
}
