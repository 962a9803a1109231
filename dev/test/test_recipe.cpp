// Tests llmc/recipe.h's optimizer table: each recipe's row for every parameter role (method, rate,
// betas, eps, weight decay, state precision) as its record gives it, with -opt and the decay flags
// written into the record; -cd's decay kind in every row and its description; the per-role weight
// decay against the parameter table's decayed tensors in every architecture; AdamW's betas and eps
// in each of its rows; each tensor's own AdamW row (-ar) over its role's; the start-up table's
// description of each recipe's optimizers; and Muon's orthogonalisations: the rows of
// kNewtonSchulzMethods (the baseline's, the speedrun's, Polar Express) as -ns names them, each
// recipe's, and the one a debug state's header names (its row, or in older files its one
// polynomial).
#include <cmath>
#include <string>

#include "dev/test/testing.h"
#include "llmc/recipe.h"

using llmc::OptimizerKind;
using llmc::OptimizerTable;
using llmc::ParamRole;
using llmc::Recipe;
using llmc::RoleOptimizer;
using testing::check_throws;
using testing::check_verbose;

namespace {

std::string row_text(const RoleOptimizer& r) {
  return llmc::strformat("%s lr %g betas %g %g eps %g decay %g %s", llmc::optimizer_name(r.method), r.lr, r.beta1,
                         r.beta2, r.eps, r.weight_decay,
                         r.bf16 == llmc::AdamBf16::kNone ? "fp32" : llmc::adam_bf16_name(r.bf16));
}

// The rows of a record's table, "role: row" each, as the BF16 build resolves them.
std::string table_text(const Recipe& r, bool bf16_build = true) {
  const OptimizerTable t = llmc::optimizer_table(r, bf16_build);
  const char* roles[llmc::kParamRoles] = {"embedding", "matrix", "vector", "head"};
  std::string text;
  for (int i = 0; i < llmc::kParamRoles; i++) {
    text += llmc::strformat("%s: %s; ", roles[i], row_text(t.roles[i]).c_str());
  }
  return text;
}

void test_recipe_rows() {
  const std::string gpt2 = table_text(llmc::recipe_gpt2());
  check_verbose(gpt2 == "embedding: adamw lr 1 betas 0.9 0.95 eps 1e-08 decay 0.1 fp32; "
                        "matrix: adamw lr 1 betas 0.9 0.95 eps 1e-08 decay 0.1 fp32; "
                        "vector: adamw lr 1 betas 0.9 0.95 eps 1e-08 decay 0 fp32; "
                        "head: adamw lr 1 betas 0.9 0.95 eps 1e-08 decay 0.1 fp32; ",
                "gpt2: AdamW everywhere, decay on all but the vectors: " + gpt2);
  const std::string modern = table_text(llmc::recipe_modern());
  check_verbose(modern == "embedding: adamw lr 0.7 betas 0.8 0.95 eps 1e-10 decay 0.001 fp32; "
                          "matrix: muon lr 0.025 betas 0.8 0.95 eps 1e-10 decay 0.05 fp32; "
                          "vector: adamw lr 0.015 betas 0.8 0.95 eps 1e-10 decay 0.001 fp32; "
                          "head: adamw lr 0.004 betas 0.8 0.95 eps 1e-10 decay 0.001 fp32; ",
                "modern: Muon's matrices, each AdamW role's rate, decay on every role: " + modern);
  const std::string speedrun = table_text(llmc::recipe_speedrun());
  check_verbose(speedrun == "embedding: adamw lr 0.6 betas 0.8 0.95 eps 1e-10 decay 0 all; "
                            "matrix: muon lr 0.05 betas 0.8 0.95 eps 1e-10 decay 0 fp32; "
                            "vector: adamw lr 0.04 betas 0.8 0.95 eps 1e-10 decay 0 fp32; "
                            "head: adamw lr 0.008 betas 0.8 0.95 eps 1e-10 decay 0 fp32; ",
                "speedrun: the embeddings' state in BF16, no decay: " + speedrun);
  const OptimizerTable fp32 = llmc::optimizer_table(llmc::recipe_speedrun(), false);
  check_verbose(fp32.of(ParamRole::kEmbedding).bf16 == llmc::AdamBf16::kNone,
                "speedrun in the FP32 build: the embeddings' state in FP32");
}

// The flags write the record, and the table follows: -opt switches the matrices' row, -c the AdamW
// rows that decay, -ml and -mw Muon's row.
void test_flags_in_rows() {
  Recipe r = llmc::recipe_modern();
  r.optimizer = OptimizerKind::kAdamW;
  r.weight_decay = 0.3f;
  const OptimizerTable adamw = llmc::optimizer_table(r, true);
  check_verbose(!adamw.muon() && row_text(adamw.of(ParamRole::kMatrix)) ==
                                     "adamw lr 0.004 betas 0.8 0.95 eps 1e-10 decay 0.3 fp32",
                "modern -opt adamw -c 0.3: the matrices take AdamW at the head's rate, decay 0.3");
  Recipe g = llmc::recipe_gpt2();
  g.optimizer = OptimizerKind::kMuon;
  g.muon_lr = 0.1f;
  g.muon_weight_decay = 0.2f;
  g.weight_decay = 0.0f;
  const OptimizerTable muon = llmc::optimizer_table(g, true);
  check_verbose(muon.muon() &&
                    row_text(muon.of(ParamRole::kMatrix)) == "muon lr 0.1 betas 0.9 0.95 eps 1e-08 decay 0.2 fp32" &&
                    muon.of(ParamRole::kEmbedding).weight_decay == 0.0f,
                "gpt2 -opt muon -ml 0.1 -mw 0.2 -c 0: Muon's row 0.1 and 0.2, AdamW's embeddings undecayed");
}

// -cd writes the record's cautious_decay: every row's decay cautious, AdamW's and Muon's (each
// kernel has its own form of it), the rates and decays as without; the start-up table names it for
// both optimizers; no recipe sets it, so every recipe's rows stay decoupled.
void test_cautious_rows() {
  bool decoupled = true;
  for (const Recipe* r : {&llmc::recipe_gpt2(), &llmc::recipe_modern(), &llmc::recipe_speedrun()}) {
    for (const RoleOptimizer& row : llmc::optimizer_table(*r, true).roles) {
      decoupled = decoupled && row.decay == llmc::WeightDecayKind::kDecoupled;
    }
  }
  check_verbose(decoupled, "gpt2, modern and speedrun: every row's decay decoupled");
  Recipe r = llmc::recipe_modern();
  r.cautious_decay = 1;
  const OptimizerTable cautious = llmc::optimizer_table(r, true);
  bool rows = true;
  for (int i = 0; i < llmc::kParamRoles; i++) {
    const RoleOptimizer& row = cautious.roles[i];
    rows = rows && row.decay == llmc::WeightDecayKind::kCautious &&
           row_text(row) == row_text(llmc::optimizer_table(llmc::recipe_modern(), true).roles[i]);
  }
  check_verbose(rows && cautious.of(ParamRole::kMatrix).method == OptimizerKind::kMuon,
                "modern -cd 1: every row cautious, Muon's and AdamW's, with the rates and decays of -cd 0");
  const std::string described = llmc::optimizer_description(r, true);
  check_verbose(described.find("(lr 0.025, cautious weight decay 0.05, ") != std::string::npos &&
                    described.find("eps 1e-10, cautious weight decay on every tensor") != std::string::npos,
                "modern -cd 1 described: " + described);
}

// -ao writes the record's adam_every: the table steps AdamW at every K-th step, (step + 1) % K == 0
// (K 2: the odd steps), every step in every recipe; the start-up table names the interval.
void test_adam_every() {
  bool every_step = true;
  for (const Recipe* r : {&llmc::recipe_gpt2(), &llmc::recipe_modern(), &llmc::recipe_speedrun()}) {
    const OptimizerTable t = llmc::optimizer_table(*r, true);
    for (long step = 0; step < 5; step++) every_step = every_step && t.adamw_steps_at(step);
  }
  check_verbose(every_step, "gpt2, modern and speedrun: AdamW at every step");
  Recipe r = llmc::recipe_speedrun();
  r.adam_every = 2;
  const OptimizerTable t = llmc::optimizer_table(r, true);
  std::string steps;
  for (long step = 0; step < 6; step++) steps += t.adamw_steps_at(step) ? "A" : "-";
  const std::string described = llmc::optimizer_description(r, true);
  check_verbose(t.adam_every == 2 && steps == "-A-A-A" &&
                    described.find(", every 2 steps with their summed gradients") != std::string::npos,
                "speedrun -ao 2: AdamW at steps 1, 3, 5 of 0..5 (" + steps + "); described: " + described);
}

// -mn writes the record's normuon, and the recipe its per-tensor multipliers of Muon's rate: the
// table takes both, the rows as without; no recipe sets either; the start-up table names NorMuon
// and each multiplier that is not 1 by its tensor.
void test_normuon_rows() {
  bool plain = true;
  for (const Recipe* r : {&llmc::recipe_gpt2(), &llmc::recipe_modern(), &llmc::recipe_speedrun()}) {
    const OptimizerTable t = llmc::optimizer_table(*r, true);
    plain = plain && !t.normuon && t.muon_tensor_lr == llmc::tensor_multipliers_one();
  }
  check_verbose(plain, "gpt2, modern and speedrun: no NorMuon, every tensor's Muon rate x 1");
  Recipe r = llmc::recipe_modern();
  r.normuon = 1;
  r.muon_tensor_lr[llmc::kFcprojw] = 4.0f;
  const OptimizerTable t = llmc::optimizer_table(r, true);
  bool rows = true;
  for (int i = 0; i < llmc::kParamRoles; i++) {
    rows = rows && row_text(t.roles[i]) == row_text(llmc::optimizer_table(llmc::recipe_modern(), true).roles[i]);
  }
  llmc::TensorMultipliers expected = llmc::tensor_multipliers_one();
  expected[llmc::kFcprojw] = 4.0f;
  check_verbose(rows && t.normuon && t.muon_tensor_lr == expected,
                "modern -mn 1, fcprojw x 4: NorMuon and the multiplier in the table, the rows as without");
  const std::string described = llmc::optimizer_description(r, true);
  check_verbose(described.find("12 Newton-Schulz steps in BF16, NorMuon's second moment (beta2 0.9), fcprojw's rate "
                               "x 4); AdamW") != std::string::npos,
                "modern -mn 1, fcprojw x 4 described: " + described);
}

// -mk writes the record's muon_high_bits, which only record #89's sets: the table takes it in BF16
// builds alone (an FP32 build's parameter is its master), and so does the start-up table.
void test_muon_high_bits() {
  bool others = true;
  for (const Recipe* r : {&llmc::recipe_gpt2(), &llmc::recipe_modern(), &llmc::recipe_speedrun()}) {
    others = others && !r->muon_high_bits && !llmc::optimizer_table(*r, true).muon_high_bits;
  }
  check_verbose(others, "gpt2, modern and speedrun: Muon's BF16 weights stochastically rounded");
  const Recipe& r = llmc::recipe_record89();
  const std::string phrase = ", BF16 weights the master's high 16 bits";
  const std::string bf16 = llmc::optimizer_description(r, true), fp32 = llmc::optimizer_description(r, false);
  check_verbose(r.muon_high_bits == 1 && llmc::optimizer_table(r, true).muon_high_bits &&
                    !llmc::optimizer_table(r, false).muon_high_bits && bf16.find(phrase) != std::string::npos &&
                    fp32.find(phrase) == std::string::npos,
                "record89: the master's high 16 bits in the BF16 build's table and description, not the FP32 "
                "build's: " + bf16);
}

// -mq writes the record's muon_qk_heads (Muon's Q and K blocks, the model's for gpt2_muon_groups),
// which no recipe sets; the start-up table names them after NorMuon.
void test_qk_blocks_described() {
  bool whole = true;
  for (const Recipe* r : {&llmc::recipe_gpt2(), &llmc::recipe_modern(), &llmc::recipe_speedrun()}) {
    whole = whole && r->muon_qk_heads == 0 &&
            llmc::optimizer_description(*r, true).find("Q and K in blocks") == std::string::npos;
  }
  check_verbose(whole, "gpt2, modern and speedrun: Q, K and V whole, not described as blocks");
  Recipe r = llmc::recipe_speedrun();
  r.normuon = 1;
  r.muon_qk_heads = 2;
  const std::string described = llmc::optimizer_description(r, true);
  check_verbose(described.find("NorMuon's second moment (beta2 0.9), Q and K in blocks of 2 heads, tall matrices "
                               "unscaled") != std::string::npos,
                "speedrun -mn 1 -mq 2 described: " + described);
}

// Each tensor's row is its role's where no row of its own is given (every recipe: the same bits as
// the roles' rows); -ar's rows (record #89's value embeddings and head here) multiply the role's rate
// and decay and set the betas of their tensors alone, each described by its name; a row of a matrix
// is refused with Muon, which owns the matrices, and taken with -opt adamw.
void test_adam_rows() {
  bool by_role = true;
  for (const Recipe* r : {&llmc::recipe_gpt2(), &llmc::recipe_modern(), &llmc::recipe_speedrun()}) {
    const OptimizerTable t = llmc::optimizer_table(*r, true);
    for (int i = 0; i < llmc::kNumParamTensors; i++) {
      const RoleOptimizer& row = t.of_tensor(i);
      by_role = by_role && row_text(row) == row_text(t.of(llmc::param_tensor_spec(i).role)) &&
                row.decay == t.of(llmc::param_tensor_spec(i).role).decay;
    }
  }
  check_verbose(by_role, "gpt2, modern and speedrun: every tensor's row its role's");
  Recipe r = llmc::recipe_speedrun();
  r.weight_decay = 0.005f;
  r.adam_rows[llmc::kVe].lr = 75.0f;
  r.adam_rows[llmc::kVe].beta1 = 0.75f;
  r.adam_rows[llmc::kVe].weight_decay = 5.0f;
  r.adam_rows[llmc::kHeadw].beta1 = 0.5f;
  r.adam_rows[llmc::kHeadw].beta2 = 0.99f;
  r.adam_rows[llmc::kLambdas].lr = 5.0f;
  const OptimizerTable t = llmc::optimizer_table(r, true);
  const std::string ve = row_text(t.of_tensor(llmc::kVe)), head = row_text(t.of_tensor(llmc::kHeadw));
  const std::string wte = row_text(t.of_tensor(llmc::kWte)), lambdas = row_text(t.of_tensor(llmc::kLambdas));
  const std::string qkvw = row_text(t.of_tensor(llmc::kQkvw));
  check_verbose(ve == "adamw lr 45 betas 0.75 0.95 eps 1e-10 decay 0.025 all" &&
                    head == "adamw lr 0.008 betas 0.5 0.99 eps 1e-10 decay 0.005 fp32" &&
                    wte == row_text(t.of(ParamRole::kEmbedding)) && lambdas == "adamw lr 0.2 betas 0.8 0.95 eps 1e-10 "
                    "decay 0 fp32" && qkvw == row_text(t.of(ParamRole::kMatrix)),
                "speedrun -c 0.005 -ar 've:lr=75,b1=0.75,wd=5;headw:b1=0.5,b2=0.99;lambdas:lr=5': ve " + ve +
                    ", headw " + head + ", lambdas " + lambdas + " (no decay: a vector's), wte and qkvw their roles'");
  const std::string described = llmc::optimizer_description(r, true);
  check_verbose(described.find(", headw's lr x 1 betas 0.5 0.99 decay x 1, ve's lr x 75 betas 0.75 0.95 decay x 5, "
                               "lambdas's lr x 5 betas 0.8 0.95 decay x 1") != std::string::npos,
                "speedrun with those rows described: " + described);
  // A row's own rate and decay stand in place of its role's, even a role without decay (a vector's).
  Recipe own = r;
  own.adam_rows[llmc::kWte].rate = 0.008f;
  own.adam_rows[llmc::kWte].decay = 0.75f;
  own.adam_rows[llmc::kLambdas].decay = 0.005f;
  const OptimizerTable with_own = llmc::optimizer_table(own, true);
  const std::string own_wte = row_text(with_own.of_tensor(llmc::kWte));
  const std::string own_lambdas = row_text(with_own.of_tensor(llmc::kLambdas));
  const std::string own_described = llmc::optimizer_description(own, true);
  check_verbose(own_wte == "adamw lr 0.008 betas 0.8 0.95 eps 1e-10 decay 0.75 all" &&
                    own_lambdas == "adamw lr 0.2 betas 0.8 0.95 eps 1e-10 decay 0.005 fp32" &&
                    own_described.find(", wte's lr 0.008 betas 0.8 0.95 decay 0.75") != std::string::npos,
                "-ar 'wte:rate=0.008,decay=0.75;lambdas:lr=5,decay=0.005': wte " + own_wte + ", lambdas " +
                    own_lambdas + "; described: " + own_described);
  llmc::adam_rows_check(r, "-ar");
  r.adam_rows[llmc::kFcw].lr = 2.0f;
  check_throws([&] { llmc::adam_rows_check(r, "-ar"); }, "-ar fcw:lr=2;headw:b1=0.5,b2=0.99;ve:lr=75,b1=0.75,wd=5;"
               "lambdas:lr=5: fcw is Muon's (-opt muon takes the blocks' matrices), its rate and decay Muon's (-ml, "
               "-mw): drop its row, or give -opt adamw", "a row of Muon's fcw");
  r.optimizer = OptimizerKind::kAdamW;
  llmc::adam_rows_check(r, "-ar");
  check_verbose(llmc::optimizer_table(r, true).of_tensor(llmc::kFcw).lr == 2.0f * r.role_lr[(int)ParamRole::kMatrix],
                "speedrun -opt adamw: fcw's row taken, 2 x the matrices' rate");
}

// A role's weight decay falls on all of its tensors: in every architecture a role's tensors are all
// decayed (2-D) or all not (the vectors), as the parameter table says of each.
void test_decay_by_role() {
  bool by_role = true;
  std::string odd;
  for (llmc::Arch arch : {llmc::Arch::kGpt2, llmc::Arch::kModern, llmc::Arch::kSpeedrun}) {
    llmc::GPT2Config c;
    llmc::config_from_preset("tiny", &c, arch);
    llmc::ParamSpec table[llmc::kNumParamTensors];
    llmc::param_table(c, table);
    for (const llmc::ParamSpec& spec : table) {
      if (spec.decayed != (spec.role != ParamRole::kVector)) {
        by_role = false;
        odd += std::string(" ") + spec.name;
      }
    }
  }
  check_verbose(by_role, "every tensor decayed exactly when its role is not kVector" + odd);
}

// AdamW's rows: the recipe's betas and eps in each (a role may have its own: the update takes each
// slice's), and the speedrun's eps before the bias correction.
void test_adamw_rows() {
  const OptimizerTable t = llmc::optimizer_table(llmc::recipe_modern(), true);
  bool rows = true;
  for (const llmc::RoleOptimizer& row : t.roles) {
    if (row.method == llmc::OptimizerKind::kAdamW) rows = rows && row.beta1 == 0.8f && t.adamw_eps(row, 1) == 1e-10f;
  }
  check_verbose(rows && t.of(ParamRole::kMatrix).method == llmc::OptimizerKind::kMuon,
                "modern: AdamW's betas 0.8 and eps 1e-10 in each of its rows");
  const OptimizerTable speedrun = llmc::optimizer_table(llmc::recipe_speedrun(), true);
  const float eps1 = speedrun.adamw_eps(speedrun.of(ParamRole::kHead), 1);
  check_verbose(eps1 == (float)(1e-10f / std::sqrt(1.0 - 0.95f)),
                llmc::strformat("speedrun: eps before the correction, %g at step 1", eps1));
}

// The start-up table's "optimizers" row of each recipe.
void test_descriptions() {
  check_verbose(llmc::optimizer_description(llmc::recipe_gpt2(), true) ==
                    "AdamW betas 0.9 0.95 eps 1e-08, weight decay on the 2-D tensors",
                "gpt2's optimizers described");
  check_verbose(llmc::optimizer_description(llmc::recipe_modern(), true) ==
                    "Muon for the blocks' matrices (lr 0.025, weight decay 0.05, Nesterov momentum 0.95, 12 "
                    "Newton-Schulz steps in BF16); AdamW betas 0.8 0.95 eps 1e-10, weight decay on every tensor, lr x "
                    "0.7 embedding, 0.004 matrices, 0.015 gains and biases, 0.004 head for the rest",
                "modern's optimizers described");
  check_verbose(llmc::optimizer_description(llmc::recipe_speedrun(), true) ==
                    "Muon for the blocks' matrices (lr 0.05, weight decay 0, Nesterov momentum 0.85 rising to 0.95 "
                    "over 300 steps, 5 Newton-Schulz steps of (3.4445, -4.775, 2.0315) in BF16, tall matrices "
                    "unscaled); AdamW betas 0.8 0.95 eps 1e-10, weight decay on the 2-D tensors, lr x 0.6 embedding, "
                    "0.008 matrices, 0.04 gains and biases, 0.008 head, the embeddings' steps in BF16 for the rest",
                "speedrun's optimizers described, its BF16 embeddings in the BF16 build");
  const std::string fp32 = llmc::optimizer_description(llmc::recipe_speedrun(), false);
  check_verbose(fp32.find("BF16 for") == std::string::npos && fp32.find("0.008 head for the rest") != std::string::npos,
                "speedrun's in the FP32 build: no BF16 embeddings");
  Recipe cooled = llmc::recipe_speedrun();
  cooled.muon_momentum.cooldown_steps = 50;
  const std::string momentum = llmc::optimizer_description(cooled, true);
  check_verbose(momentum.find("Nesterov momentum 0.85 rising to 0.95 over 300 steps, back to 0.85 over the last 50, ") !=
                    std::string::npos,
                "-mc 50: the momentum's cooldown described");
}

std::string polynomial_text(const llmc::NewtonSchulzStep& p) { return llmc::strformat("(%.9g, %.9g, %.9g)", p.a, p.b, p.c); }

// A row's steps, each step's polynomial, and its norm, in full float precision.
std::string newton_schulz_text(const llmc::NewtonSchulz& ns) {
  std::string text = llmc::strformat("%s %d:", ns.name, ns.steps);
  for (int i = 0; i < ns.steps; i++) text += " " + polynomial_text(ns.polynomial[i]);
  return text + llmc::strformat(" norm %.9g %.9g", ns.norm_scale, ns.norm_eps);
}

void test_newton_schulz_rows() {
  const std::string baseline = newton_schulz_text(llmc::parse_newton_schulz("baseline", "-ns"));
  std::string twelve;
  for (int i = 0; i < 12; i++) twelve += " (2, -1.5, 0.5)";
  check_verbose(baseline == "baseline 12:" + twelve + " norm 1 1.00000001e-07",
                "-ns baseline: 12 steps of (2, -1.5, 0.5) from |X| + 1e-7: " + baseline);
  const std::string speedrun = newton_schulz_text(llmc::parse_newton_schulz("speedrun", "-ns"));
  std::string five;
  for (int i = 0; i < 5; i++) five += " (3.44449997, -4.7750001, 2.0315001)";
  check_verbose(speedrun == "speedrun 5:" + five + " norm 1 1.00000001e-07",
                "-ns speedrun: 5 steps of (3.4445, -4.775, 2.0315) from |X| + 1e-7: " + speedrun);
  // Record #89's coefficients (its train_gpt.py 168-174) as floats, and its norm 1.02 |X| + 1e-6.
  const llmc::NewtonSchulz& polar = llmc::parse_newton_schulz("polar", "-ns");
  const float record[5][3] = {{8.156554524902461f, -22.48329292557795f, 15.878769915207462f},
                              {4.042929935166739f, -2.808917465908714f, 0.5000178451051316f},
                              {3.8916678022926607f, -2.772484153217685f, 0.5060648178503393f},
                              {3.285753657755655f, -2.3681294933425376f, 0.46449024233003106f},
                              {2.3465413258596377f, -1.7097828382687081f, 0.42323551169305323f}};
  bool same = polar.steps == 5 && polar.norm_scale == 1.02f && polar.norm_eps == 1e-6f;
  for (int i = 0; i < 5; i++) {
    same = same && polar.polynomial[i].a == record[i][0] && polar.polynomial[i].b == record[i][1] &&
           polar.polynomial[i].c == record[i][2];
  }
  check_verbose(same, "-ns polar: record #89's 5 polynomials, one a step, from 1.02 |X| + 1e-6: " +
                          newton_schulz_text(polar));
  check_throws([] { llmc::parse_newton_schulz("newton", "-ns"); },
               "-ns newton: unknown orthogonalisation: use baseline", "-ns newton");
  check_verbose(std::string(llmc::recipe_gpt2().muon_newton_schulz.name) == "baseline" &&
                    std::string(llmc::recipe_modern().muon_newton_schulz.name) == "baseline" &&
                    std::string(llmc::recipe_speedrun().muon_newton_schulz.name) == "speedrun",
                "the recipes' orthogonalisation: gpt2 and modern the baseline's, speedrun its own");
  Recipe r = llmc::recipe_modern();
  r.muon_newton_schulz = polar;
  check_verbose(llmc::optimizer_table(r, true).muon_newton_schulz.polynomial[4].a == record[4][0],
                "modern -ns polar: the optimizer table's orthogonalisation is Polar Express");
  const std::string described = llmc::optimizer_description(r, true);
  check_verbose(described.find("Nesterov momentum 0.95, 5 Newton-Schulz steps each of its own polynomial from X / "
                               "(1.02 |X| + 1e-06) in BF16); AdamW") != std::string::npos,
                "modern -ns polar described: " + described);
}

// The orthogonalisation of a debug state's header: its row (1 + the place in the table) with the
// row's steps and first polynomial in [23..26]; without a row (files written before it) the
// header's steps of its one polynomial from |X| + 1e-7; a row that is not there, or whose steps or
// first polynomial the header does not repeat, fails.
void test_newton_schulz_debug_state() {
  const auto state = [](int row, int steps, llmc::NewtonSchulzStep p) {
    llmc::DebugState d;
    d.muon = true;
    d.newton_schulz_row = row;
    d.newton_schulz_steps = steps;
    d.newton_schulz_a = p.a, d.newton_schulz_b = p.b, d.newton_schulz_c = p.c;
    return d;
  };
  const llmc::NewtonSchulz& polar = llmc::kNewtonSchulzPolar;
  const llmc::NewtonSchulz read = llmc::debug_state_newton_schulz(state(3, 5, polar.polynomial[0]), "d.bin");
  check_verbose(newton_schulz_text(read) == newton_schulz_text(polar), "row 3: Polar Express, " + newton_schulz_text(read));
  const llmc::NewtonSchulz older = llmc::debug_state_newton_schulz(state(0, 5, {3.4445f, -4.775f, 2.0315f}), "d.bin");
  check_verbose(newton_schulz_text(older) ==
                    newton_schulz_text(llmc::kNewtonSchulzSpeedrun).replace(0, 8, "the debug state's"),
                "no row (an older file): the speedrun's 5 steps, " + newton_schulz_text(older));
  check_throws([&] { llmc::debug_state_newton_schulz(state(3, 5, llmc::kNewtonSchulzSpeedrun.polynomial[0]), "d.bin"); },
               "d.bin: Muon's orthogonalisation 3 in the header, of 5 steps from (3.4445, -4.775, 2.0315), is not "
               "row 3 of the 3 here", "row 3 with the speedrun's polynomial");
  check_throws([&] { llmc::debug_state_newton_schulz(state(4, 5, polar.polynomial[0]), "d.bin"); },
               "is not row 4 of the 3 here", "row 4");
  check_throws([&] { llmc::debug_state_newton_schulz(state(0, 13, {2.0f, -1.5f, 0.5f}), "d.bin"); },
               "d.bin: 13 Newton-Schulz steps in the header (1 to 12)", "no row, 13 steps");
}

}  // namespace

int main() {
  try {
    test_recipe_rows();
    test_flags_in_rows();
    test_cautious_rows();
    test_normuon_rows();
    test_muon_high_bits();
    test_adam_every();
    test_qk_blocks_described();
    test_adam_rows();
    test_decay_by_role();
    test_adamw_rows();
    test_descriptions();
    test_newton_schulz_rows();
    test_newton_schulz_debug_state();
  } catch (const llmc::Error& e) {
    testing::check(false, std::string("unexpected error: ") + e.what());
  }
  return testing::summary("test_recipe");
}
