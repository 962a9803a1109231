// Tests record #89's embedding steps (SPEC "Record #89's embedding") against CPU references written
// here from their definitions:
//  - smear_forward/backward: x_t + lambda sigmoid(w . x_t[:12]) x_{t-1}, row 0 copied, each step
//    rounded as the kernel's comment says (the reference below rounds at the same points); the
//    gates kept; dx, dw and dlambda in double from the same stored values;
//  - bigram_forward/backward: the signed gather exactly, of llmc::bigram_rows' ids and sign rows
//    (dev/test/test_bigram_hash.cpp pins those); the table's gradient through the encoder's
//    bucketed backward, ids repeated hundreds of times (long buckets) and rows never hit left alone;
//  - bigram_gate_forward/backward: in + g b (the product rounded, then the sum), apart and in place;
//    db += g dout and dg += the sum of dout . b in double from the same stored values;
//  - gated_terms_forward (record #89's plan's x0 term, then the bigram's): [p] in + g x0 + g' b
//    with and without p, apart and in place, bitwise against a reference that rounds where the kernel
//    does (each product to the storage type, the FP32 sum in that order, once at the end); either
//    term alone bitwise bigram_gate_forward;
//  - the same with record #89's MUDD gates, a gate a row (rows of 48 values, the gates at odd
//    columns): the forward bitwise against the reference, and with every row the same gate bitwise
//    the shared gate's; db += g_n dout, dg_n the row's dout . b written into its column alone.
// Row counts below, at and above the backward's 256 fixed row blocks, widths with partial warps;
// outputs poisoned first, gradients accumulated onto random ones, every kernel run twice for
// identical bits.
#include "dev/cuda/kernel_test.h"

namespace smear_bigram_tests {

// ---- Smear ----

struct SmearCase {
  int N, C;
};

double rounded(double v) { return (double)(float)(floatX)(float)v; }

void test_smear(const SmearCase& s, llmc::Rng& rng) {
  const int N = s.N, C = s.C;
  printf("\nsmear N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f);
  // Weights of a few units over 12 channels, so that the gates spread over (0, 1).
  const std::vector<float> w = random_stored(rng, kSmearWidth, 0.0f, 0.6f), lambda = stored({0.7f});
  DeviceArray<floatX> d_x(x), d_w(w), d_lambda(lambda), out(n);
  DeviceArray<float> gates(N);

  std::vector<float> ref_out(x), ref_gates(N, 0.0f);
  for (int t = 1; t < N; t++) {
    double z = 0.0;
    for (int j = 0; j < kSmearWidth; j++) z += (double)w[j] * x[(size_t)t * C + j];
    const double sg = rounded(1.0 / (1.0 + std::exp(-rounded(z)))), g = rounded(lambda[0] * sg);
    ref_gates[t] = (float)sg;
    for (int c = 0; c < C; c++) {
      const size_t i = (size_t)t * C + c;
      ref_out[i] = (float)(x[i] + rounded(g * x[i - C]));
    }
  }
  auto forward = [&] {
    out.poison();
    gates.poison();
    smear_forward(out, gates, d_x, d_w, d_lambda, N, C, 0);
  };
  forward();
  check_close("forward out", out.download(), ref_out, kTolStore);
  check_close("forward gates", gates.download(), ref_gates, kTolStore);
  const Snapshot forward_bits(out, gates);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out, gates));

  // Backward from the forward's gates.
  const std::vector<float> kept_gates = gates.download();
  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dw0 = random_stored(rng, kSmearWidth, 0.0f, 1.0f);
  const std::vector<float> dlambda0 = random_stored(rng, 1, 0.0f, 1.0f);
  std::vector<float> ref_dx(n);
  std::vector<double> dw_sum(kSmearWidth, 0.0);
  double dlambda_sum = 0.0;
  for (int t = 0; t < N; t++) {
    const double sg = kept_gates[t];
    double a = 0.0;
    for (int c = 0; t > 0 && c < C; c++) a += (double)dout[(size_t)t * C + c] * x[(size_t)(t - 1) * C + c];
    const double dz = lambda[0] * a * sg * (1.0 - sg);
    const double g_next = t + 1 < N ? rounded(lambda[0] * kept_gates[t + 1]) : 0.0;
    for (int c = 0; c < C; c++) {
      const size_t i = (size_t)t * C + c;
      double v = dout[i] + (t + 1 < N ? g_next * dout[i + C] : 0.0);
      if (c < kSmearWidth) v += dz * w[c];
      ref_dx[i] = (float)v;
    }
    if (t == 0) continue;
    for (int j = 0; j < kSmearWidth; j++) dw_sum[j] += dz * x[(size_t)t * C + j];
    dlambda_sum += a * sg;
  }
  std::vector<float> ref_dw(kSmearWidth);
  for (int j = 0; j < kSmearWidth; j++) ref_dw[j] = (float)(dw0[j] + dw_sum[j]);
  const std::vector<float> ref_dlambda = {(float)(dlambda0[0] + dlambda_sum)};

  DeviceArray<floatX> d_dout(dout), dx(n), dw(kSmearWidth), dlambda(1);
  DeviceArray<float> partials((size_t)kRowBlocks * (kSmearWidth + 1));
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    dx.poison();
    partials.poison();
    dw.upload(dw0);
    dlambda.upload(dlambda0);
    smear_backward(dx, dw, dlambda, partials, d_dout, d_x, gates, d_w, d_lambda, N, C, seed, 0);
  };
  backward();
  check_close("backward dx", dx.download(), ref_dx, kTolStore);
  check_close("backward dw", dw.download(), ref_dw, kTolSum);
  check_close("backward dlambda", dlambda.download(), ref_dlambda, kTolSum);
  const Snapshot backward_bits(dx, dw, dlambda);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dx, dw, dlambda));
}

// ---- Bigram hash ----

struct BigramCase {
  int N, C, Vp;  // Vp sets the table's rows (bigram_table_rows): a small one repeats each id often
};

void test_bigram(const BigramCase& s, llmc::Rng& rng) {
  const int N = s.N, C = s.C, R = llmc::bigram_table_rows(s.Vp);
  printf("\nbigram N=%d C=%d, a table of %d rows\n", N, C, R);
  const size_t n = (size_t)N * C;
  const std::vector<int> tokens = random_ints(rng, N, 0, s.Vp);
  std::vector<int> ids(N), sign_rows(N);
  llmc::bigram_rows(ids.data(), sign_rows.data(), tokens.data(), N, R);
  const std::vector<float> table = random_stored(rng, (size_t)R * C, 0.0f, 1.0f);
  std::vector<float> signs((size_t)llmc::kBigramSignRows * C);
  for (float& v : signs) v = rng.u32() % 2 ? 1.0f : -1.0f;
  DeviceArray<floatX> d_table(table), d_signs(signs), out(n);
  DeviceArray<int> d_ids(ids), d_sign_rows(sign_rows);

  std::vector<float> ref_out(n);
  for (int t = 0; t < N; t++) {
    for (int c = 0; c < C; c++) {
      ref_out[(size_t)t * C + c] = table[(size_t)ids[t] * C + c] * signs[(size_t)sign_rows[t] * C + c];
    }
  }
  auto forward = [&] {
    out.poison();
    bigram_forward(out, d_table, d_ids, d_signs, d_sign_rows, N, C, 0);
  };
  forward();
  check_close("forward (exact)", out.download(), ref_out, 0.0f);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));

  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dtable0 = random_stored(rng, (size_t)R * C, 0.0f, 1.0f);
  std::vector<double> sums((size_t)R * C, 0.0);
  std::vector<bool> hit(R, false);
  for (int t = 0; t < N; t++) {
    hit[ids[t]] = true;
    for (int c = 0; c < C; c++) {
      sums[(size_t)ids[t] * C + c] += (double)dout[(size_t)t * C + c] * signs[(size_t)sign_rows[t] * C + c];
    }
  }
  std::vector<float> ref_dtable(dtable0), got_unhit, ref_unhit;
  for (size_t i = 0; i < ref_dtable.size(); i++) ref_dtable[i] = (float)(dtable0[i] + sums[i]);
  DeviceArray<floatX> d_dout(dout), dtable((size_t)R * C), scratch(n);
  const DeviceEncoderPlan plan(ids, C);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    dtable.upload(dtable0);
    scratch.poison();
    bigram_backward(dtable, scratch, d_dout, d_signs, d_sign_rows, plan.plan, N, C, seed, 0);
  };
  backward();
  const std::vector<float> got = dtable.download();
  check_close("backward dtable", got, ref_dtable, kTolSum);
  for (int r = 0; r < R; r++) {
    if (hit[r]) continue;
    got_unhit.insert(got_unhit.end(), got.begin() + (size_t)r * C, got.begin() + (size_t)(r + 1) * C);
    ref_unhit.insert(ref_unhit.end(), dtable0.begin() + (size_t)r * C, dtable0.begin() + (size_t)(r + 1) * C);
  }
  printf("     %d of %d rows never hit, %d buckets of over %d positions\n", (int)(ref_unhit.size() / C), R,
         plan.plan.num_long, kEncoderLongBucket);
  check_close("backward rows never hit", got_unhit, ref_unhit, 0.0f);
  const Snapshot backward_bits(dtable);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(dtable));
}

// ---- The bigram embedding's gated adds ----

void test_bigram_gate(int N, int C, llmc::Rng& rng) {
  printf("\nbigram gate N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), b = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> gate = stored({0.3f});
  DeviceArray<floatX> d_x(x), d_b(b), d_gate(gate), out(n);
  std::vector<float> ref_out(n);
  for (size_t i = 0; i < n; i++) ref_out[i] = (float)(x[i] + rounded((double)gate[0] * b[i]));
  auto forward = [&] {
    out.poison();
    bigram_gate_forward(out, d_x, d_b, {d_gate, 0}, N, C, 0);
  };
  forward();
  check_close("forward out", out.download(), ref_out, kTolStore);
  const Snapshot forward_bits(out);
  forward();
  check_same_bits("forward twice", forward_bits, Snapshot(out));
  DeviceArray<floatX> in_place(x);
  bigram_gate_forward(in_place, in_place, d_b, {d_gate, 0}, N, C, 0);
  check_same_bits("forward in place", forward_bits, Snapshot(in_place));

  const std::vector<float> dout = random_stored(rng, n, 0.0f, 1.0f), db0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> dg0 = random_stored(rng, 1, 0.0f, 1.0f);
  std::vector<float> ref_db(n);
  double dg_sum = 0.0;
  for (size_t i = 0; i < n; i++) {
    ref_db[i] = (float)(db0[i] + (double)gate[0] * dout[i]);
    dg_sum += (double)dout[i] * b[i];
  }
  const std::vector<float> ref_dg = {(float)(dg0[0] + dg_sum)};
  DeviceArray<floatX> d_dout(dout), db(n), dg(1);
  DeviceArray<float> partials(kRowBlocks);
  const uint32_t seed = rng.u32();
  auto backward = [&] {
    db.upload(db0);
    dg.upload(dg0);
    partials.poison();
    bigram_gate_backward(db, {dg, 0}, partials, d_dout, d_b, {d_gate, 0}, N, C, seed, 0);
  };
  backward();
  check_close("backward db", db.download(), ref_db, kTolStore);
  check_close("backward dgate", dg.download(), ref_dg, kTolSum);
  const Snapshot backward_bits(db, dg);
  backward();
  check_same_bits("backward twice", backward_bits, Snapshot(db, dg));
}

// One term g t of gated_terms_forward's sum on the CPU; none where values is null. gates: one value
// every row shares, or one a row.
struct HostTerm {
  const std::vector<float>* values = nullptr;
  std::vector<float> gates;
  float gate(size_t i, int C) const { return gates.size() == 1 ? gates[0] : gates[i / C]; }
};

// [p] in + g t + g' t', rounded as gated_terms_forward_kernel: p in and each product rounded once to
// FP32 (their double products are exact), each product then to the storage type, the sum in FP32 in
// this order, rounded once to the storage type.
std::vector<float> gated_terms_reference(const std::vector<float>& in, const float* p, const HostTerm& first,
                                         const HostTerm& second, int C) {
  std::vector<float> out(in.size());
  for (size_t i = 0; i < in.size(); i++) {
    float v = p ? (float)((double)*p * in[i]) : in[i];
    for (const HostTerm* t : {&first, &second}) {
      if (t->values) v += (float)(floatX)(float)((double)t->gate(i, C) * (*t->values)[i]);
    }
    out[i] = (float)(floatX)v;
  }
  return out;
}

void test_gated_terms(int N, int C, llmc::Rng& rng) {
  printf("\ngated terms N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), x0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> b = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> scalars = stored({0.8125f, 0.37f, 0.05f});  // p, x0's gate, the bigram's gate
  DeviceArray<floatX> d_x(x), d_x0(x0), d_b(b), d_scalars(scalars), out(n), one(n), bigram_gated(n);
  const floatX* gates = d_scalars;
  const GatedTerm x0_term{d_x0, {gates + 1, 0}}, bigram_term{d_b, {gates + 2, 0}};
  const HostTerm host_x0{&x0, {scalars[1]}}, host_bigram{&b, {scalars[2]}};
  for (const bool with_p : {false, true}) {
    const floatX* p = with_p ? gates : nullptr;
    const std::string which = with_p ? " p in + g x0 + g' b" : " in + g x0 + g' b";
    auto forward = [&] {
      out.poison();
      gated_terms_forward(out, d_x, p, x0_term, bigram_term, N, C, 0);
    };
    forward();
    const std::vector<float> ref =
        gated_terms_reference(x, with_p ? &scalars[0] : nullptr, host_x0, host_bigram, C);
    check_close("forward (exact)" + which, out.download(), ref, 0.0f);
    const Snapshot bits(out);
    forward();
    check_same_bits("forward twice" + which, bits, Snapshot(out));
    DeviceArray<floatX> in_place(x);
    gated_terms_forward(in_place, in_place, p, x0_term, bigram_term, N, C, 0);
    check_same_bits("forward in place" + which, bits, Snapshot(in_place));

    // Each term alone, first or second: bigram_gate_forward's bits.
    for (const bool alone_first : {true, false}) {
      const std::string where = alone_first ? " (first)" : " (second)";
      one.poison();
      bigram_gated.poison();
      gated_terms_forward(one, d_x, p, alone_first ? x0_term : GatedTerm{}, alone_first ? GatedTerm{} : x0_term, N,
                          C, 0);
      bigram_gate_forward(bigram_gated, d_x, d_x0, {gates + 1, 0}, N, C, 0, p);
      const std::vector<float> ref_one =
          gated_terms_reference(x, with_p ? &scalars[0] : nullptr, host_x0, HostTerm{}, C);
      check_close("one term (exact)" + which + where, one.download(), ref_one, 0.0f);
      check_same_bits("one term = bigram_gate_forward" + where, Snapshot(bigram_gated), Snapshot(one));
    }
  }
}

// ---- Gates a row (record #89's MUDD gates) ----
// Rows of kGateStride values as the model keeps them, the gates at odd columns (unaligned reads).
constexpr int kGateStride = llmc::kMuddGateStride, kX0Column = 19, kBigramColumn = 21;

// [p] in + g_n x0 + g'_n b with the gates a row against the reference, apart, in place and twice;
// rows that all hold the shared gates give the shared gates' bits. Backward of one term: db += g_n
// dout, dg_n = the row's dout . b written at its column (the rows' other columns left alone).
void test_gated_terms_rows(int N, int C, llmc::Rng& rng) {
  printf("\ngated terms, gates a row, N=%d C=%d\n", N, C);
  const size_t n = (size_t)N * C;
  const std::vector<float> x = random_stored(rng, n, 0.0f, 1.0f), x0 = random_stored(rng, n, 0.0f, 1.0f);
  const std::vector<float> b = random_stored(rng, n, 0.0f, 1.0f), p = stored({0.8125f});
  const std::vector<float> x0_gates = random_stored(rng, N, 0.4f, 0.3f);
  const std::vector<float> bigram_gates = random_stored(rng, N, 0.05f, 0.1f);
  std::vector<float> rows = gate_rows(x0_gates, 1, kGateStride, kX0Column, kGateFill);
  for (int t = 0; t < N; t++) rows[(size_t)t * kGateStride + kBigramColumn] = bigram_gates[t];
  DeviceArray<floatX> d_x(x), d_x0(x0), d_b(b), d_p(p), d_rows(rows), out(n), in_place(n);
  const GatedTerm x0_term{d_x0, {(floatX*)d_rows + kX0Column, kGateStride}};
  const GatedTerm bigram_term{d_b, {(floatX*)d_rows + kBigramColumn, kGateStride}};
  auto forward = [&] {
    out.poison();
    gated_terms_forward(out, d_x, d_p, x0_term, bigram_term, N, C, 0);
  };
  forward();
  const std::vector<float> ref = gated_terms_reference(x, &p[0], {&x0, x0_gates}, {&b, bigram_gates}, C);
  check_close("forward p in + g_n x0 + g'_n b (exact)", out.download(), ref, 0.0f);
  const Snapshot bits(out);
  forward();
  check_same_bits("forward twice", bits, Snapshot(out));
  in_place.upload(x);
  gated_terms_forward(in_place, in_place, d_p, x0_term, bigram_term, N, C, 0);
  check_same_bits("forward in place", bits, Snapshot(in_place));

  // Every row holding the same gates: the bits of those gates shared (stride 0).
  const std::vector<float> shared = {x0_gates[0], bigram_gates[0]};
  std::vector<float> same_rows = gate_rows(std::vector<float>(N, shared[0]), 1, kGateStride, kX0Column, kGateFill);
  for (int t = 0; t < N; t++) same_rows[(size_t)t * kGateStride + kBigramColumn] = shared[1];
  DeviceArray<floatX> d_same_rows(same_rows), d_shared(shared), shared_out(n);
  out.poison();
  shared_out.poison();
  gated_terms_forward(out, d_x, d_p, {d_x0, {(floatX*)d_same_rows + kX0Column, kGateStride}},
                      {d_b, {(floatX*)d_same_rows + kBigramColumn, kGateStride}}, N, C, 0);
  gated_terms_forward(shared_out, d_x, d_p, {d_x0, {(floatX*)d_shared, 0}}, {d_b, {(floatX*)d_shared + 1, 0}}, N, C,
                      0);
  check_same_bits("rows of equal gates = the shared gates", Snapshot(shared_out), Snapshot(out));

  const std::vector<float> dout = random_stored(rng, n, 0.5f, 1.0f), db0 = random_stored(rng, n, 0.0f, 1.0f);
  std::vector<float> ref_db(n), ref_dg(N, 0.0f);
  std::vector<double> sums(N, 0.0);
  for (size_t i = 0; i < n; i++) {
    ref_db[i] = (float)(db0[i] + (double)bigram_gates[i / C] * dout[i]);
    sums[i / C] += (double)dout[i] * b[i];
  }
  for (int t = 0; t < N; t++) ref_dg[t] = (float)sums[t];
  const std::vector<float> drows0(rows.size(), kGateFill);
  DeviceArray<floatX> d_dout(dout), db(n), d_drows(drows0);
  DeviceArray<float> partials(kRowBlocks);
  auto backward = [&] {
    db.upload(db0);
    d_drows.upload(drows0);
    partials.poison();
    bigram_gate_backward(db, {(floatX*)d_drows + kBigramColumn, kGateStride}, partials, d_dout, d_b,
                         bigram_term.gate, N, C, rng.u32(), 0);
  };
  backward();
  check_close("backward db += g_n dout", db.download(), ref_db, kTolStore);
  const std::vector<float> drows = d_drows.download();
  check_close("backward dg_n, written", gate_columns(drows, 1, kGateStride, kBigramColumn, true), ref_dg, kTolSum);
  check_close("backward: the rows' other columns untouched",
              gate_columns(drows, 1, kGateStride, kBigramColumn, false),
              gate_columns(drows0, 1, kGateStride, kBigramColumn, false), 0.0f);
  const Snapshot backward_bits(db, d_drows);
  backward();
  check_same_bits("backward twice (any seed)", backward_bits, Snapshot(db, d_drows));
}

void test_bad_shapes() {
  printf("\nbad shapes\n");
  DeviceArray<floatX> a(3 * 768), b(3 * 768);
  DeviceArray<float> g(8);
  testing::check_throws([&] { smear_forward(a, g, a, b, b, 3, 768, 0); }, "apart from the input",
                        "smear_forward in place");
  testing::check_throws([&] { smear_forward(a, g, b, b, b, 3, 8, 0); }, "at least 12", "smear_forward at C = 8");
  DeviceArray<float> partials((size_t)kRowBlocks * (kSmearWidth + 1));
  testing::check_throws([&] { smear_backward(a, b, b, partials, a, b, g, b, b, 3, 768, 1, 0); },
                        "apart from the input", "smear_backward with dx over dout");
  // Valid rows, so that a check that failed to throw would launch on initialised ids.
  const DeviceArray<int> rows(std::vector<int>{0, 1, 2});
  const DeviceEncoderPlan plan({0, 1, 2}, 768);
  testing::check_throws([&] { bigram_backward(a, a, a, b, rows, plan.plan, 3, 768, 1, 0); }, "apart from dout",
                        "bigram_backward with the scratch over dout");
  // 102: a multiple of neither 4 (FP32's x128::size) nor 8 (BF16's).
  testing::check_throws([&] { bigram_forward(a, b, rows, b, rows, 3, 102, 0); }, "multiple of",
                        "bigram_forward at C = 102");
  testing::check_throws([&] { bigram_gate_backward(a, {b, 0}, partials, a, b, {b, 0}, 3, 768, 1, 0); },
                        "apart from dout",
                        "bigram_gate_backward with dbigram over dout");
  testing::check_throws([&] { bigram_gate_forward(a, a, b, {b, 0}, 3, 102, 0); }, "multiple of",
                        "bigram_gate_forward at C = 102");
  testing::check_throws([&] { gated_terms_forward(a, a, nullptr, {b, {b, 0}}, {b, {b, 0}}, 3, 102, 0); }, "multiple of",
                        "gated_terms_forward at C = 102");
  testing::check_throws([&] { gated_terms_forward(a, a, nullptr, {b, {b, -1}}, {}, 3, 768, 0); }, "stride of 0",
                        "gated_terms_forward with a negative gate stride");
  testing::check_throws([&] { bigram_gate_backward(a, {a, 0}, partials, b, b, {b, 48}, 3, 768, 1, 0); },
                        "gradient needs", "bigram_gate_backward with gates a row but a shared gradient");
}

void run() {
  llmc::Rng rng(89);
  test_smear({4 * 64 + 1, 768}, rng);  // d12 width; one row per backward block, one more
  test_smear({3999, 768}, rng);        // 16 rows per block; one short, six empty
  test_smear({37, 128}, rng);          // tiny width; most blocks empty
  test_smear({7, 136}, rng);           // 17 pieces of a row: a partial warp
  test_smear({1, 16}, rng);            // one row: copied, no gradient into w or lambda

  test_bigram({4 * 64 + 1, 768, 64}, rng);  // 480 rows: most never hit
  test_bigram({3999, 768, 2}, rng);         // 15 rows: hundreds of positions each (long buckets)
  test_bigram({37, 128, 301}, rng);
  test_bigram({7, 136, 5}, rng);            // 17 pieces of a row: a partial warp
  test_bigram_gate(4 * 64 + 1, 768, rng);   // one row per backward block, one more
  test_bigram_gate(3999, 768, rng);         // 16 rows per block; one short, six empty
  test_bigram_gate(7, 136, rng);            // most blocks empty, a row of 17 pieces
  test_gated_terms(37, 128, rng);           // tiny width
  test_gated_terms(1, 128, rng);            // one row: most of a block's threads idle
  test_gated_terms(300, 768, rng);          // d12 width
  test_gated_terms(1, 768, rng);
  test_gated_terms(7, 136, rng);            // a row of 17 pieces
  llmc::Rng rows_rng(48);  // its own draws, so that the cases above keep their inputs
  test_gated_terms_rows(4 * 64 + 1, 768, rows_rng);  // d12 width; one row per backward block, one more
  test_gated_terms_rows(3999, 768, rows_rng);        // 16 rows per block: each warp two, some one
  test_gated_terms_rows(37, 128, rows_rng);          // tiny width; most blocks empty
  test_gated_terms_rows(7, 136, rows_rng);           // a row of 17 pieces: a partial warp
  test_bad_shapes();
}

}  // namespace smear_bigram_tests
