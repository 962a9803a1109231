// The CUDA trainer's flags that write the run's record (Recipe) beyond the shared ones of flags.h:
// its data and windows, optimizers, loss terms and record #89's model switches. train_gpt2.cu puts
// them after its own flags; being here, a test parses a command line into the record as the
// trainer does (dev/test/test_record_flags.cpp).
#pragma once

#include <cfloat>
#include <climits>
#include <string>
#include <vector>

#include "flags.h"
#include "recipe.h"
#include "stages.h"

namespace llmc {

// The recipe named by -recipe in args (GPT-2's without one), read before the flags are parsed:
// its values are the defaults that the other flags override.
inline const Recipe& recipe_of_args(const std::vector<std::string>& args) {
  for (size_t i = 0; i + 1 < args.size(); i++) {
    if (args[i] == "-recipe") return recipe_by_name(args[i + 1], "-recipe");
  }
  return recipe_gpt2();
}

// -aw's long and short windows.
inline WindowSetting window_setting(const Recipe& a) { return {a.window_blocks, a.short_window_blocks}; }

// -awt: whether a window's blocks are masked whole or counted in tokens.
inline WindowUnit window_unit(const Recipe& a) {
  return a.window_tokens ? WindowUnit::kTokens : WindowUnit::kBlocks;
}

// -aw: N blocks, -1 the schedule, 0 none, or S/N (parse_window_setting).
inline Flag window_flag(Recipe& a) {
  return {"-aw", "attention window", "with -pd 1: attention within modded-nanogpt's window of N blocks of 128 "
          "tokens (12 layers: N in its long layers, N/2 in the short ones, else N in every layer), or S/N: S "
          "blocks in the short layers (1 <= S <= N); -1: its schedule, 1 block growing to 14 over -x; 0: none",
          [&a](const char* text) {
            const WindowSetting w = parse_window_flag("-aw", text);
            a.window_blocks = w.long_blocks;
            a.short_window_blocks = w.short_blocks;
          },
          [&a] { return window_setting(a).text(); }, &a.window_blocks};
}

// -ns's help: each row of kNewtonSchulzMethods by its name, as the start-up table describes it.
inline std::string newton_schulz_help() {
  std::string help = "Muon's orthogonalisation:";
  for (int i = 0; i < kNewtonSchulzMethodCount; i++) {
    const NewtonSchulz& ns = kNewtonSchulzMethods[i];
    const int left = kNewtonSchulzMethodCount - 1 - i;
    help += strformat(" %s (%s)%s", ns.name, newton_schulz_description(ns).c_str(),
                            left > 1 ? "," : left == 1 ? " or" : "");
  }
  return help;
}

// -ns: Muon's orthogonalisation, a row of kNewtonSchulzMethods by its name.
inline Flag newton_schulz_flag(Recipe& a) {
  static const std::string help = newton_schulz_help();
  return {"-ns", "Muon orthogonalisation", help.c_str(),
          [&a](const char* text) { a.muon_newton_schulz = parse_newton_schulz(text, "-ns"); },
          [&a] { return std::string(a.muon_newton_schulz.name); }, &a.muon_newton_schulz};
}

// -lc: the head's cap in place of the architecture's.
inline Flag logit_cap_flag(Recipe& a) {
  return {"-lc", "logit cap", "the head's cap within [1, 40] in place of the architecture's, and the sigmoid "
          "cap's shift within [-100, 100]: \"23,5\", record #89's 23 sigmoid((z + 5) / 7.5) (the speedrun's own: "
          "30 sigmoid(z / 7.5)); a third item bf16 rounds the training loss's sigmoid to BF16, as record #89's "
          "kernel (evaluation takes it in FP32, as record #89's compiled evaluation): \"23,5,bf16\"; "
          "checkpoints keep the architecture's: give -lc with -e's model too",
          [&a](const char* text) { a.logit_cap = parse_logit_cap_setting("-lc", text); },
          [&a] { return logit_cap_setting_text(a.logit_cap); }, &a.logit_cap};
}

// -ri: the speedrun's init from the seed.
inline Flag record_init_flag(Recipe& a) {
  return {"-ri", "record init", "-recipe speedrun: 89 the model made from -e's preset starts from record #89's init "
          "(the head N(0, 0.005) and the embedding its copy, the value embeddings N(0, 0.01), the attention's output "
          "projection uniform as its input's); 0: record #28's (the head zero)",
          [&a](const char* text) { a.record_init = parse_speedrun_init("-ri", text); },
          [&a] { return std::to_string((int)a.record_init); }, &a.record_init};
}

// -fhs: the FP8 head's fixed scales.
inline Flag fp8_head_scales_flag(Recipe& a) {
  return {"-fhs", "FP8 head scales", "X,W,G: the FP8 head's x_s = X/448 (0: sqrt(C)/448, the bound of its RMS-normed "
          "input), w_s = W/448 and grad_s = G/448: 0,0.875,1 is record #28's (the speedrun's), 100,1.6,0.75 record "
          "#89's; W also sets how the head's BF16 copies round without -fh 1",
          [&a](const char* text) { a.fp8_head_scales = parse_fp8_head_scales("-fhs", text); },
          [&a] { return fp8_head_scales_text(a.fp8_head_scales); }, &a.fp8_head_scales};
}

// -asc: the attention's softmax scale, before YaRN's changes (0, the default: the architecture's).
inline Flag attention_scale_flag(Recipe& a) {
  return {"-asc", "attention scale", "the attention's softmax scale, positive (record #89's 0.1; YaRN, -yn 1, "
          "changes it from there); none given: the architecture's (0.12 modern and speedrun, 1/sqrt(HS) GPT-2)",
          [&a](const char* text) { a.attention_scale = parse_attention_scale("-asc", text); },
          [&a] { return a.attention_scale > 0.0 ? strformat("%g", a.attention_scale) : std::string("arch's"); },
          &a.attention_scale};
}

// -mtp: the training loss's weights of the next token and the ones after it.
inline Flag prediction_weights_flag(Recipe& a) {
  return {"-mtp", "next-token weights", "the training loss's weights of the next token and of the one or two "
          "after it, each within [0, 1] (validation keeps the next token's alone): \"1,0.5,0.25\" (record #89's "
          "first stage); a target past the sequence's end adds nothing",
          [&a](const char* text) { a.next_token_weights = parse_prediction_weights("-mtp", text); },
          [&a] { return prediction_weights_text(a.next_token_weights); }, &a.next_token_weights};
}

// -mt: Muon's rates of tensors over -ml (record #89's MLP matrices).
inline Flag muon_tensor_lr_flag(Recipe& a) {
  return {"-mt", "Muon tensor rates", "-opt muon: Muon's rate of a tensor's matrices over -ml, NAME=X,... (NAME as "
          "the start-up table names a tensor Muon takes, X positive), in its lr_eff and cautious decay too: "
          "\"fcw=2,fcprojw=4\" (record #89's MLP, whose matrices it stores tall)",
          [&a](const char* text) { a.muon_tensor_lr = parse_muon_tensor_lr("-mt", text); },
          [&a] {
            const std::string text = muon_tensor_lr_text(a.muon_tensor_lr);
            return text.empty() ? std::string("none") : text;
          },
          &a.muon_tensor_lr};
}

// -ar: AdamW's tensors' own rates, betas and decays (record #89's rows).
inline Flag adam_rows_flag(Recipe& a) {
  return {"-ar", "AdamW tensor rows", "AdamW tensors' own rows over their roles', NAME:key=value,... apart by ';' "
          "(quote it), NAME as the start-up table names the tensor, keys lr (times its role's rate) or rate (its own), "
          "b1 and b2 (its betas), wd (times its role's decay) or decay (its own), and bf16 (none, weight or all: "
          "what of its step BF16 builds round to BF16): "
          "\"ve:lr=75,b1=0.75,b2=0.95,wd=5;headw:b1=0.5\" (record #89's value embeddings and head); not the "
          "tensors Muon takes",
          [&a](const char* text) { a.adam_rows = parse_adam_rows("-ar", text); },
          [&a] {
            const std::string text = adam_rows_text(a.adam_rows);
            return text.empty() ? std::string("none") : text;
          },
          &a.adam_rows};
}

inline Flag optimizer_flag(Recipe& a) {
  return {"-opt", "optimizer", "adamw, or muon: Muon for the blocks' matrices and AdamW for the rest",
          [&a](const char* text) { a.optimizer = parse_optimizer(text, "-opt"); },
          [&a] { return std::string(optimizer_name(a.optimizer)); }, &a.optimizer};
}

// The record's flags of the CUDA trainer, a setting each of a.
inline std::vector<Flag> record_flags(Recipe& a) {
  constexpr long kIntMax = INT32_MAX;
  return {
      int_flag("-fh", "FP8 head", "1: the speedrun head's training products in FP8 with its record's fixed scales (BF16 builds, compute capability 8.9+; evaluation stays BF16)", &a.fp8_head, 0, 1),
      fp8_head_scales_flag(a),
      int_flag("-sh", "shuffle", "1: shuffle the training data", &a.shuffle, 0, 1),
      int_flag("-pd", "packed documents", "1: train on sequences of whole documents, each from a document start "
               "(token 50256), in modded-nanogpt's order, with attention within each document (validation too, "
               "its sequences contiguous); needs -x and -t a multiple of 128", &a.documents, 0, 1),
      window_flag(a),
      int_flag("-ut", "untie step", "an untied head tied to the embedding through step U's update (the head "
               "stepped with both gradients, the embedding its copy), then the head's AdamW state copied to the "
               "embedding, separate from step U + 1 (modded-nanogpt's record #89: the first odd step of stage 3, "
               "847); -1: separate throughout", &a.untie_step, -1, kIntMax),
      int_flag("-awf", "final window", "with -pd 1 and a window: the long window N of the validation after the "
               "last step, its short one staying the last stage's (modded-nanogpt's record #89: 20); 0: the last "
               "stage's", &a.final_window_blocks, 0, kIntMax),
      int_flag("-awt", "window in tokens", "with -pd 1 and a window: 1: a window of N blocks is N x 128 tokens back "
               "from each query (record #89's FlashAttention window: key j seen by query i when i - 128N <= j <= i), "
               "masked token by token at its edge; 0: whole blocks of 128 tokens (modded-nanogpt's block mask)",
               &a.window_tokens, 0, 1),
      int_flag("-ko", "key offset", "1: record #89's key offset on the layers with the long window (every "
               "layer at a depth other than the speedrun's 12): after the rotary, each key's stationary dims are "
               "the previous key's over the forward's tokens as one sequence (the first key keeping its own); "
               "the modern and speedrun architectures", &a.key_offset, 0, 1),
      text_flag("-sp", "stage plan", "the run in stages, each with its share of -x's steps and its own t (-t), z (-z), "
                "cap (tokens of one document a sequence takes, with -pd 1), aw (-aw), lr (rate multiplier), mtp "
                "(-mtp) and pw (-pw), these two constant or A>B linear over the stage, "
                "'+E' E extension steps after them: \"1/2 cap=512; 1/2 t=2048 z=-1 lr=1.5; +10 aw=6\" "
                "(a stage keeps the one before's values, the first the flags'; none: one stage)", &a.stages),
      int_flag("-vt", "validation length", "validation sequence length, batches of -b sequences of it (0: -t); "
               "longer than -t, validation runs a forward pass of its own that keeps one layer's activations",
               &a.val_T, 0, kIntMax),
      int_flag("-zs", "ZeRO stage", "ZeRO stage: 0 off, 1 optimizer state sharded over the processes", &a.zero_stage, 0, 1),
      int_flag("-od", "divided optimizers", "1: with -zs 0 on several processes, each steps its share of Muon's "
               "matrices and its part of each large AdamW tensor alone, keeping their state, takes their averaged "
               "gradients alone, and the others take its new parameters (the bits of -od 0 where the norm does not "
               "clip; the state is shared before a checkpoint); a recipe's 1 yields to -zs 1",
               &a.divided_optimizers, 0, 1),
      optimizer_flag(a),
      float_flag("-ml", "Muon lr", "Muon's learning rate at the schedule's peak", &a.muon_lr, 0.0f, FLT_MAX),
      float_flag("-mw", "Muon weight decay", "Muon's weight decay (-cd: decoupled or cautious)", &a.muon_weight_decay, 0.0f, FLT_MAX),
      newton_schulz_flag(a),
      int_flag("-cd", "cautious weight decay", "1: both optimizers' weight decay cautious, record #89's: only where "
               "the step and the weight agree in sign, AdamW's lr^2 wd p where u p > 0, Muon's wd lr lr_eff p where "
               "u p >= 0; 0: decoupled, lr wd p on every weight", &a.cautious_decay, 0, 1),
      int_flag("-mn", "NorMuon", "-opt muon: 1 Muon's orthogonalised update divided, per entry of each matrix's "
               "longer side, by the root of a running mean (beta2 0.9) of its squares, then scaled back to its norm "
               "(record #89's NorMuon); 0: plain Muon", &a.normuon, 0, 1),
      int_flag("-mk", "Muon's BF16 weights", "-opt muon, BF16 builds with -w 1: 1 each Muon matrix's BF16 weight is "
               "the high 16 bits of its FP32 master weight, the master cut toward zero (record #89's BF16 weight "
               "with its kept 16-bit mantissa); 0: the master stochastically rounded", &a.muon_high_bits, 0, 1),
      int_flag("-ao", "AdamW interval", "AdamW steps on every K-th step only ((step + 1) % K == 0), with the sum of "
               "the K steps' gradients, which the steps between keep (record #89's 2: its odd steps; -gc 0, and -zs "
               "0 on several processes); 1: every step", &a.adam_every, 1, kMaxAdamEvery),
      int_flag("-mq", "Muon Q/K blocks", "-opt muon: qkvw's Q and K orthogonalised in blocks of N heads each, V "
               "whole (record #89's 2: its head pairs, a matrix of 2 heads' rows each); 0: Q, K and V whole",
               &a.muon_qk_heads, 0, kIntMax),
      adam_rows_flag(a),
      muon_tensor_lr_flag(a),
      int_flag("-sm", "smear", "-recipe speedrun: 1 the model made from -e's preset smears its embedding (record "
               "#89's: each token's takes a gated share of the one before, before the norm); a model file's header "
               "says whether it smears", &a.smear, 0, 1),
      int_flag("-bg", "bigram embedding", "-recipe speedrun: 1 the model made from -e's preset has record #89's "
               "bigram hash embedding (a table of hashed token pairs, added with learned gates before layer 0 and "
               "after the later layers' attention); a model file's header says whether it has it", &a.bigram, 0, 1),
      int_flag("-rp", "rotary pairs", "-recipe modern or speedrun: 1 the model made from -e's preset turns record "
               "#89's rotary pairs: adjacent dims (2i, 2i + 1) for i < HS/4, HS/2 to HS - 1 unturned, at positions "
               "over each forward's rows as one sequence (0: pairs (j, j + HS/2) at each row's positions); a model "
               "file's header says which it has", &a.rotary_pairs, 0, 1),
      attention_scale_flag(a),
      record_init_flag(a),
      int_flag("-vg", "value-embedding gates", "-recipe speedrun: 1 the model made from -e's preset has record #89's "
               "value-embedding gates (each head's share of the value embedding 2 sigmoid of a learned weight "
               "times the first 6 channels of the attention's input and of the embedding); a model file's header "
               "says whether it has them", &a.ve_gates, 0, 1),
      int_flag("-rl", "residual lambdas", "-recipe speedrun: 1 the model made from -e's preset has record #89's "
               "residual and post lambdas (each sublayer's add r x + p out, r and p learned for each layer and "
               "sublayer); a model file's header says whether it has them", &a.resid_lambdas, 0, 1),
      int_flag("-xs", "XSA", "-recipe speedrun: 1 the model made from -e's preset has record #89's exclusive "
               "self-attention in its layers 1, 3 and 4 (each head's output less tanh(alpha) times its part along "
               "the value it read, alpha learned per layer and head); a model file's header says whether it has it",
               &a.xsa, 0, 1),
      int_flag("-lp", "record #89's plan", "-recipe speedrun: 1 the model made from -e's preset has record #89's 11 "
               "layers (no attention in layer 6, which adds layer 3's output times sigmoid(skip_lambda) g; layers 9 "
               "and 10 attend over layer 7's output; five value embeddings; x0 added after each attention with a "
               "learned gate in place of the x0 lambdas; no attention gates); a model file's header says whether it "
               "has it", &a.record89_plan, 0, 1),
      int_flag("-ph", "paired heads", "-recipe speedrun with -lp 1 and -rp 1: 1 the model made from -e's preset has "
               "record #89's paired heads in its layers 0, 2, 5 and 9 (head h of token t rotated at position 2t + (h "
               "& 1); heads 0..NH/2-1 of token t attend at position 2t and the rest at 2t + 1 of each sequence "
               "doubled, as NH/2 heads; windows in positions: -awt 1); a model file's header says whether it has "
               "them", &a.paired_heads, 0, 1),
      int_flag("-al", "attention lambdas", "-recipe speedrun: 1 the model made from -e's preset has record #89's "
               "attention lambdas (each attention layer's qkv and output projections read their weights times "
               "learned scalars s0 and s1, 0.5 and 1 at the start); a model file's header says whether it has them",
               &a.attn_lambdas, 0, 1),
      int_flag("-mg", "MUDD gates", "-recipe speedrun with -lp 1: 1 the model made from -e's preset reads record "
               "#89's XSA strengths, head gates, x0 and bigram gates (but layer 10's) and the skip's g a token, from "
               "two MUDD gate generators (gelu(x W1^T) W2^T + b2) scale, one of x0 and one of layer 4's input; at "
               "most 6 heads; a model file's header says whether it has them", &a.mudd_gates, 0, 1),
      int_flag("-ca", "composed attention", "-recipe speedrun with -lp 1 -mg 1: 1 the model made from -e's preset "
               "has record #89's composed attention: layer 10's heads each add w_out_h (A v_h), A the heads' "
               "attention probabilities over the last 112 keys of the query's document mixed by w_in, both a "
               "token from the post MUDD gate generator; a model file's header says whether it has it",
               &a.composed_attention, 0, 1),
      int_flag("-md", "MUDD dense connections", "-recipe speedrun with -lp 1 -mg 1: 1 the model made from -e's "
               "preset has record #89's MUDD dense connections: its last layer's input, value and adds, and the "
               "stream after it, mix earlier layers' outputs with coefficients a token from two generators of the "
               "gate generators' form; an even number of heads; a model file's header says whether it has them",
               &a.mudd_connections, 0, 1),
      int_flag("-yn", "YaRN", "1: record #89's YaRN: at each change of the stage plan's long window (-sp's aw=, "
               "not -awf's) from O to N tokens, each rotary frequency f times s + w (1 - s) with s = O/N and w = "
               "clamp((O f / 2 pi - 1) / 31, 0, 1), the attention's scale times 1 + 0.2 ln(N/O); every stage needs "
               "a window; the modern and speedrun architectures", &a.yarn, 0, 1),
      int_flag("-mr", "MLP backward from ReLU^2's output", "1: record #89's MLP backward: ReLU^2's derivative 2 "
               "sqrt(y) from its kept output y (in FP32, then rounded), the pre-activation not kept (one [B*T, 4C] "
               "buffer a layer less); 0: 2 relu(x) from the kept pre-activation x; a ReLU^2 MLP, -r 0, -fp8 0",
               &a.mlp_from_output, 0, 1),
      int_flag("-fm", "FP8 MLP", "1: record #89's MLP training forward in FP8 (E4M3 casts under its scales: the "
               "weights' after each update, the input's own amax, ReLU^2's output's delayed; BF16 builds, compute "
               "capability 8.9+, -mr 1; evaluation and the backward stay BF16)", &a.fp8_mlp, 0, 1),
      int_flag("-mc", "Muon momentum cooldown", "-opt muon: the run's last K steps (with -sp's extension steps) over "
               "which Muon's momentum falls linearly back to its start value (0: none)",
               &a.muon_momentum.cooldown_steps, 0, kIntMax),
      float_flag("-kd", "wsd decay fraction", "-k wsd: the fraction of the steps over which the lr decays linearly (0: the last fifth)", &a.decay_fraction, 0.0f, 1.0f),
      prediction_weights_flag(a),
      logit_cap_flag(a),
      float_flag("-pw", "prefix weight", "the training loss's weight of the next token's prefix token, the longest "
                 "proper prefix of its bytes that is a token (-tk's vocabulary file), where it has one: record #89's "
                 "0.25 (0: none)", &a.prefix_weight, 0.0f, 1.0f),
      double_flag("-kc", "cooldown fraction", "-k cooldown: the fraction c of -x's steps its cooldown takes, "
                  "from step int(N (1 - c)) linear from each stage's lr multiplier to -q (of the peak, whatever the "
                  "multiplier) at step N (0: the last fifth)", &a.cooldown_fraction, 0.0, 1.0),
  };
}

}  // namespace llmc
