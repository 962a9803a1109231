// One full training step inside NVTX ranges, for nsys and ncu:
//   ./profile_gpt2cu [-b B] [-t T] [-l layers] [-e preset] [-fp8 1|2] [-recipe gpt2|modern|speedrun]
//                    [-aw N] [-fh 0|1] [-fm 0|1] [-i SHARDS] [-f89 sm,bg,rp,ko,vg,rl,xs,lp,ph,al,mg]
//   ncu --set full --nvtx --nvtx-include "step/" ./profile_gpt2cu -l 2
// A model initialised from a seed; prints the time of each phase. The tokens are random, or with -i
// the first B x T of those shards (contiguous): real text's frequent tokens and documents change
// some kernels' work (the encoder's backward, the attention within documents). A recipe on packed
// documents (speedrun) attends within them and a window of -aw N blocks (0: every earlier block);
// random tokens hold few document starts, so the window sets the attention's work. The head's
// products are the recipe's (FP8 for the speedrun, where the build and the GPU have it) unless -fh
// says otherwise, as in train_gpt2cu; so is the MLP's training forward (-fm: FP8 for record89). -f89 gives the model record #89's parts of those names, as
// train_gpt2cu's flags of them (-sm 1, -bg 1, -rp 1, -ko 1, -vg 1, -rl 1, -xs 1, -lp 1: its 11 layers,
// -ph 1: its paired heads, with lp and rp; -al 1: its attention lambdas; -mg 1: its MUDD gate generators,
// with lp).
#define TESTING
#include "train_gpt2.cu"

// B x T inputs and targets: the first of the shards `data` (-i), or random ones where it is empty.
void profile_tokens(const std::string& data, int B, int T, int vocab_size, int* inputs, int* targets) {
  if (!data.empty()) {
    llmc::DataLoader loader(data, "-i", B, T, 0, 1, false, 0, vocab_size);
    loader.next_batch(inputs, targets);
    return;
  }
  llmc::Rng rng(1234);
  for (size_t i = 0; i < (size_t)B * T; i++) {
    inputs[i] = rng.u32() % vocab_size;
    targets[i] = rng.u32() % vocab_size;
  }
}

// -f89's list: record #89's parts, each a model feature of the config but the key offset (a setting
// of the plan, *key_offset).
void apply_record89_parts(const std::string& list, llmc::GPT2Config* c, bool* key_offset) {
  const std::pair<const char*, bool*> parts[] = {{"sm", &c->smear},        {"bg", &c->bigram},
                                                 {"rp", &c->rotary_pairs}, {"ko", key_offset},
                                                 {"vg", &c->ve_gates},     {"rl", &c->resid_lambdas},
                                                 {"xs", &c->xsa},          {"lp", &c->record89_plan},
                                                 {"ph", &c->paired_heads}, {"al", &c->attn_lambdas},
                                                 {"mg", &c->mudd_gates}};
  for (size_t at = 0; at < list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    at = end + 1;
    const auto part = std::find_if(std::begin(parts), std::end(parts), [&](const auto& p) { return name == p.first; });
    if (part == std::end(parts)) {
      LLMC_FAIL("-f89 %s: no part '%s'; name some of sm, bg, rp, ko, vg, rl, xs, lp, ph, al, mg, apart by commas",
                list.c_str(), name.c_str());
    }
    *part->second = true;
  }
  if (c->record89_plan) llmc::set_record89_plan(*c, true);  // its depth
  if (const char* missing = llmc::paired_heads_missing(*c)) {
    LLMC_FAIL("-f89 %s: the paired heads (ph) need %s: name lp and rp with ph", list.c_str(), missing);
  }
  if (const char* missing = llmc::mudd_gates_missing(*c)) {
    LLMC_FAIL("-f89 %s: the MUDD gates (mg) need %s: name lp with mg", list.c_str(), missing);
  }
}

int profile_main(int argc, char** argv) {
  int B = 8, T = 1024, layers = -1, fp8 = 0, window = 0;
  std::string preset = "d12", recipe_name = "gpt2", data, fp8_head, fp8_mlp, parts89;  // "": the recipe's
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "-b") B = atoi(argv[i + 1]);
    else if (flag == "-t") T = atoi(argv[i + 1]);
    else if (flag == "-l") layers = atoi(argv[i + 1]);
    else if (flag == "-e") preset = argv[i + 1];
    else if (flag == "-fp8") fp8 = atoi(argv[i + 1]);
    else if (flag == "-recipe") recipe_name = argv[i + 1];
    else if (flag == "-aw") window = atoi(argv[i + 1]);
    else if (flag == "-fh") fp8_head = argv[i + 1];
    else if (flag == "-fm") fp8_mlp = argv[i + 1];
    else if (flag == "-i") data = argv[i + 1];
    else if (flag == "-f89") parts89 = argv[i + 1];
    else LLMC_FAIL("unknown flag %s: use -b B, -t T, -l layers, -e preset, -fp8 0|1|2, -recipe "
                   "gpt2|modern|speedrun, -aw N, -fh 0|1, -fm 0|1, -i SHARDS, -f89 PARTS", flag.c_str());
  }
  if (argc % 2 == 0) LLMC_FAIL("flag %s needs a value", argv[argc - 1]);
  const llmc::Recipe& recipe = llmc::recipe_by_name(recipe_name, "-recipe");
  const llmc::OptimizerTable opt = llmc::optimizer_table(recipe, sizeof(floatX) == 2);
  llmc::GPT2Config config;
  REQUIRE(llmc::config_from_preset(preset, &config, recipe.arch), "-e %s: not a preset (d12 d24 d36 d48 tiny)",
          preset.c_str());
  if (layers > 0) config.num_layers = layers;
  bool key_offset = false;
  apply_record89_parts(parts89, &config, &key_offset);
  REQUIRE(parts89.empty() || recipe.arch == llmc::Arch::kSpeedrun, "-f89 %s: record #89's parts are the "
          "speedrun's: give -recipe speedrun", parts89.c_str());
  REQUIRE(B > 0 && T > 0 && T <= config.max_seq_len, "need B > 0 and 0 < T <= %d", config.max_seq_len);
  const AttentionSpec attention = {recipe.documents != 0, window};
  REQUIRE(window >= 0 && (window == 0 || attention.documents), "-aw %d: a window of N >= 0 blocks, with a "
          "recipe on packed documents (speedrun)", window);
  REQUIRE(fp8_mlp.empty() || fp8_mlp == "0" || fp8_mlp == "1", "-fm %s: 0 (BF16) or 1 (FP8, BF16 builds)",
          fp8_mlp.c_str());
  REQUIRE(fp8_head.empty() || fp8_head == "0" || fp8_head == "1",
          "-fh %s: 0 (the build's products) or 1 (FP8, BF16 builds)", fp8_head.c_str());

  // The tokens come before the GPU, so that a wrong -i is reported the same without one.
  std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
  profile_tokens(data, B, T, config.vocab_size, inputs.data(), targets.data());

  matmul_setup(true);
  const bool head_in_fp8 = fp8_resolved(fp8_head.empty() ? recipe_fp8_head(recipe) : fp8_head == "1",
                                        !fp8_head.empty());
  GPT2 m;
  cudaCheck(cudaStreamCreate(&m.stream));
  gpt2_init(m, config, llmc::init_params_from_seed(config, 42), {true, opt.muon()}, 42);
  if (key_offset) gpt2_set_key_offset(m);
  m.mlp_from_output = recipe.mlp_from_output != 0 && fp8 == 0;
  gpt2_allocate(m, B, T, 0, fp8, Fp8Format::kE5M2, attention, head_in_fp8);
  gpt2_allocate_fp8_mlp(m, B, T, fp8_resolved(fp8_mlp.empty() ? recipe_fp8_mlp(recipe) && m.mlp_from_output
                                                              : fp8_mlp == "1", !fp8_mlp.empty()));
  if (attention.documents) gpt2_set_window(m, llmc::step_windows(window));
  cudaEvent_t events[5];
  for (cudaEvent_t& e : events) cudaCheck(cudaEventCreate(&e));
  // Warm-up steps keep library setup and matmul tuning out of the profiled step.
  const int warmup_steps = tuning_steps(m);
  for (int step = 0; step <= warmup_steps; step++) {
    nvtxRangePush(step < warmup_steps ? "warmup" : "step");
    cudaCheck(cudaEventRecord(events[0], m.stream));
    gpt2_zero_grad(m);
    gpt2_forward(m, inputs.data(), B, T, ForwardPass::kTraining);
    cudaCheck(cudaEventRecord(events[1], m.stream));
    // As train_step: the losses copied without a wait, so the backward's host work overlaps the GPU.
    gpt2_classifier_enqueue(m, targets.data(), B, T, recipe.loss_sum ? 1.0f : 1.0f / (B * T), m.losses_host);
    cudaCheck(cudaEventRecord(events[2], m.stream));
    gpt2_backward(m, B, T, true);
    cudaCheck(cudaEventRecord(events[3], m.stream));
    const float norm = gpt2_grad_norm(m);
    gpt2_update(m, opt, step, recipe.lr, 1.0f, norm);
    gpt2_fp8_end_step(m, true);  // -fp8 2: the profiled step casts with the warm-up's history
    cudaCheck(cudaEventRecord(events[4], m.stream));
    cudaCheck(cudaEventSynchronize(events[4]));
    nvtxRangePop();
  }
  const char* names[4] = {"forward", "classifier", "backward", "norm + update"};
  float total = 0.0f;
  printf("%s%s%s, %s B=%d T=%d%s, %s:\n", PRECISION_NAME, fp8 ? " + FP8 linear layers" : "",
         head_in_fp8 ? " + FP8 head" : "",
         config.describe().c_str(), B, T,
         attention.documents ? llmc::strformat(", documents, window %d", window).c_str() : "",
         data.empty() ? "random tokens" : ("the first tokens of " + data).c_str());
  for (int i = 0; i < 4; i++) {
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
    total += ms;
    printf("  %-14s %9.2f ms\n", names[i], ms);
  }
  printf("  %-14s %9.2f ms, %.0f tok/s\n", "step", total, B * T / (total / 1e3));
  for (cudaEvent_t& e : events) cudaCheck(cudaEventDestroy(e));
  gpt2_free(m);
  matmul_teardown();
  return 0;
}

int main(int argc, char** argv) { return llmc::run_main(profile_main, argc, argv); }
