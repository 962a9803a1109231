#!/usr/bin/env bash
# Tests dev/reference89_offline.py on a stand-in of record #89's files (the lines that the copy changes,
# in a script and a kernel file of their own) and a stand-in tiktoken that checks the files' hashes as
# tiktoken does: the copies differ from them in those lines alone, the other kernel file and the two
# stand-ins (attention, scaled matmul) beside them, the shards linked in sorted order under the
# reference's names (the training ones --passes times over, or as many as the run reads), the GPT-2
# cache under the names tiktoken looks for, run.sh; and the one-line errors (a line not there once in
# either file, no pass, no shard, a folder in use, files that are not GPT-2's, which leave no folder
# behind); --profile_steps: the profiler around the named steps and its modules beside, its bad steps
# refused; step_profile against a stand-in torch (a table a named step, a failing profiler one line);
# --init_check: no warm-up, the statistics printed after the model's set-up (init_stats against a small
# model, where torch is), a stop before the first training step, not with --profile_steps; --init_from:
# the weights loaded after the set-up (before --init_check's statistics), a missing file refused;
# --first_steps: no warm-up, each step's loss summed over its micro steps and printed, the stop after N
# steps, its bad counts and companions refused; --save_state: the model's state dict saved by rank 0
# after each of those steps, refused without --first_steps or a folder that is there.
set -uo pipefail
cd "$(dirname "$0")/../.."
source dev/test/lib.sh

PY=python3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

ref=$WORK/reference
mkdir -p "$ref" "$WORK/shards" "$WORK/stub/tiktoken" "$WORK/stub/tiktoken_ext"
cat > "$ref/train_gpt.py" <<'EOF'
import os
from kernels import get_kernel
flash_attn_interface = get_kernel('kernels-community/flash-attn3', version=1).flash_attn_interface
class Hyperparameters:
    val_tokens: int = 10485760 # how many tokens of validation data?
dist.broadcast(model.bigram_sign_table, 0)  # buffer, not in parameters()
for step in warmup_steps:
    pass
for step in range(3):
    # --------------- TRAINING SECTION -----------------
    for idx in range(2):
        loss = 1
        del loss
    training_manager.step_optimizers(step)
    model.quantize_mlp_fp8(bootstrap_down=(step < 16))
EOF
cat > "$ref/triton_kernels.py" <<'EOF'
from triton.tools.tensor_descriptor import TensorDescriptor
def down(post_f8, W2_f8, activation_scale, W2_scale):
    x3 = torch._scaled_mm(post_f8, W2_f8, out_dtype=torch.bfloat16,
                          scale_a=activation_scale, scale_b=W2_scale, use_fast_accum=True)
    return x3
EOF
echo "# dc" > "$ref/dc_triton_kernels.py"
for name in sp_train_000002 sp_train_000001 sp_train_000010 sp_val_000001; do
  echo "$name" > "$WORK/shards/$name.bin"
done

# tiktoken's surface that the kit uses: read_file (the network here), read_file_cached (the cache under
# sha1 of the address, the hash checked), openai_public.gpt2 (its two files and their sha256).
touch "$WORK/stub/tiktoken/__init__.py" "$WORK/stub/tiktoken_ext/__init__.py"
cat > "$WORK/stub/tiktoken/load.py" <<'EOF'
import hashlib, os
def read_file(blobpath):
    raise OSError(f"no network for {blobpath}")
def read_file_cached(blobpath, expected_hash=None):
    path = os.path.join(os.environ["TIKTOKEN_CACHE_DIR"], hashlib.sha1(blobpath.encode()).hexdigest())
    if os.path.exists(path):
        return open(path, "rb").read()
    contents = read_file(blobpath)
    if expected_hash and hashlib.sha256(contents).hexdigest() != expected_hash:
        raise ValueError(f"hash mismatch for {blobpath}")
    with open(path, "wb") as f:
        f.write(contents)
    return contents
EOF
cat > "$WORK/stub/tiktoken_ext/openai_public.py" <<'EOF'
from tiktoken import load
BASE = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
def gpt2():
    load.read_file_cached(BASE + "vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5")
    load.read_file_cached(BASE + "encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783")
EOF
export PYTHONPATH=$WORK/stub

holds() {  # holds NAME COMMAND...: the command succeeds (else its output's end is shown)
  local name=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  check "$name" "$rc" 0
  [ "$rc" -eq 0 ] || tail -5 <<< "$out"
}

kit() { "$PY" dev/reference89_offline.py "$@" --reference "$ref" --train "$WORK/shards/sp_train_*.bin" \
  --val "$WORK/shards/sp_val_*.bin"; }

out=$WORK/offline
holds "the copy made" kit "$out" --val_tokens 4194304
holds "two lines and val_tokens changed, nothing else" bash -c "
  diff '$ref/train_gpt.py' '$out/train_gpt.py' | grep -c '^>' | grep -qx 3 &&
  grep -qx 'import flash_varlen_attention  # offline: .*' '$out/train_gpt.py' &&
  grep -qx 'flash_attn_interface = flash_varlen_attention' '$out/train_gpt.py' &&
  grep -qx '    val_tokens: int = 4194304 # how many tokens of validation data?' '$out/train_gpt.py' &&
  grep -qx 'import os' '$out/train_gpt.py'"
holds "the kernels' scaled matmul by the stand-in, nothing else" bash -c "
  diff '$ref/triton_kernels.py' '$out/triton_kernels.py' | grep -c '^>' | grep -qx 2 &&
  grep -qx 'from triton.tools.tensor_descriptor import TensorDescriptor; import aligned_scaled_mm  # offline' \
    '$out/triton_kernels.py' &&
  grep -q '^    x3 = aligned_scaled_mm.scaled_mm(  # offline: ' '$out/triton_kernels.py'"
holds "the other kernel file and the two stand-ins beside them" bash -c "
  cmp '$ref/dc_triton_kernels.py' '$out/dc_triton_kernels.py' &&
  cmp dev/pylib/flash_varlen_attention.py '$out/flash_varlen_attention.py' &&
  cmp dev/pylib/aligned_scaled_mm.py '$out/aligned_scaled_mm.py'"
holds "shards linked in sorted order" bash -c "
  d='$out/data/fineweb10B'
  [ \"\$(readlink \$d/fineweb_train_000001.bin)\" = '$WORK/shards/sp_train_000001.bin' ] &&
  [ \"\$(readlink \$d/fineweb_train_000002.bin)\" = '$WORK/shards/sp_train_000002.bin' ] &&
  [ \"\$(readlink \$d/fineweb_train_000003.bin)\" = '$WORK/shards/sp_train_000010.bin' ] &&
  [ \"\$(readlink \$d/fineweb_val_000001.bin)\" = '$WORK/shards/sp_val_000001.bin' ] && [ \$(ls \$d | wc -l) = 4 ]"
holds "no profiler without --profile_steps" bash -c "[ ! -e '$out/step_profile.py' ] && ! grep -q step_profile '$out/train_gpt.py'"
out3=$WORK/offline3
holds "the copy made with --profile_steps" kit "$out3" --profile_steps 860,10,430
holds "--profile_steps: the profiler around the named steps, its modules beside" bash -c "
  diff '$ref/train_gpt.py' '$out3/train_gpt.py' | grep -c '^>' | grep -qx 4 &&
  grep -qx 'import flash_varlen_attention, step_profile  # offline: .*' '$out3/train_gpt.py' &&
  grep -qx '    profiled = step_profile.start(step, (10, 430, 860,))  # offline: --profile_steps' '$out3/train_gpt.py' &&
  grep -A1 -x '    model.quantize_mlp_fp8(bootstrap_down=(step < 16))' '$out3/train_gpt.py' |
    grep -qx '    step_profile.stop(step, profiled)  # offline: --profile_steps' &&
  cmp dev/pylib/step_profile.py '$out3/step_profile.py' && cmp dev/pylib/kernel_kinds.py '$out3/kernel_kinds.py'"
holds "kernel_kinds: a recording's kernels by kind, longest first" "$PY" -c "
import sys; sys.path.insert(0, 'dev/pylib')
import kernel_kinds as k
class E:
    def __init__(s, key, us, device): s.key, s.self_cuda_time_total, s.device_type, s.count = key, us, device, 1
class Recording:
    def key_averages(s):
        return [E('triton_poi_fused_mul_0', 30.0, 'gpu'), E('nvjet_tst_128x256', 500.0, 'gpu'),
                E('aten::mm', 900.0, 'cpu'), E('flash_fwd_kernel', 200.0, 'gpu'), E('sm90_xmma_gemm', 100.0, 'gpu'),
                E('void pytorch_flash::flash_bwd_kernel<Flash_kernel_traits<cutlass::bfloat16_t> >', 50.0, 'gpu'),
                E('linear_relu_square_kernel', 40.0, 'gpu'), E('ce_fwd_bwd_kernel', 20.0, 'gpu'),
                E('_dc_postonly_corr_fwd_kernel', 10.0, 'gpu')]
events, total = k.gpu_kernels(Recording(), 'gpu')
assert [e.key[:18] for e in events] == ['nvjet_tst_128x256', 'flash_fwd_kernel', 'sm90_xmma_gemm', 'void pytorch_flash',
                                        'linear_relu_square', 'triton_poi_fused_m', 'ce_fwd_bwd_kernel',
                                        '_dc_postonly_corr_'], events
assert total == 950.0, total
by_kind = k.time_by_kind(events)
assert list(by_kind.items()) == [('matmul', 640.0), ('attention', 260.0),
                                 ('other fused elementwise and reductions (Triton)', 30.0), ('cross-entropy', 20.0)], by_kind
"
# step_profile against a stand-in torch (its profiler, CUDA's synchronize, the device type): a step not
# named records nothing; a named one's table in logs/ (total, kinds, kernels); a profiler that fails to
# start, or to stop, is one printed line and the run goes on.
mkdir -p "$WORK/torchstub/torch"
cat > "$WORK/torchstub/torch/__init__.py" <<'EOF'
import types
cuda = types.SimpleNamespace(synchronize=lambda: None)
autograd = types.SimpleNamespace(DeviceType=types.SimpleNamespace(CUDA="gpu"))
EOF
cat > "$WORK/torchstub/torch/profiler.py" <<'EOF'
import os
ProfilerActivity = type("ProfilerActivity", (), {"CUDA": "cuda"})
class E:
    def __init__(s, key, us): s.key, s.self_cuda_time_total, s.device_type, s.count = key, us, "gpu", 2
class profile:
    def __init__(s, activities): s.fail = os.environ.get("STUB_PROFILER_FAILS", "")
    def start(s):
        if s.fail == "start": raise RuntimeError("no CUPTI")
    def stop(s):
        if s.fail == "stop": raise RuntimeError("lost events")
    def key_averages(s): return [E("nvjet_tst", 1500.0), E("flash_fwd", 500.0)]
EOF
holds "step_profile: a named step's table, other steps untouched, a failing profiler reported" bash -c "
  cd '$WORK' && rm -rf logs && export PYTHONPATH='$WORK/torchstub:$PWD/dev/pylib'
  '$PY' -c 'import step_profile as p; assert p.start(3, (10,)) is None; p.stop(10, p.start(10, (10,)))' &&
  [ \"\$(head -1 logs/profile_step000010.txt)\" = 'step 10: GPU kernel time 2.00 ms' ] &&
  grep -q '^  matmul  *1.50 ms   75.0%$' logs/profile_step000010.txt &&
  grep -q '^    0.500      2  flash_fwd$' logs/profile_step000010.txt && [ \$(ls logs | wc -l) = 1 ] &&
  STUB_PROFILER_FAILS=start '$PY' -c 'import step_profile as p; p.stop(5, p.start(5, (5,)))' |
    grep -qx 'step_profile: step 5 not recorded: no CUPTI' &&
  STUB_PROFILER_FAILS=stop '$PY' -c 'import step_profile as p; p.stop(6, p.start(6, (6,)))' |
    grep -qx \"step_profile: step 6's table not written: lost events\" && [ ! -e logs/profile_step000006.txt ]"
out4=$WORK/offline4
holds "the copy made with --init_check" kit "$out4" --init_check
holds "--init_check: statistics after the set-up, no warm-up, a stop before training, its module beside" bash -c "
  diff '$ref/train_gpt.py' '$out4/train_gpt.py' | grep -c '^>' | grep -qx 5 &&
  grep -qx 'import flash_varlen_attention, init_stats  # offline: .*' '$out4/train_gpt.py' &&
  grep -A1 -x 'dist.broadcast(model.bigram_sign_table, 0)  # buffer, not in parameters()' '$out4/train_gpt.py' |
    grep -qx 'init_stats.report(model, print0)  # offline: --init_check' &&
  grep -qx 'for step in \[\]:  # offline: --init_check, no warm-up' '$out4/train_gpt.py' &&
  grep -B1 -x '    # --------------- TRAINING SECTION -----------------' '$out4/train_gpt.py' |
    grep -qx '    break  # offline: --init_check, the step-0 validation alone' &&
  cmp dev/pylib/init_stats.py '$out4/init_stats.py' && [ ! -e '$out/init_stats.py' ]"
echo "state" > "$WORK/state.pt"
out5=$WORK/offline5
holds "the copy made with --init_from and --init_check" kit "$out5" --init_from "$WORK/state.pt" --init_check
holds "--init_from: the state loaded after the set-up, then the statistics" bash -c "
  diff '$out4/train_gpt.py' '$out5/train_gpt.py' | grep -c '^>' | grep -qx 1 &&
  grep -A2 -x 'dist.broadcast(model.bigram_sign_table, 0)  # buffer, not in parameters()' '$out5/train_gpt.py' | tail -2 |
    tr '\n' '|' | grep -qx \"model.load_state_dict(torch.load('$WORK/state.pt', map_location=device), strict=True)  # offline: --init_from|init_stats.report(model, print0)  # offline: --init_check|\""
out6=$WORK/offline6
holds "the copy made with --first_steps" kit "$out6" --first_steps 30
holds "--first_steps: no warm-up, the loss summed and printed a step, a stop after 30 steps" bash -c "
  diff '$ref/train_gpt.py' '$out6/train_gpt.py' | grep -c '^>' | grep -qx 7 &&
  grep -qx 'for step in \[\]:  # offline: --first_steps, no warm-up' '$out6/train_gpt.py' &&
  grep -B1 -x '    # --------------- TRAINING SECTION -----------------' '$out6/train_gpt.py' |
    grep -qx '    train_loss_sum = 0.0  # offline: --first_steps' &&
  grep -B1 -x '        del loss' '$out6/train_gpt.py' | grep -qx '        train_loss_sum += loss.detach()  # offline: --first_steps' &&
  grep -A2 -x '    model.quantize_mlp_fp8(bootstrap_down=(step < 16))' '$out6/train_gpt.py' | tail -2 | tr '\n' '|' |
    grep -qx '    print0(f\"step:{step}/{train_steps} train_loss:{train_loss_sum.item() \* grad_accum_steps \* world_size / training_manager.batch_size:.6f}\", console=True)  # offline: --first_steps|    if step + 1 == 30: break  # offline: --first_steps|'"
out7=$WORK/offline7
mkdir -p "$WORK/states"
holds "the copy made with --first_steps and --save_state" kit "$out7" --first_steps 30 --save_state "$WORK/states"
holds "--save_state: rank 0 saves the model's state dict on the CPU after each step, one line more" bash -c "
  diff '$out6/train_gpt.py' '$out7/train_gpt.py' | grep -c '^>' | grep -qx 1 &&
  grep -A1 -x \"    master_process and torch.save({k: v.detach().cpu() for k, v in model._orig_mod.state_dict().items()}, os.path.join('$WORK/states', f'step{step + 1}.pt'))  # offline: --save_state\" '$out7/train_gpt.py' |
    tail -1 | grep -qx '    if step + 1 == 30: break  # offline: --first_steps'"
TORCH_PY=$(python_with torch)
if [ -n "$TORCH_PY" ]; then
  holds "init_stats: a line a parameter and the sign table, through print0" bash -c "
    PYTHONPATH=dev/pylib '$TORCH_PY' -c '
import torch, init_stats
class M(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.w = torch.nn.Parameter(torch.tensor([[1.0, -3.0], [0.0, 0.0]]))
        s.register_buffer(\"bigram_sign_table\", torch.tensor([1.0, -1.0], dtype=torch.bfloat16))
        s.register_buffer(\"other\", torch.ones(3))
init_stats.report(M(), lambda s, console=False: print(s, console))
' > '$WORK/stats.txt' &&
    [ \$(wc -l < '$WORK/stats.txt') = 2 ] &&
    grep -qx 'init w 2x2 float32 mean -5.000000e-01 std 1.732051e+00 max 3.000000e+00 zeros 0.500000 True' '$WORK/stats.txt' &&
    grep -qx 'init bigram_sign_table 2 bfloat16 mean 0.000000e+00 std 1.414214e+00 max 1.000000e+00 zeros 0.000000 True' '$WORK/stats.txt'"
else
  echo "skip init_stats: no python with torch (apt-get install python3-torch)"
fi
out2=$WORK/offline2
holds "the copy made with three passes" kit "$out2" --passes 3
holds "the training shards linked three times over, in order" bash -c "
  d='$out2/data/fineweb10B'
  once='sp_train_000001.bin sp_train_000002.bin sp_train_000010.bin '
  for i in 1 2 3 4 5 6 7 8 9; do readlink \$d/fineweb_train_00000\$i.bin; done | xargs -n1 basename |
    tr '\n' ' ' | grep -qx \"\$once\$once\$once\" &&
  [ \$(ls \$d | wc -l) = 10 ]"
holds "the GPT-2 cache under tiktoken's names" bash -c "
  base=https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/
  cmp dev/data/gpt2/vocab.bpe '$out/tiktoken/'\$(printf %s \${base}vocab.bpe | sha1sum | cut -c1-40) &&
  cmp dev/data/gpt2/encoder.json '$out/tiktoken/'\$(printf %s \${base}encoder.json | sha1sum | cut -c1-40)"
holds "run.sh" bash -c "grep -q 'DATA_PATH=\$PWD TIKTOKEN_CACHE_DIR=\$PWD/tiktoken exec' '$out/run.sh'"

expect_fail "a folder in use" "$out is not empty: give a new folder" kit "$out"
# another_version NAME FILE SED NEW TEXT: the kit on a copy of the reference whose FILE sed SED edits
# fails, naming TEXT, and makes no NEW folder.
another_version() {
  local name=$1 file=$2 edit=$3 new=$4 text=$5
  local copy=$WORK/other_$file
  cp -r "$ref" "$copy" && sed "$edit" "$ref/$file" > "$copy/$file"
  expect_fail "$name" "$text" "$PY" dev/reference89_offline.py "$WORK/$new" --reference "$copy" \
    --train "$WORK/shards/sp_train_*.bin" --val "$WORK/shards/sp_val_*.bin"
}
another_version "another version of the script" train_gpt.py 's/from kernels import get_kernel/from kernels import load_kernel/' \
  new1 "expected the line 'from kernels import get_kernel' once .*found it 0 times"
another_version "another version of the kernels" triton_kernels.py 's/x3 = torch._scaled_mm(/x3 = torch.mm(/' new7 \
  "triton_kernels.py: expected the line 'x3 = torch._scaled_mm(' once (record #89's triton_kernels.py at modded-nanogpt f411b3d3), found it 0 times"
expect_fail "validation tokens off the batch" \
  "--val_tokens 1048576: must be a positive multiple of the reference's validation batch, 2,097,152 tokens" \
  kit "$WORK/new4" --val_tokens 1048576
expect_fail "no pass" "--passes 0: give a whole number of at least 1 .* or auto" kit "$WORK/new5" --passes 0
expect_fail "a step past the run" "--profile_steps 10,1285: give training steps from 0 to 1284" \
  kit "$WORK/new8" --profile_steps 10,1285
expect_fail "a step that is not a number" "--profile_steps 10,x: give training steps" kit "$WORK/new9" --profile_steps 10,x
expect_fail "--init_check with --profile_steps" "--init_check stops before the first training step: give it or --profile_steps, not both" \
  kit "$WORK/new10" --init_check --profile_steps 10
expect_fail "--init_from a missing file" "--init_from $WORK/none.pt: no such file; give a state dict that dev/record89_state.py wrote" \
  kit "$WORK/new11" --init_from "$WORK/none.pt"
expect_fail "--first_steps 0" "--first_steps 0: give the training steps to run, 1 to 1285" kit "$WORK/new12" --first_steps 0
expect_fail "--first_steps with --init_check" "--init_check stops before the first training step: give it or --first_steps, not both" \
  kit "$WORK/new13" --first_steps 5 --init_check
expect_fail "--first_steps with --profile_steps" "--first_steps prints the steps that --profile_steps records" \
  kit "$WORK/new14" --first_steps 5 --profile_steps 3
expect_fail "--save_state without --first_steps" \
  "--save_state $WORK/states: the states after --first_steps' steps; give --first_steps N too" \
  kit "$WORK/new15" --save_state "$WORK/states"
expect_fail "--save_state a missing folder" "--save_state $WORK/none: no such folder; make it first or give another" \
  kit "$WORK/new16" --first_steps 2 --save_state "$WORK/none"
expect_fail "passes not a number" "--passes two: give a whole number" kit "$WORK/new5" --passes two
expect_fail "no shard" "--val '$WORK/shards/none_\*.bin': no file matches" \
  "$PY" dev/reference89_offline.py "$WORK/new2" --reference "$ref" \
  --train "$WORK/shards/sp_train_*.bin" --val "$WORK/shards/none_*.bin"
mkdir -p "$WORK/not_gpt2" && echo "{}" > "$WORK/not_gpt2/encoder.json" && cp dev/data/gpt2/vocab.bpe "$WORK/not_gpt2/"
expect_fail "files that are not GPT-2's" "--gpt2 $WORK/not_gpt2: tiktoken's GPT-2 cache not filled .*hash mismatch" \
  kit "$WORK/new3" --gpt2 "$WORK/not_gpt2"
# --passes auto on shards of documents of 1,000 tokens, two shards of 3,500: a pass gives 6,272,000
# tokens at the cap 896 and 7,000,000 at 2,048, so stage 1's 55,443,456 take 8.84 passes and the
# rest's 283,377,664 40.48: 50 passes, and one more.
NUMPY_PY=$(python_with numpy)
if [ -n "$NUMPY_PY" ]; then
  "$NUMPY_PY" - "$WORK/docs" <<'EOF'
import os, sys
import numpy as np
folder = sys.argv[1]
os.makedirs(folder)
def shard(name, tokens):
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, tokens.size)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(header.tobytes() + tokens.tobytes())
for i in range(2):
    tokens = np.full(3500 * 1000, 7, dtype=np.uint16)
    tokens[::1000] = 50256
    shard(f"docs_train_{i:06d}.bin", tokens)
shard("none_train_000000.bin", np.full(1000, 7, dtype=np.uint16))
EOF
  auto() { "$NUMPY_PY" dev/reference89_offline.py "$@" --reference "$ref" --val "$WORK/shards/sp_val_*.bin"; }
  holds "--passes auto made" auto "$WORK/auto" --train "$WORK/docs/docs_train_*.bin" --passes auto
  check "--passes auto: 51 passes of the two shards" "$(ls "$WORK/auto/data/fineweb10B" | grep -c train)" 102
  expect_fail "--passes auto on a shard without a document" "--train: .*none_train_000000.bin holds no document" \
    auto "$WORK/new6" --train "$WORK/docs/none_train_*.bin" --passes auto
else
  echo "skip --passes auto: no python with numpy (apt-get install python3-numpy)"
fi
holds "no folder left by the failures" bash -c "
  [ ! -e '$WORK/new1' ] && [ ! -e '$WORK/new2' ] && [ ! -e '$WORK/new3' ] && [ ! -e '$WORK/new4' ] && [ ! -e '$WORK/new5' ] && [ ! -e '$WORK/new6' ] &&
  [ ! -e '$WORK/new7' ] && [ ! -e '$WORK/new8' ] && [ ! -e '$WORK/new9' ] && [ ! -e '$WORK/new10' ] && [ ! -e '$WORK/new11' ] &&
  [ ! -e '$WORK/new12' ] && [ ! -e '$WORK/new13' ] && [ ! -e '$WORK/new14' ]"
finish test_reference89_offline
