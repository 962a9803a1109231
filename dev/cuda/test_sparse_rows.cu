// Tests -os 1's exchange of the embedding tables' rows (train_gpt2.cu section 13) on one GPU, the
// processes' gradient buffers side by side: random values in the rows each process's random ids
// mark (zeros elsewhere), two token tables and a bigram table between other elements, the tables
// cut among the owners at element counts that are not whole rows (as -od 1 cuts AdamW's tensors); the
// plan (llmc::plan_sparse_rows), sparse_rows_pack and sparse_rows_merge, with NCCL's sends and
// receives replaced by copies between the processes' buffers. On two processes every owner's runs
// must hold NCCL's average bit for bit (each value halved, the halves' sum rounded once); on three
// the average within the stored type's rounding; the elements outside a process's runs unchanged;
// twice the same bits.
#include "dev/cuda/kernel_test.h"

namespace sparse_rows_tests {

struct Process {
  SparseRows sp;
  llmc::SparsePlan plan;
  std::vector<float> host;  // the gradient buffer before the exchange, as stored
  std::unique_ptr<DeviceArray<floatX>> grads;
  ~Process() { sparse_rows_free(sp); }
};

void test_exchange(int world, int C, int token_rows, int bigram_rows, const std::vector<int>& tokens,
                   llmc::Rng& rng) {
  printf("\nsparse rows: %d processes, rows of %d, tables of %d and %d rows\n", world, C, token_rows, bigram_rows);
  const size_t prefix = 40, token_table = (size_t)token_rows * C;
  const std::vector<llmc::SparseTable> tables = {{prefix, token_rows, C, llmc::kTokenRows},
                                                 {prefix + token_table, token_rows, C, llmc::kTokenRows},
                                                 {prefix + 2 * token_table, bigram_rows, C, llmc::kBigramRows}};
  const size_t total = prefix + 2 * token_table + (size_t)bigram_rows * C + 24;
  std::vector<llmc::OwnerRun> runs;
  for (const llmc::SparseTable& t : tables) {
    for (int r = 0; r < world; r++) {
      const size_t size = (size_t)t.rows * t.width, from = size * r / world / 8 * 8;
      const size_t to = r + 1 == world ? size : size * (r + 1) / world / 8 * 8;
      runs.push_back({t.begin + from, to - from, r});
    }
  }
  llmc::RowBitmapLayout layout;
  layout.rows[llmc::kTokenRows] = token_rows;
  layout.rows[llmc::kBigramRows] = bigram_rows;
  const size_t words = layout.words();
  std::vector<uint32_t> bitmaps(world * words, 0);
  std::vector<Process> procs(world);
  for (int p = 0; p < world; p++) {
    uint32_t* bits = bitmaps.data() + p * words;
    const std::vector<int> token_ids = random_ints(rng, tokens[p], 0, token_rows);
    const std::vector<int> bigram_ids = random_ints(rng, tokens[p], 0, bigram_rows);
    llmc::mark_rows(bits + layout.first_word(llmc::kTokenRows), token_ids.data(), tokens[p]);
    llmc::mark_rows(bits + layout.first_word(llmc::kBigramRows), bigram_ids.data(), tokens[p]);
    std::vector<float> values = random_stored(rng, total, 0.0f, 1.0f);
    for (const llmc::SparseTable& t : tables) {
      for (int row = 0; row < t.rows; row++) {
        if (llmc::row_marked(bits + layout.first_word(t.family), row)) continue;
        std::fill_n(values.begin() + t.begin + (size_t)row * C, C, 0.0f);
      }
    }
    procs[p].host = values;
    procs[p].grads.reset(new DeviceArray<floatX>(values));
  }
  for (int p = 0; p < world; p++) {
    Process& q = procs[p];
    q.sp.tables = tables;
    q.sp.runs = runs;
    q.sp.layout = layout;
    sparse_rows_allocate(q.sp, p, world, C, 0);
    llmc::plan_sparse_rows(tables, layout, bitmaps.data(), runs, p, world, &q.plan);
  }
  auto exchange = [&] {
    for (int p = 0; p < world; p++) {
      procs[p].grads->upload(procs[p].host);
      sparse_rows_pack(procs[p].sp, procs[p].plan, *procs[p].grads, 0);
    }
    for (int r = 0; r < world; r++) {
      for (int s = 0; s < world; s++) {
        const Process &from = procs[s], &to = procs[r];
        if (s == r || to.plan.recv_count[s] == 0) continue;
        REQUIRE(from.plan.send_count[r] == to.plan.recv_count[s], "process %d sends %zu to %d, which receives %zu", s,
                from.plan.send_count[r], r, to.plan.recv_count[s]);
        cudaCheck(cudaMemcpyAsync(to.sp.recv + to.plan.recv_at[s], from.sp.send + from.plan.send_at[r],
                                  to.plan.recv_count[s] * sizeof(floatX), cudaMemcpyDeviceToDevice, 0));
      }
    }
    for (int p = 0; p < world; p++) sparse_rows_merge(procs[p].sp, procs[p].plan, *procs[p].grads, world, 0);
    cudaCheck(cudaDeviceSynchronize());
  };
  exchange();
  for (int p = 0; p < world; p++) {
    std::vector<float> expected = procs[p].host;
    for (const llmc::OwnerRun& run : runs) {
      for (size_t e = run.begin; run.owner == p && e < run.begin + run.count; e++) {
        float average = 0.0f;
        if (world == 2) {
          average = procs[0].host[e] * 0.5f + procs[1].host[e] * 0.5f;
        } else {
          double sum = 0.0;
          for (int s = 0; s < world; s++) sum += procs[s].host[e];
          average = (float)(sum / world);
        }
        expected[e] = average;
      }
    }
    const float tol = world == 2 ? 0.0f : (float)world * kTolStore;
    check_close(llmc::strformat("process %d's gradients", p), procs[p].grads->download(), stored(expected), tol);
  }
  const Snapshot first(*procs[0].grads, *procs[world - 1].grads);
  exchange();
  check_same_bits("exchange twice", first, Snapshot(*procs[0].grads, *procs[world - 1].grads));
}

void run() {
  llmc::Rng rng(43);
  test_exchange(2, 768, 1003, 2401, {700, 900}, rng);
  test_exchange(3, 40, 97, 311, {60, 0, 200}, rng);  // a process of no tokens sends nothing
  test_exchange(2, 24, 5000, 3000, {0, 0}, rng);      // no rows at all
}

}  // namespace sparse_rows_tests
