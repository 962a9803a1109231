# Shared by scripts/run_tests.sh and scripts/multi_gpu_tests.sh (source it): RECORD89_TEST, the
# flags of -recipe record89 at a test size on tiny shakespeare, for 20 steps (-x 20 given with it):
# its MUDD dense connections and composed attention, NorMuon, cautious decay, AdamW every 2nd step,
# Muon's and AdamW's rates by tensor, over its stage plan in 6 steps a stage (t=512 then 1024, caps
# 256 and 512, windows in tokens) and 2 extension steps, the untie at step 13 (the first odd step of
# stage 3). A step takes 2 sequences: one each on 2 processes.
RECORD89_TEST_PLAN="1/3 t=512 z=1024 cap=256 aw=1/2 lr=1 mtp=1,0.5,0.25>1,0.5,0 pw=0.25; 1/3 t=1024 z=2048"
RECORD89_TEST_PLAN+=" cap=512 aw=2/4 lr=1.52 mtp=1,0.5>1,0 pw=0.25>0; 1/3 t=1024 z=2048 aw=3/6 lr=1.73 mtp=1 pw=0; +2 aw=4/8"
RECORD89_TEST=(-recipe record89 -b 1 -t 1024 -z 2048 -vt 1024 -awf 8 -ut 13 -mc 5
  -tk dev/data/tinyshakespeare/gpt2_tokenizer.bin -sp "$RECORD89_TEST_PLAN")
