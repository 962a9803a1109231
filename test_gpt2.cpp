// Checks the CPU trainer (train_gpt2.cpp) against PyTorch: the checkpoint and debug state that
// `train_gpt2.py --write_debug_state DIR` writes hold the model, one batch, PyTorch's logits,
// loss and gradients on it, and the losses of a few AdamW steps on that batch.
//
//   ./test_gpt2 CHECKPOINT DEBUG_STATE [--init-seed SEED] [--bf16 BF16_CHECKPOINT]
//
// Checks, in order: with --init-seed, that gpt2_from_seed(SEED) equals CHECKPOINT (which must be
// train_gpt2.py's init with that seed, as --write_debug_state writes it); with --bf16, that the
// BF16 checkpoint of the same model loads as the FP32 values rounded to BF16; that a saved
// checkpoint loads back bit for bit; that bad inputs fail with clear errors; logits, loss and
// every gradient tensor against PyTorch; gradient accumulation (two half batches, and one batch
// twice at half weight, against one full batch) and that one thread gives the same bits as
// several; the losses of the AdamW steps. Tolerances are next to each check, with the errors
// measured on the tiny and d12 debug states (B=4, T=64, 10 steps, seed 42).
#define TESTING
#include "train_gpt2.cpp"

#include "dev/test/testing.h"

static float max_abs(const float* x, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; i++) m = std::max(m, std::fabs(x[i]));
  return m;
}

static double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Forward and backward on the debug batch against PyTorch's logits, loss and gradients.
void check_forward_backward(GPT2& model, const DebugState& ref) {
  const int BT = ref.B * ref.T, V = model.config.vocab_size, Vp = model.config.padded_vocab_size;
  const float loss = gpt2_forward(model, ref.inputs.data(), ref.targets.data(), ref.B, ref.T);
  std::vector<float> logits((size_t)BT * V);
  for (int r = 0; r < BT; r++) {
    memcpy(&logits[(size_t)r * V], model.act(kLogits) + (size_t)r * Vp, V * sizeof(float));
  }
  // FP32 sums of 128..3072 products, in another order than PyTorch's BLAS, through L layers.
  // Measured max abs error on logits of magnitude ~1: 7e-7 (tiny), 6e-6 (d12).
  testing::check_tensor("logits", logits.data(), ref.logits.data(), logits.size(), 5e-5f, 0.0f);
  // The mean of B*T losses of ~10.9, where one float ulp is 1e-6: measured 2 ulps (tiny), 1 (d12).
  testing::check_tensor("loss", &loss, &ref.loss, 1, 1e-5f, 0.0f);

  gpt2_zero_grad(model);
  gpt2_backward(model, 1.0f);
  // Gradients differ in scale from tensor to tensor and element to element (most of wte's are
  // ~1e-6, those of the batch's tokens ~1e-2), so an element passes when
  // |got - ref| <= 2e-5 * max|ref| + 1e-3 * |ref|, max over the tensor. Measured worst element:
  // 4e-7 of the max (tiny), 2e-6 (d12). Over each whole tensor |got - ref| / |ref| measured
  // 3e-7..7e-7 (tiny) and 3e-7..2.2e-6 (d12); bound 2e-5.
  for (int i = 0; i < kNumParamTensors; i++) {
    const size_t o = model.param_offsets[i], n = model.param_specs[i].size;
    const float* ref_grad = ref.grads.data() + o;
    const std::string name = std::string("grad ") + model.param_specs[i].name;
    testing::check_tensor(name, model.grads.data() + o, ref_grad, n, 2e-5f * max_abs(ref_grad, n),
                          1e-3f);
    testing::check_tensor_norm(name, model.grads.data() + o, ref_grad, n, 2e-5);
  }
}

// Gradient accumulation against one full-batch backward: the batch split in two halves, and the
// same batch twice at half weight (which rounds once more per addition: measured 5e-8 abs where
// the largest gradient is 0.1).
void check_gradient_accumulation(GPT2& model, const DebugState& ref) {
  const int B = ref.B, T = ref.T;
  gpt2_zero_grad(model);
  gpt2_forward(model, ref.inputs.data(), ref.targets.data(), B, T);
  gpt2_backward(model, 1.0f);
  const std::vector<float> full = model.grads;
  const size_t n = full.size();

  if (B >= 2) {
    const int B1 = B / 2, B2 = B - B1;
    const size_t first = (size_t)B1 * T;
    gpt2_zero_grad(model);
    gpt2_forward(model, ref.inputs.data(), ref.targets.data(), B1, T);
    gpt2_backward(model, (float)B1 / B);
    gpt2_forward(model, ref.inputs.data() + first, ref.targets.data() + first, B2, T);
    gpt2_backward(model, (float)B2 / B);
    // Each parameter's sum over the batch continues in the same order, so the split is bitwise
    // the full batch, except in wte: its rows collect from the classifier and from the encoder,
    // and the split interleaves those two (measured 1e-8 abs where the encoder adds in). This
    // holds when the per-token weight 1/(B*T) is the same float in both halves.
    const size_t wte_size = model.param_specs[kWte].size;
    const bool exact_split = B1 == B2 && ((B1 * T) & (B1 * T - 1)) == 0;
    const float tolerance = exact_split ? 0.0f : 1e-6f * max_abs(full.data(), n);
    testing::check_tensor("accumulate: half batches, wte", model.grads.data(), full.data(),
                          wte_size, 1e-6f * max_abs(full.data(), wte_size), 1e-5f);
    testing::check_tensor("accumulate: half batches, rest", model.grads.data() + wte_size,
                          full.data() + wte_size, n - wte_size, tolerance,
                          exact_split ? 0.0f : 1e-5f);
  } else {
    printf("     (B=1: the half-batch accumulation check needs B >= 2)\n");
  }

  gpt2_zero_grad(model);
  for (int micro_step = 0; micro_step < 2; micro_step++) {
    gpt2_forward(model, ref.inputs.data(), ref.targets.data(), B, T);
    gpt2_backward(model, 0.5f);
  }
  testing::check_tensor("accumulate: one batch twice, half weight", model.grads.data(), full.data(),
                        n, 1e-6f * max_abs(full.data(), n), 1e-5f);

  // Every reduction runs in a fixed order (see the top of train_gpt2.cpp), so one thread must
  // reproduce the multi-threaded gradients bit for bit.
  const int threads = omp_get_max_threads();
  if (threads > 1) {
    omp_set_num_threads(1);
    gpt2_zero_grad(model);
    gpt2_forward(model, ref.inputs.data(), ref.targets.data(), B, T);
    gpt2_backward(model, 1.0f);
    omp_set_num_threads(threads);
    testing::check_tensor(strformat("1 thread = %d threads", threads), model.grads.data(),
                          full.data(), n, 0.0f, 0.0f);
  }
}

// The AdamW steps on the debug batch, with the debug state's hyperparameters.
void check_training(GPT2& model, const DebugState& ref) {
  AdamWConfig adamw;
  adamw.beta1 = ref.beta1;
  adamw.beta2 = ref.beta2;
  adamw.eps = ref.eps;
  adamw.weight_decay = ref.weight_decay;
  std::vector<float> losses(ref.steps);
  printf("     step  loss (C++)   loss (PyTorch)  diff\n");
  for (int step = 0; step < ref.steps; step++) {
    losses[step] = gpt2_forward(model, ref.inputs.data(), ref.targets.data(), ref.B, ref.T);
    gpt2_zero_grad(model);
    gpt2_backward(model, 1.0f);
    gpt2_clip_gradients(model, ref.grad_clip);
    gpt2_update(model, ref.lr, adamw);
    printf("     %4d  %.6f    %.6f       %+.2e\n", step + 1, losses[step], ref.losses[step],
           losses[step] - ref.losses[step]);
  }
  // Each AdamW step divides by sqrt(v) + 1e-8, which turns FP32-level gradient differences into
  // up to lr-sized parameter differences where a gradient is near 0, and the d12 run's loss
  // falls from 11 to 3.3 in 10 steps, which amplifies them. Measured max |diff|: 2e-6 (tiny),
  // 3.3e-5 (d12).
  testing::check_tensor("AdamW losses", losses.data(), ref.losses.data(), ref.steps, 1e-4f, 0.0f);
}

// gpt2_from_seed against the checkpoint that train_gpt2.py initialised with the same seed.
void check_init(const GPT2& reference, uint64_t seed) {
  const char* presets[] = {"d12", "d24", "d36", "d48", "tiny"};
  const char* preset = nullptr;
  for (const char* name : presets) {
    GPT2Config config;
    config_from_preset(name, &config);
    if (config == reference.config) preset = name;
  }
  if (!preset) {
    LLMC_FAIL("--init-seed: the checkpoint's shape (%s) is no preset's; give the checkpoint "
              "that train_gpt2.py --model PRESET --write_debug_state wrote",
              reference.config.describe().c_str());
  }
  GPT2 model = gpt2_from_seed(reference.config, seed);
  size_t different = 0;
  for (size_t i = 0; i < model.num_parameters; i++) {
    different += memcmp(&model.params[i], &reference.params[i], sizeof(float)) != 0;
  }
  printf("     init %s seed %llu: %zu of %zu parameters differ in any bit from the checkpoint\n",
         preset, (unsigned long long)seed, different, model.num_parameters);
  // rand.h reproduces PyTorch's normal_ bit for bit, so the bound is exact equality.
  for (int i = 0; i < kNumParamTensors; i++) {
    const size_t o = model.param_offsets[i];
    testing::check_tensor(std::string("init ") + model.param_specs[i].name, model.params.data() + o,
                          reference.params.data() + o, model.param_specs[i].size, 0.0f, 0.0f);
  }
}

void check_bf16_checkpoint(const GPT2& reference, const std::string& path) {
  const GPT2 model = gpt2_from_checkpoint(path);
  const std::string shape = model.config.describe();
  testing::check(model.config == reference.config,
                 "BF16 checkpoint has the FP32 checkpoint's shape (" + shape + ")");
  if (model.config != reference.config) return;
  std::vector<float> rounded(reference.num_parameters);
  for (size_t i = 0; i < rounded.size(); i++) {
    rounded[i] = bf16_bits_to_float(float_to_bf16_bits(reference.params[i]));
  }
  testing::check_tensor("BF16 checkpoint params", model.params.data(), rounded.data(),
                        rounded.size(), 0.0f, 0.0f);
}

// gpt2_save_checkpoint then gpt2_from_checkpoint gives back the same bits. The file goes next to
// the debug state (a build directory) and is removed afterwards.
void check_save_load(const GPT2& model, const std::string& path) {
  gpt2_save_checkpoint(model, path);
  const GPT2 loaded = gpt2_from_checkpoint(path);
  std::remove(path.c_str());
  testing::check(loaded.config == model.config, "saved checkpoint keeps the shape");
  testing::check_tensor("saved and reloaded params", loaded.params.data(), model.params.data(),
                        model.num_parameters, 0.0f, 0.0f);
}

void check_errors(const std::string& checkpoint, GPT2& model) {
  testing::check_throws([] { gpt2_build("no/such/checkpoint.bin", 42); }, "no such checkpoint",
                        "-e with a missing file");
  testing::check_throws([&] { parse_args({"-b", "0"}); }, "-b 0: must be at least 1", "-b 0");
  testing::check_throws([&] { parse_args({"-l", "abc"}); }, "-l 'abc': not a number", "-l abc");
  testing::check_throws([&] { parse_args({"-b"}); }, "needs a value", "a flag without its value");
  testing::check_throws([&] { parse_args({"--bogus", "1"}); },
                        "unknown flag '--bogus': ./train_gpt2 --help", "an unknown flag");
  testing::check_throws([&] { parse_args({"-q", "2"}); }, "-q 2: must be within [0, 1]",
                        "-q outside [0, 1]");
  testing::check(parse_args({"-h", "1"}).help, "-h asks for the usage (the CPU trainer has no -h flag)");
  TrainConfig config =
      parse_args({"-e", checkpoint, "-t", std::to_string(model.config.max_seq_len + 1)});
  testing::check_throws([&] { resolve_sequence_length(config, model.config.max_seq_len); },
                        "above the model's maximum sequence length",
                        "-t above the model's max_seq_len");
  config = parse_args({"-b", "4", "-t", "8", "-z", "100"});
  testing::check_throws([&] { step_batch(config, 1); }, "-z", "-z not a multiple of B*T");
  const int bad_token = model.config.vocab_size;
  testing::check_throws([&] { gpt2_forward(model, &bad_token, 1, 1); },
                        "outside the model's vocabulary", "an input token past the vocabulary");
}

int run(int argc, char** argv) {
  if (argc < 3) {
    LLMC_FAIL("usage: %s CHECKPOINT DEBUG_STATE [--init-seed SEED] [--bf16 BF16_CHECKPOINT]; "
              "write both with train_gpt2.py --write_debug_state DIR", argv[0]);
  }
  const std::string checkpoint = argv[1], debug_state = argv[2];
  bool check_seed = false;
  uint64_t seed = 0;
  std::string bf16_checkpoint;
  for (int i = 3; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) LLMC_FAIL("%s needs a value", flag.c_str());
    if (flag == "--init-seed") {
      check_seed = true;
      seed = (uint64_t)parse_int(flag.c_str(), argv[i + 1], 0, INT32_MAX);
    } else if (flag == "--bf16") {
      bf16_checkpoint = argv[i + 1];
    } else {
      LLMC_FAIL("unknown option %s; the options are --init-seed SEED and --bf16 PATH",
                flag.c_str());
    }
  }
  const auto start = std::chrono::steady_clock::now();
  GPT2 model = gpt2_from_checkpoint(checkpoint);
  const DebugState ref = debug_state_load(debug_state, model.config);
  if (ref.documents) {
    LLMC_FAIL("%s holds attention within documents (train_gpt2.py --documents 1), which this CPU trainer "
              "does not have: check it with ./test_gpt2cu", debug_state.c_str());
  }
  if (!ref.settings.empty()) {
    LLMC_FAIL("%s holds the loss's settings '%s' (train_gpt2.py --logit_cap, --mtp, --prefix_weight), which this "
              "CPU trainer does not have: check it with ./test_gpt2cu", debug_state.c_str(), ref.settings.c_str());
  }
  printf("model %s, %zu parameters; debug batch B=%d T=%d, %d AdamW steps (lr %g, weight "
         "decay %g, clip %g); %d threads\n", model.config.describe().c_str(),
         model.num_parameters, ref.B, ref.T, ref.steps, ref.lr, ref.weight_decay, ref.grad_clip,
         omp_get_max_threads());

  if (check_seed) check_init(model, seed);
  if (!bf16_checkpoint.empty()) check_bf16_checkpoint(model, bf16_checkpoint);
  check_save_load(model, debug_state + ".save_test.bin");
  check_errors(checkpoint, model);
  auto phase = std::chrono::steady_clock::now();
  check_forward_backward(model, ref);
  printf("     forward + backward: %.2f s\n", seconds_since(phase));
  check_gradient_accumulation(model, ref);
  phase = std::chrono::steady_clock::now();
  check_training(model, ref);
  printf("     %d training steps: %.2f s (%.2f s per step)\n", ref.steps, seconds_since(phase),
         seconds_since(phase) / ref.steps);
  printf("     total %.1f s\n", seconds_since(start));
  return testing::summary("test_gpt2");
}

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
