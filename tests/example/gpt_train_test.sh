#!/usr/bin/env bash
# Tests of examples/04_gpt_train on the CPU under mpirun (ctest: gpt_train_*):
#   layouts     tp 2 x dp 2 (+sp, ZeRO-1, ZeRO-2), tp 2 (+sp), dp 3 ZeRO-2 and one rank, same seed and global batch:
#               the same loss at each of 30 steps within 1e-4 relative; cp 2 x tp 2 (+sp, ring) and
#               cp 2 x dp 2 (ulysses, ZeRO-1) too, reporting cp_comm_ms; --recompute full the same
#               losses bit for bit; --tp-overlap (chunked tp communication) at tp 2 x dp 2, with
#               and without sp, the same losses bit for bit
#   pipeline    pp 2 under every schedule, pp 4, pp 3 (interleaved), pp 2 with tp 2 (+sp), dp 2
#               (ZeRO-1, ZeRO-2), pp 2 x tp 2 x dp 2 at 8 ranks, and tied embeddings across stages:
#               the one-rank loss at each of 20 steps within 1e-4 relative; a pp 2 run stopped,
#               saved and resumed equals the uninterrupted one
#   resume      a run stopped and saved at step 10, then resumed, equals the uninterrupted run at
#               steps 11..20; asynchronous saves (--async-save) write byte-identical checkpoints,
#               and one that fails to write fails the next step on every rank; --keep-last 2
#               leaves the newest two checkpoints (synchronous and background saves)
#   families    a Llama-style model (--arch llama, GQA 2 of 4 heads) at tp 2 (+sp), pp 2, dp 2
#               (ZeRO-1), cp 2 (ring and Ulysses) and tp 4 + sp (key/value heads replicated), MQA
#               (1 key/value head) at tp 2 + sp and tp 2 x cp 2 (Ulysses), and a Qwen3-style one
#               (QK-norm) at tp 2: the one-rank loss at each of 20 steps within 1e-4 relative;
#               an MQA checkpoint saved at tp 2 resumed at one rank and tp 4 likewise; RoPE at
#               cp 2 (ring) without GQA too; a checkpoint of another family's settings is refused
#   combined    a Llama-style model (4 layers) at tp 2 + sp x pp 2 x vpp 2 (interleaved) x dp 2
#               (ZeRO-1) on 8 ranks, and at tp 2 x cp 2 x pp 2 x dp 2 on 16, with GQA 2 of 4
#               heads: the one-rank loss at each of 20 steps within 1e-4 relative
#   bad_flags   inconsistent flags are refused with a message naming them (a setting given while
#               the one it qualifies is off too, in a job file as well), ranks started with
#               different flags too; --lr-schedule wsd gives the library schedule's rates; a job
#               file (--config) trains as its flags do, and the flags beside it override it
#   trace       --trace writes valid per-rank traces (tp 2 x dp 2, pp 2 x dp 2) whose ranges lie in
#               their steps, the per-kind communication figures add up, a straggler is named,
#               tracing leaves the losses unchanged; merge_traces.py and plot_timeline.py run
#   reshard     a tp 2 x dp 2 (ZeRO-1) checkpoint resumed at dp 4 (micro-batch 1), tp 4, one rank,
#               dp 3 (ZeRO-2), pp 2 x dp 2, tp 2 + sp x dp 2 (ZeRO-2), cp 2 x dp 2, and (4 layers)
#               pp 2 x vpp 2 and pp 4 continues the uninterrupted run within 1e-5; truncated,
#               corrupt and other-model checkpoints are refused, naming them; 12_checkpoint_tool
#               lists and verifies it
#   val         --val-data: the same val_loss (within 1e-5) at one rank, tp 2 (+sp), pp 2 x vpp 2,
#               cp 2 and dp 2 (ZeRO-1), over every window of the data once (the remainder of a
#               global batch left out) or --val-batches of them; evaluating leaves the training
#               losses unchanged bit for bit; --eval-only after --resume (at two layouts) prints
#               the val_loss the run printed at that step and leaves the checkpoint directory
#               byte for byte; --eval-only after --init-from-hf gives the NumPy reference's loss;
#               a --data checkpoint resumes whatever Markov order it recorded, not on other data
#               of a tiny Llama (1 rank, tp 2 + sp); bad settings refused, naming them
#   killed      a save killed midway (--exit-during-save, and SIGKILL at each point of a save:
#               mid-shard, before the commit, after the metadata, after the rename) is never
#               loaded: resuming starts from the previous checkpoint and continues the
#               uninterrupted run's losses; a save past a file-size limit fails on every rank
#   bound_by    the bound-by verdict (every JSON record and the summary: check_bound_by.py) adds
#               up to the step time within 2% at tp 2 x dp 2, with exposed tp and dp parts; a run
#               whose one loader thread reads each batch 40 ms late (--loader-delay-ms) is
#               input-bound, in the JSON summary and the text run's last line; a negative delay
#               is refused
#   fp8         --fp8 hybrid (current and delayed scaling): tp 2 + sp x pp 2 and tp 2 x pp 2 give
#               the one-rank losses at each of 20 steps within 1e-4, step 1's gradient norm
#               within 5e-4 (f32's is 1e-3 away), tp 2 x dp 2 (ZeRO-1) dp 2's; FP8's losses
#               within 3% of f32's; --fp8-lm-head (untied; tied, across pp 2 too) at tp 2
#               (+ sp) x pp 2 gives its one-rank losses (steps 1-2 within 1e-6, 1-20 within
#               5e-4) and step 1's norm, which is not the blocks-only FP8's; resuming delayed scaling continues bit for bit (at another layout within
#               1e-4), another history length refused; bad FP8 flags refused
#   gpu_fp8     one GPU (skipped without one): --fp8 hybrid in bf16 through cuBLASLt's FP8 GEMMs,
#               current and delayed scaling, 20 steps each follow the CPU's FP8 emulation within
#               1e-2 and the GPU run's own loss falls by at least half the CPU run's fall
# Usage: gpt_train_test.sh TRAINER MPIEXEC WORKDIR CASE [mpirun flags...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/trainer_test_common.sh" "$@"
model=(--device cpu --layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2
       --global-batch 12 --lr 3e-3 --warmup 5 --data-dir "$work/data" --json --no-progress)

case $case in
  layouts)
    run one 1 --steps 30
    run tp2_dp2 4 --steps 30 --tp 2 --dp 2 --check-batches
    run tp2_dp2_sp 4 --steps 30 --tp 2 --dp 2 --sp
    run tp2_dp2_zero1 4 --steps 30 --tp 2 --dp 2 --zero 1
    run tp2 2 --steps 30 --tp 2
    run tp2_sp 2 --steps 30 --tp 2 --sp
    run dp3_zero2 3 --steps 30 --dp 3 --zero 2
    run tp2_dp2_sp_zero2 4 --steps 30 --tp 2 --dp 2 --sp --zero 2 --bucket-mb 0.01
    for r in tp2_dp2 tp2_dp2_sp tp2_dp2_zero1 tp2 dp3_zero2 tp2_dp2_sp_zero2; do
      compare one $r 1 30 1e-4
    done
    compare tp2 tp2_sp 1 30 1e-4
    compare tp2_dp2 tp2_dp2_zero1 1 30 1e-4
    # Context parallelism: each sequence split over 2 ranks (ring with tp + sp, all-to-all with dp).
    run cp2_tp2_sp 4 --steps 30 --cp 2 --tp 2 --sp
    run cp2_dp2_ulysses 4 --steps 30 --cp 2 --dp 2 --cp-kind ulysses --zero 1
    compare one cp2_tp2_sp 1 30 1e-4
    compare one cp2_dp2_ulysses 1 30 1e-4
    python3 -c "import json,sys; r=[json.loads(l) for l in open('cp2_dp2_ulysses.jsonl') if '\"step\"' in l]; sys.exit(0 if all('cp_comm_ms' in x for x in r) and any(x['cp_comm_ms'] > 0 for x in r) else 'no cp_comm_ms in the JSON records')"
    # tp overlap chunks change when the tp communication runs, not its values: at tp 2 every sum
    # has two terms (one order), so the losses are the same bit for bit, with and without sp.
    run tp2_dp2_overlap 4 --steps 30 --tp 2 --dp 2 --tp-overlap --tp-overlap-chunks 4
    run tp2_dp2_sp_overlap 4 --steps 30 --tp 2 --dp 2 --sp --tp-overlap
    compare tp2_dp2 tp2_dp2_overlap 1 30 0
    compare tp2_dp2_sp tp2_dp2_sp_overlap 1 30 0
    for r in tp2_dp2 tp2_dp2_sp; do  # the chunks are separate collectives: more tp ops per step
      python3 -c "import json,sys; n=lambda f: [json.loads(l)['tp_ops'] for l in open(f) if '\"step\"' in l][-1]; sys.exit(0 if n('${r}_overlap.jsonl') > n('$r.jsonl') > 0 else 'tp_ops: %d with --tp-overlap, %d without' % (n('${r}_overlap.jsonl'), n('$r.jsonl')))"
    done
    # Activation recompute changes memory, not results: the same losses, bit for bit.
    run tp2_dp2_sp_recompute 4 --steps 30 --tp 2 --dp 2 --sp --recompute full
    compare tp2_dp2_sp tp2_dp2_sp_recompute 1 30 0
    ;;
  pipeline)
    deep=(--layers 4)
    run one 1 --steps 20 "${deep[@]}"
    run one_tied 1 --steps 20 "${deep[@]}" --tied-embeddings
    run pp2_1f1b 2 --steps 20 "${deep[@]}" --pp 2
    run pp2_gpipe 2 --steps 20 "${deep[@]}" --pp 2 --schedule gpipe
    run pp2_zbh1 2 --steps 20 "${deep[@]}" --pp 2 --schedule zb-h1
    run pp2_interleaved 2 --steps 20 "${deep[@]}" --pp 2 --vpp 2 --schedule interleaved
    run pp2_zbv_tied 2 --steps 20 "${deep[@]}" --pp 2 --vpp 2 --schedule zb-v --tied-embeddings
    run pp4_zbh1_tied 4 --steps 20 "${deep[@]}" --pp 4 --schedule zb-h1 --tied-embeddings
    run pp2_tp2_sp 4 --steps 20 "${deep[@]}" --pp 2 --tp 2 --sp
    run pp2_tp2_sp_overlap 4 --steps 20 "${deep[@]}" --pp 2 --tp 2 --sp --tp-overlap
    compare pp2_tp2_sp pp2_tp2_sp_overlap 1 20 0
    run pp2_dp2_zero1 4 --steps 20 "${deep[@]}" --pp 2 --dp 2 --zero 1
    run pp2_dp2_zero2_tied 4 --steps 20 "${deep[@]}" --pp 2 --dp 2 --zero 2 --tied-embeddings
    run pp2_tp2_dp2 8 --steps 20 "${deep[@]}" --pp 2 --tp 2 --dp 2 --sp --zero 1 --vpp 2 \
      --schedule zb-v
    for r in pp2_1f1b pp2_gpipe pp2_zbh1 pp2_interleaved pp2_tp2_sp pp2_dp2_zero1 pp2_tp2_dp2; do
      compare one $r 1 20 1e-4
    done
    for r in pp2_zbv_tied pp4_zbh1_tied pp2_dp2_zero2_tied; do compare one_tied $r 1 20 1e-4; done
    # Recompute under a zero-bubble schedule (deferred weight gradients): bit for bit.
    run pp2_zbh1_recompute 2 --steps 20 "${deep[@]}" --pp 2 --schedule zb-h1 --recompute attention
    compare pp2_zbh1 pp2_zbh1_recompute 1 20 0
    # An odd pipeline: 3 stages of 2 chunks.
    run one6 1 --steps 20 --layers 6
    run pp3_interleaved 3 --steps 20 --layers 6 --pp 3 --vpp 2 --schedule interleaved
    compare one6 pp3_interleaved 1 20 1e-4
    # Stopped and resumed: every stage's parameters and optimizer state come back.
    run pp_first_half 2 --steps 20 "${deep[@]}" --pp 2 --vpp 2 --schedule zb-v --tied-embeddings \
      --save ckpt --stop-at 10
    run pp_second_half 2 --steps 20 "${deep[@]}" --pp 2 --vpp 2 --schedule zb-v --tied-embeddings \
      --resume ckpt
    compare pp2_zbv_tied pp_first_half 1 10 1e-6
    compare pp2_zbv_tied pp_second_half 11 20 1e-6
    ;;
  resume)
    run full 4 --steps 20 --tp 2 --dp 2 --zero 1
    run first_half 4 --steps 20 --tp 2 --dp 2 --zero 1 --save ckpt --stop-at 10
    test -f ckpt/step_000010/checkpoint.json
    run second_half 4 --steps 20 --tp 2 --dp 2 --zero 1 --resume ckpt
    compare full first_half 1 10 1e-6
    compare full second_half 11 20 1e-6
    # Asynchronous saves write byte-identical checkpoints and leave the losses unchanged.
    run sync_saves 4 --steps 12 --tp 2 --dp 2 --zero 1 --save ck_sync --save-every 4
    run async_saves 4 --steps 12 --tp 2 --dp 2 --zero 1 --save ck_async --save-every 4 \
      --async-save
    compare sync_saves async_saves 1 12 0
    for s in 000004 000008 000012; do
      for f in ck_sync/step_$s/*; do cmp "$f" "ck_async/step_$s/$(basename "$f")"; done
    done
    test "$(cat ck_async/latest)" = step_000012
    grep -q '"saved_step":8' async_saves.jsonl
    # --keep-last 2: only the newest two checkpoints stay, with synchronous and background saves.
    for how in sync async; do
      extra=(); [[ $how == async ]] && extra=(--async-save)
      run "keep_$how" 2 --steps 8 --dp 2 --save "ck_keep_$how" --save-every 2 --keep-last 2 \
        "${extra[@]}"
      test "$(ls -d ck_keep_$how/step_* | xargs -n1 basename | tr '\n' ' ')" = \
        "step_000006 step_000008 " || { ls "ck_keep_$how"; exit 1; }
      test "$(cat ck_keep_$how/latest)" = step_000008
    done
    # A background write that fails (file-size limit) fails the next step on every rank.
    if timeout 120 "$mpiexec" "${mpi_flags[@]}" -np 2 bash -c 'ulimit -f 256; exec "$0" "$@"' \
         "$trainer" "${model[@]}" --steps 12 --tp 2 --save ck_async_full --save-every 4 \
         --async-save >async_full.jsonl 2>async_full.err; then
      echo "a background save past the file-size limit should fail the run"; exit 1
    fi
    # (Each rank's own error line, as the trainer prints it.)
    test "$(grep -c '^04_gpt_train: checkpoint: cannot write .*rank_0000[01].qckpt: File too large' \
            async_full.err)" -eq 2 ||
      { cat async_full.err; exit 1; }
    test ! -e ck_async_full/latest
    # It surfaces at the first step that finds the write ended, at the latest at the next save.
    python3 -c "import json,sys; s=[json.loads(l)['step'] for l in open('async_full.jsonl') if '\"loss\"' in l]; sys.exit(0 if 4 <= s[-1] <= 8 else f'ran to step {s[-1]}: the failed save of step 4 should stop it by step 8')"
    # A resume with another global batch is refused, naming the field (another layout is not:
    # see reshard).
    if run wrong_batch 4 --steps 20 --tp 2 --dp 2 --global-batch 8 --resume ckpt 2>wrong.err; then
      echo "resuming with another global batch should fail"; exit 1
    fi
    grep -q "with global_batch = 12, this run has global_batch = 8" wrong.err
    ;;
  reshard)
    # A checkpoint saved at tp 2 x dp 2 (ZeRO-1) at step 6 resumes at other layouts: dp 4, tp 4,
    # one rank, dp 3 (odd), pp 2 x dp 2, tp 2 + sp x dp 2 under ZeRO-2; steps 7..12 equal the
    # uninterrupted run's within 1e-5 relative. Then the faults: a truncated shard, a flipped
    # byte and another model configuration are refused with messages naming them.
    root=$(cd "$here/../.." && pwd)
    tool="$(dirname "$trainer")/../12_checkpoint_tool/12_checkpoint_tool"
    run full 4 --steps 12 --tp 2 --dp 2 --zero 1
    run first 4 --steps 12 --tp 2 --dp 2 --zero 1 --save ckpt --stop-at 6
    compare full first 1 6 0
    "$tool" ckpt --verify >tool.out
    grep -q "verified: 4 shards" tool.out
    grep -q "layout:   tp=2;cp=1;pp=1;dp=2" tool.out
    resume_at() {  # resume_at NAME RANKS FLAGS...: resumes a copy of ckpt, compares 7..12
      local name=$1 ranks=$2
      shift 2
      rm -rf "ck_$name" && cp -r ckpt "ck_$name"
      run "$name" "$ranks" --steps 12 --resume "ck_$name" "$@"
      compare full "$name" 7 12 1e-5
    }
    resume_at dp4_micro1 4 --dp 4 --zero 1 --micro-batch 1
    resume_at tp4 4 --tp 4
    resume_at one 1
    resume_at dp3 3 --dp 3 --zero 2
    resume_at pp2_dp2 4 --pp 2 --dp 2
    resume_at tp2_sp_dp2_zero2 4 --tp 2 --sp --dp 2 --zero 2
    resume_at cp2_dp2 4 --cp 2 --dp 2
    # Four layers, to resume interleaved (pp 2 x vpp 2) and at pp 4 from tp 2 x dp 2 (ZeRO-1).
    run full4 4 --steps 12 --tp 2 --dp 2 --zero 1 --layers 4
    run first4 4 --steps 12 --tp 2 --dp 2 --zero 1 --layers 4 --save ckpt4 --stop-at 6
    for layout in "pp2_vpp2 2 --pp 2 --vpp 2 --schedule interleaved" "pp4 4 --pp 4"; do
      # shellcheck disable=SC2086
      set -- $layout
      rm -rf "ck_$1" && cp -r ckpt4 "ck_$1"
      run "$1" "$2" --steps 12 --layers 4 --resume "ck_$1" "${@:3}"
      compare full4 "$1" 7 12 1e-5
    done
    # Faults: each refused on every rank, naming the file or the field.
    rm -rf ck_bad && cp -r ckpt ck_bad
    truncate -s -64 ck_bad/step_000006/rank_00001.qckpt
    if run truncated 2 --steps 12 --dp 2 --resume ck_bad 2>bad.err; then
      echo "a truncated shard should be refused"; exit 1
    fi
    grep -q "rank_00001.qckpt" bad.err || { cat bad.err; exit 1; }
    rm -rf ck_bad && cp -r ckpt ck_bad
    python3 - ck_bad/step_000006/rank_00000.qckpt <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x40
open(p, "wb").write(bytes(b))
PY
    if run flipped 2 --steps 12 --dp 2 --resume ck_bad 2>bad.err; then
      echo "a flipped byte should be refused"; exit 1
    fi
    grep -q "rank_00000.qckpt.*XXH64" bad.err || { cat bad.err; exit 1; }
    if "$tool" ck_bad --verify >/dev/null 2>bad.err; then echo "verify should fail"; exit 1; fi
    grep -q "rank_00000.qckpt" bad.err
    rm -rf ck_bad && cp -r ckpt ck_bad
    if run other_model 2 --steps 12 --dp 2 --hidden 96 --heads 4 --resume ck_bad 2>bad.err; then
      echo "another model should be refused"; exit 1
    fi
    grep -q "with hidden = 64, this run has hidden = 96" bad.err || { cat bad.err; exit 1; }
    ;;
  killed)
    run full 2 --steps 20 --tp 2
    # The save of step 10 dies after the shards are written, before the commit.
    if run killed 2 --steps 20 --tp 2 --save ckpt --save-every 5 --exit-during-save 10; then
      echo "the run with --exit-during-save 10 should have failed"; exit 1
    fi
    test "$(cat ckpt/latest)" = step_000005
    test -d ckpt/.partial-step_000010
    run resumed 2 --steps 20 --tp 2 --save ckpt --save-every 5 --resume ckpt
    compare full resumed 6 20 1e-6
    python3 -c "import json,sys; s=[json.loads(l)['step'] for l in open('resumed.jsonl') if '\"step\"' in l]; sys.exit(0 if s[0]==6 else f'resumed at {s[0]}, expected 6')"
    test "$(cat ckpt/latest)" = step_000020
    # SIGKILL at each point of a save (QUINTET_CHECKPOINT_FAULT, checkpoint.hpp): `latest` still
    # names step 10, never the unfinished step 15, and resuming from it continues bit for bit.
    for point in shard:1 before_commit metadata rename; do
      rm -rf ck_fault && cp -r ckpt ck_fault
      echo step_000010 >ck_fault/latest && rm -rf ck_fault/step_0000{15,20}
      if QUINTET_CHECKPOINT_FAULT=$point run "fault_${point%%:*}" 2 --steps 20 --tp 2 \
           --save ck_fault --save-every 15 --resume ck_fault 2>fault.err; then
        echo "the save killed at $point should have failed the run"; exit 1
      fi
      grep -q "kills itself at '${point%%:*}'" fault.err || { cat fault.err; exit 1; }
      test "$(cat ck_fault/latest)" = step_000010
      run "after_${point%%:*}" 2 --steps 20 --tp 2 --resume ck_fault
      compare full "after_${point%%:*}" 11 20 0
    done
    # A write that fails (a file-size limit) is an error on every rank; latest stays step 10.
    rm -rf ck_full && cp -r ckpt ck_full
    echo step_000010 >ck_full/latest && rm -rf ck_full/step_0000{15,20}
    # The limit is set in each rank (mpirun's own shared-memory files would hit it in mpirun).
    if timeout 120 "$mpiexec" "${mpi_flags[@]}" -np 2 bash -c 'ulimit -f 256; exec "$0" "$@"' \
         "$trainer" "${model[@]}" --steps 20 --tp 2 --save ck_full --save-every 15 \
         --resume ck_full >disk_full.jsonl 2>full.err; then
      echo "a save past the file-size limit should fail"; exit 1
    fi
    # (Each rank's own error line, as the trainer prints it.)
    test "$(grep -c '^04_gpt_train: checkpoint: cannot write .*rank_0000[01].qckpt: File too large' \
            full.err)" -eq 2 ||
      { cat full.err; exit 1; }
    test "$(cat ck_full/latest)" = step_000010
    ;;
  trace)
    # --trace at tp 2 x dp 2 (ZeRO-1): valid traces with compute, dp, tp and ZeRO-gather ranges
    # inside their steps, the per-kind figures adding up and equal to the trace's waits, a
    # straggler record; the same losses as the untraced run, bit for bit. Then pp 2 x dp 2 (pp
    # transfers), merged and drawn.
    root=$(cd "$here/../.." && pwd)
    run plain 4 --steps 5 --tp 2 --dp 2 --zero 1
    run traced 4 --steps 5 --tp 2 --dp 2 --zero 1 --trace traces --trace-steps 3:4
    compare plain traced 1 5 0
    python3 "$here/check_trace.py" traces traced.jsonl 4 dp,tp,zero 3 4
    run pp_traced 4 --steps 4 --pp 2 --dp 2 --trace pp_traces
    python3 "$here/check_trace.py" pp_traces pp_traced.jsonl 4 dp,pp 2 4
    python3 "$root/scripts/merge_traces.py" traces -o merged.json
    python3 -c "import json; t=json.load(open('merged.json')); \
assert sorted({e['pid'] for e in t['traceEvents']}) == [0, 1, 2, 3], 'ranks'"
    python3 "$root/scripts/plot_timeline.py" merged.json -o timeline.png --step 3
    python3 -c "import sys; sys.exit(0 if open('timeline.png','rb').read(8) == b'\\x89PNG\\r\\n\\x1a\\n' else 'not a PNG')"
    # The text output: per-kind table and straggler line.
    text_model=()
    for a in "${model[@]}"; do [[ $a == --json ]] || text_model+=("$a"); done
    "$mpiexec" "${mpi_flags[@]}" -np 2 "$trainer" "${text_model[@]}" --steps 3 --tp 2 \
      --trace text_traces >text.out
    grep -q "communication per step (median ms)" text.out
    grep -q "^straggler: rank [01] arrived last at" text.out
    # Bad --trace flags are refused before training.
    for bad in "--trace-steps 3:4" "--trace t --trace-steps 4:3" "--trace t --trace-steps x" \
               "--trace t --trace-steps 0:2"; do
      # shellcheck disable=SC2086
      if run bad 1 --steps 2 $bad 2>bad.err; then echo "expected failure: $bad"; exit 1; fi
      grep -q -- "--trace-steps" bad.err || { cat bad.err; exit 1; }
    done
    ;;
  families)
    # Llama-style (--arch llama: RoPE, RMSNorm, SwiGLU, no biases) with grouped-query attention,
    # 2 key/value heads for 4 query heads, at tp 2 (+sp), pp 2 and dp 2 (ZeRO-1).
    llama=(--arch llama --kv-heads 2 --ffn-hidden 160)
    run llama_one 1 --steps 20 "${llama[@]}" --save ck_llama
    run llama_tp2_sp 2 --steps 20 "${llama[@]}" --tp 2 --sp
    run llama_pp2 2 --steps 20 "${llama[@]}" --pp 2
    run llama_dp2_zero1 2 --steps 20 "${llama[@]}" --dp 2 --zero 1
    for r in llama_tp2_sp llama_pp2 llama_dp2_zero1; do compare llama_one $r 1 20 1e-4; done
    # Grouped-query attention under cp 2, ring and Ulysses (the 2 key/value heads split over cp),
    # and with the key/value heads replicated over tp 4 (+sp: 2 key/value heads for 4 ranks).
    run llama_gqa_cp2 2 --steps 20 "${llama[@]}" --cp 2
    run llama_gqa_cp2_ulysses 2 --steps 20 "${llama[@]}" --cp 2 --cp-kind ulysses
    run llama_tp4_sp 4 --steps 20 "${llama[@]}" --tp 4 --sp
    for r in llama_gqa_cp2 llama_gqa_cp2_ulysses llama_tp4_sp; do compare llama_one $r 1 20 1e-4; done
    # One key/value head (MQA): replicated over tp 2 (+sp), and at tp 2 x cp 2 Ulysses also
    # repeated over cp. A checkpoint saved at tp 2 (the head's box written once) resumes at one
    # rank and at tp 4 (every replica filled), continuing the one-rank run.
    mqa=(--arch llama --kv-heads 1 --ffn-hidden 160)
    run mqa_one 1 --steps 20 "${mqa[@]}"
    run mqa_tp2_sp 2 --steps 20 "${mqa[@]}" --tp 2 --sp --save ck_mqa --stop-at 10
    run mqa_tp2_cp2 4 --steps 20 "${mqa[@]}" --tp 2 --cp 2 --cp-kind ulysses
    compare mqa_one mqa_tp2_sp 1 10 1e-4
    compare mqa_one mqa_tp2_cp2 1 20 1e-4
    # The gradient norm counts each replicated key/value head once (as one rank does).
    python3 - mqa_one mqa_tp2_sp llama_one llama_tp4_sp <<'EOF'
import json, sys
def norms(name):
    recs = [json.loads(l) for l in open(name + ".jsonl") if l.startswith("{") and '"step"' in l]
    return {r["step"]: r["grad_norm"] for r in recs if "grad_norm" in r}
for one, other in zip(sys.argv[1::2], sys.argv[2::2]):
    a, b = norms(one), norms(other)
    steps = sorted(set(a) & set(b))
    assert steps, f"no gradient norms to compare in {one} and {other}"
    for s in steps:
        assert abs(a[s] - b[s]) <= 1e-4 * abs(a[s]), f"{other} step {s}: grad_norm {b[s]} vs {a[s]}"
EOF
    for layout in "mqa_resume_one 1" "mqa_resume_tp4 4 --tp 4"; do
      # shellcheck disable=SC2086
      set -- $layout
      rm -rf "ck_$1" && cp -r ck_mqa "ck_$1"
      run "$1" "$2" --steps 20 "${mqa[@]}" --resume "ck_$1" "${@:3}"
      compare mqa_one "$1" 11 20 1e-4
    done
    # RoPE under cp 2 (ring), each rank's chunks at their true positions, with as many key/value
    # heads as query heads.
    run llama_mha_one 1 --steps 20 --arch llama
    run llama_mha_cp2 2 --steps 20 --arch llama --cp 2
    compare llama_mha_one llama_mha_cp2 1 20 1e-4
    # Qwen3-style (QK-norm) at tp 2.
    run qwen3_one 1 --steps 20 --arch qwen3 --kv-heads 2
    run qwen3_tp2 2 --steps 20 --arch qwen3 --kv-heads 2 --tp 2
    compare qwen3_one qwen3_tp2 1 20 1e-4
    # The family's settings are the checkpoint's model: another one is refused, naming it.
    if run llama_qk_norm 1 --steps 20 "${llama[@]}" --qk-norm --resume ck_llama 2>qk.err; then
      echo "a checkpoint without QK-norm should be refused"; exit 1
    fi
    grep -q "qk_norm = false, this run has qk_norm = true" qk.err || { cat qk.err; exit 1; }
    ;;
  combined)
    # Every dimension at once on a Llama-style model: 4 layers (a layer per interleaved chunk),
    # 4 microbatches per dp rank at dp 2.
    llama=(--arch llama --ffn-hidden 160 --layers 4 --global-batch 16)
    run llama_one 1 --steps 20 "${llama[@]}" --kv-heads 2
    run llama_tp2_sp_pp2_vpp2_dp2 8 --steps 20 "${llama[@]}" --kv-heads 2 --tp 2 --sp --pp 2 \
      --vpp 2 --schedule interleaved --dp 2 --zero 1
    compare llama_one llama_tp2_sp_pp2_vpp2_dp2 1 20 1e-4
    # With context parallelism too (the key/value heads passed around the cp ring).
    run llama_tp2_cp2_pp2_dp2 16 --steps 20 "${llama[@]}" --kv-heads 2 --tp 2 --cp 2 --pp 2 \
      --dp 2 --zero 1
    compare llama_one llama_tp2_cp2_pp2_dp2 1 20 1e-4
    ;;
  bad_flags)
    # Inconsistent flags fail on every rank with a message that names them, before training.
    # A flag the trainer does not know: exit status 2 (as every start-up error), printed once.
    set +e
    "$mpiexec" "${mpi_flags[@]}" -np 2 "$trainer" "${model[@]}" --steps 1 --no-such-flag \
      >unknown.out 2>unknown.err
    status=$?
    set -e
    test "$status" -eq 2 || { echo "an unknown flag exited $status, expected 2"; exit 1; }
    test "$(grep -c 'no-such-flag' unknown.err)" -eq 1 || { cat unknown.err; exit 1; }
    "$mpiexec" "${mpi_flags[@]}" -np 2 "$trainer" --help >help.out
    test "$(grep -c '^Usage:' help.out)" -eq 1
    # --help lists every runtime flag RuntimeConfig reads (the list in its header).
    runtime_flags=$(grep -o -- '^//   QUINTET_[A-Z_]*=[^ ]* *--[a-z-]*' \
                    "$here/../../include/quintet/core/runtime_config.hpp" | grep -o -- '--[a-z-]*$')
    test "$(echo "$runtime_flags" | wc -w)" -ge 9 || { echo "runtime flags: $runtime_flags"; exit 1; }
    for flag in $runtime_flags; do
      grep -q -- "^  $flag " help.out || { echo "--help does not list $flag"; exit 1; }
    done
    # A flag of the MoE trainer given to the dense one says which trainer takes it.
    expect_error 2 "--ep is a flag of the mixture-of-experts trainer (05_moe_train" --steps 1 \
      --dp 2 --ep 2
    expect_error 2 "--tp 2 x --dp 2 = 4 ranks, but the job has 2" --steps 1 --tp 2 --dp 2
    expect_error 2 "heads = 5 is not divisible by the tensor-parallel size tp = 2" \
      --steps 1 --tp 2 --heads 5 --hidden 80
    # A job every rank refuses alike is printed once, by rank 0.
    test "$(grep -c 'heads = 5 is not divisible' bad.err)" -eq 1 || { cat bad.err; exit 1; }
    expect_error 2 "--seq-len 33 is not divisible by --tp 2" --steps 1 --tp 2 --sp --seq-len 33
    expect_error 1 "--global-batch 12 must be a positive multiple of --micro-batch 5" \
      --steps 1 --micro-batch 5
    expect_error 1 "--zero 3: expected 0, 1 or 2" --steps 1 --zero 3
    expect_error 2 "--zero 1 needs --dp > 1" --steps 1 --tp 2 --zero 1
    expect_error 2 "--tp-overlap-chunks 3 does not divide each rank's sequence of 16 tokens" \
      --steps 1 --tp 2 --sp --tp-overlap --tp-overlap-chunks 3
    expect_error 1 "--tp-overlap-chunks 0: expected a count >= 1" --steps 1 --tp-overlap-chunks 0
    expect_error 1 "--bucket-mb 0: expected a size in MiB" --steps 1 --bucket-mb 0
    expect_error 2 "--tp 1 x --dp 1 x --pp 4 = 4 ranks, but the job has 2" --steps 1 --pp 4 \
      --layers 4
    expect_error 2 "--layers 2 cannot fill --pp 2 x --vpp 2 = 4 pipeline chunks" \
      --steps 1 --pp 2 --vpp 2 --schedule interleaved
    expect_error 2 "zb-h1 needs microbatches >= pp" --steps 1 --pp 2 --schedule zb-h1 \
      --global-batch 2
    expect_error 2 "must be a multiple of pp, found 3" --steps 1 --pp 2 --vpp 2 --layers 4 --schedule interleaved \
      --global-batch 6
    expect_error 2 "unknown pipeline schedule '2f2b'" --steps 1 --pp 2 --schedule 2f2b
    expect_error 1 'unknown recompute "some"; use none, attention or full' --steps 1 --recompute some
    expect_error 2 "--seq-len 30 is not divisible by 2 x --cp 2 = 4" --steps 1 --cp 2 --seq-len 30
    expect_error 4 "heads = 6 is not divisible by tp 1 x cp 4" --steps 1 --cp 4 --cp-kind ulysses \
      --heads 6 --hidden 96
    expect_error 2 'unknown context-parallel kind "spiral"' --steps 1 --cp 2 --cp-kind spiral
    # Key/value heads neither split over tp nor replicated, nor split or repeated over Ulysses cp.
    expect_error 3 "kv_heads = 2 and tp = 3: each tp rank holds" --steps 1 --arch llama \
      --heads 6 --hidden 96 --kv-heads 2 --tp 3
    expect_error 3 "splits the 2 local key/value heads (heads 6, kv_heads 2, tp 1) over cp 3" \
      --steps 1 --arch llama --heads 6 --hidden 96 --kv-heads 2 --cp 3 --cp-kind ulysses \
      --seq-len 24
    expect_error 2 "--tp 1 x --cp 2 x --dp 2 x --pp 1 = 4 ranks, but the job has 2" --steps 1 \
      --cp 2 --dp 2
    expect_error 1 "unknown learning-rate schedule 'step'" --steps 1 --lr-schedule step
    # A flag that qualifies another, given without it, is refused rather than ignored.
    expect_error 1 "--fp8-scaling delayed needs --fp8 hybrid" --steps 1 --fp8-scaling delayed
    expect_error 1 "--async-save needs --save DIR" --steps 1 --async-save
    expect_error 1 "--export-dtype bf16 needs --export-hf DIR" --steps 1 --export-dtype bf16
    expect_error 1 "--decay-fraction 0: expected a share in (0, 1]" --steps 1 --lr-schedule wsd \
      --decay-fraction 0
    # So is a setting that only matters with another that is off (a family's value is let be).
    expect_error 1 "--rope-theta 500000 needs --positions rope" --steps 1 --rope-theta 500000
    expect_error 1 "--rope-theta 500000 needs --positions rope" --steps 1 --arch llama \
      --positions learned --rope-theta 500000
    expect_error 1 "--decay-fraction 0.5 needs --lr-schedule wsd" --steps 1 --decay-fraction 0.5
    expect_error 1 "--min-lr 0.0001 needs a decaying --lr-schedule" --steps 1 \
      --lr-schedule constant --min-lr 1e-4
    expect_error 1 "--tp-overlap-chunks 4 needs --tp-overlap" --steps 1 --tp-overlap-chunks 4
    expect_error 1 "--tp-overlap needs --tp > 1" --steps 1 --tp-overlap
    expect_error 1 "--check-batches needs --tp > 1" --steps 1 --check-batches
    expect_error 1 "--fp8-amax-history 8 needs --fp8-scaling delayed" --steps 1 --fp8 hybrid \
      --fp8-amax-history 8
    expect_error 1 "--cp-kind needs --cp > 1" --steps 1 --cp-kind ulysses
    expect_error 1 "--bench-skip 2 needs --bench" --steps 1 --bench-skip 2
    expect_error 1 "--exit-during-save 3 needs --save DIR" --steps 1 --exit-during-save 3
    expect_error 1 "--eval-only writes nothing: drop --export-hf hf_out" --steps 1 --arch llama \
      --val-data builtin --eval-only --resume ck --export-hf hf_out
    # The job file's keys as the flags: given there, refused alike; an MoE key names the trainer.
    printf '{"rope-theta": 500000}\n' >theta_job.json
    expect_error 1 "--rope-theta 500000 needs --positions rope" --steps 1 --config theta_job.json
    printf '{"ep": 2}\n' >moe_job.json
    expect_error 1 '--config moe_job.json: the job file.s "ep" is a setting of the mixture-of-experts trainer (05_moe_train' \
      --steps 1 --config moe_job.json
    # A job file (--config) trains as its flags do, and flags beside it override it; a bad key
    # in it is refused like a bad flag (exit 2).
    run flags 2 --steps 3 --tp 2 --lr-schedule wsd --sp --warmup 1
    printf '{"steps": 5, "tp": 2, "lr-schedule": "wsd", "sp": true, "warmup": 2}\n' >job.json
    run file 2 --config job.json --steps 3 --warmup 1
    compare flags file 1 3 0
    printf '{"step": 5}\n' >bad_job.json
    set +e
    "$mpiexec" "${mpi_flags[@]}" -np 1 "$trainer" "${model[@]}" --config bad_job.json \
      >/dev/null 2>bad_job.err
    status=$?
    set -e
    test "$status" -eq 2 && grep -q -- '--config bad_job.json: the job file.s "step" is not a setting' \
      bad_job.err || { cat bad_job.err; exit 1; }
    # --resume needs a checkpoint; --resume-if-exists starts fresh without one.
    expect_error 1 "--resume no_such_dir: no such directory; use --resume-if-exists" --steps 1 \
      --resume no_such_dir
    run fresh 1 --steps 1 --resume-if-exists no_such_dir
    grep -q '"step":1' fresh.jsonl
    # Ranks started with different settings (mpirun's MPMD form) are refused at start-up, naming
    # the flag and each rank's value, instead of hanging.
    if timeout 120 "$mpiexec" "${mpi_flags[@]}" -np 1 "$trainer" "${model[@]}" --steps 1 --dp 2 \
        --weight-decay 0.1 : -np 1 "$trainer" "${model[@]}" --steps 1 --dp 2 --weight-decay 0.2 \
        >/dev/null 2>mpmd.err; then
      echo "expected failure: ranks with different --weight-decay"; exit 1
    fi
    grep -q -- 'different values of --weight-decay (rank 0: "0.1", rank 1: "0.2")' mpmd.err || {
      echo "no settings mismatch in:"; cat mpmd.err; exit 1; }
    # The library's schedules drive the trainer: wsd over 6 steps, 2 of warmup, the last 2 decaying.
    run wsd 1 --steps 6 --warmup 2 --lr 1e-3 --min-lr 1e-4 --lr-schedule wsd --decay-fraction 0.5
    python3 - <<'PY'
import json, sys
lr = [json.loads(l)["lr"] for l in open("wsd.jsonl") if '"step"' in l]
want = [5e-4, 1e-3, 1e-3, 1e-3, 5.5e-4, 1e-4]
if len(lr) != 6 or any(abs(a - b) > 1e-9 for a, b in zip(lr, want)):
    sys.exit(f"wsd learning rates {lr}, expected {want}")
PY
    ;;
  val)
    # A validation file of 70 windows of 32 tokens (llm.c's format): 5 whole global batches of
    # 12, the 10 windows after them left out.
    python3 - <<'PY'
import array, struct
n = 70 * 32 + 1
tokens = array.array("H", [(i * 31 + (i // 7) * 3) % 256 for i in range(n)])
with open("val.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(tokens.tobytes())
PY
    windows() {  # windows RUN N: every evaluation of RUN covered N windows
      python3 -c "import json,sys; r=[json.loads(l) for l in open('$1.jsonl') if '\"val_loss\"' in l]; sys.exit(0 if r and all(x['val_windows'] == $2 for x in r) else f'$1: {r}')"
    }
    # Every window once, after steps 5 and 10, at one rank and at tp 2 (+sp), pp 2 x vpp 2, cp 2
    # and dp 2 (ZeRO-1): the same val_loss within 1e-5; evaluating changes nothing of the
    # training (the losses bit for bit).
    evaluated=(--layers 4 --steps 10 --val-data val.bin)  # --eval-only's (it runs no step)
    val=("${evaluated[@]}" --val-every 5)
    run val_one 1 "${val[@]}" --save ck
    windows val_one 60
    run plain_one 1 --layers 4 --steps 10
    compare plain_one val_one 1 10 0
    run val_tp2_sp 2 "${val[@]}" --tp 2 --sp
    run val_pp2_vpp2 2 "${val[@]}" --pp 2 --vpp 2 --schedule interleaved
    run val_cp2 2 "${val[@]}" --cp 2
    run val_dp2_zero1 2 "${val[@]}" --dp 2 --zero 1
    for r in val_tp2_sp val_pp2_vpp2 val_cp2 val_dp2_zero1; do
      python3 "$here/compare_val.py" val_one $r 1e-5
    done
    # A run on --data keeps the built-in dataset's Markov order out of its checkpoint's identity,
    # so a checkpoint that recorded one (versions before --synthetic-order was refused beside
    # --data let it be set there, to no effect) resumes; the data file itself still counts.
    # (The model's flags without --data-dir, which --data refuses.)
    on_data() {  # on_data NAME FLAGS...: one rank on --data, JSON lines into NAME.jsonl
      local name=$1 flags=() skip=0 a
      shift
      for a in "${model[@]}"; do
        if ((skip)); then skip=0; elif [[ $a == --data-dir ]]; then skip=1; else flags+=("$a"); fi
      done
      "$trainer" "${flags[@]}" "$@" >"$name.jsonl"
    }
    on_data data_save --steps 4 --data val.bin --save ck_data
    python3 - <<'PY'
import json
path = "ck_data/step_000004/checkpoint.json"
meta = json.load(open(path))
identity = meta["user"]["trainer_identity"]
assert "data=val.bin" in identity and "synthetic_order" not in identity, identity
meta["user"]["trainer_identity"] = identity + ";synthetic_order=1"
json.dump(meta, open(path, "w"), indent=2)
PY
    on_data data_resume --steps 6 --data val.bin --resume ck_data
    grep -q '"step":6' data_resume.jsonl
    cp val.bin other.bin
    if on_data data_other --steps 6 --data other.bin --resume ck_data 2>data_other.err; then
      echo "resuming a --data checkpoint on other data should fail"; exit 1
    fi
    grep -q "with data = val.bin, this run has data = other.bin" data_other.err ||
      { cat data_other.err; exit 1; }
    # --val-data builtin: the built-in dataset's validation shard, --val-batches 2 of it.
    run builtin 1 --steps 2 --val-data builtin --val-batches 2
    windows builtin 24
    # --eval-only after --resume, at one rank and at tp 2: the val_loss the run printed after
    # step 10, no training step, and the checkpoint directory as it was, byte for byte.
    digest() { (cd ck && find . -printf '%p %s %T@\n' | sort && find . -type f -print0 |
                sort -z | xargs -0 sha256sum) | sha256sum; }
    before=$(digest)
    run eval_one 1 "${evaluated[@]}" --resume ck --eval-only
    run eval_tp2 2 "${evaluated[@]}" --resume ck --eval-only --tp 2
    test "$(digest)" = "$before" || { echo "--eval-only changed the checkpoint directory"; exit 1; }
    for r in eval_one eval_tp2; do
      python3 "$here/compare_val.py" val_one $r 1e-5
      if grep -q '"loss"' $r.jsonl; then echo "$r trained"; exit 1; fi
    done
    # --eval-only after --init-from-hf: a tiny Llama in the Hub's layout (hf_reference.py) on the
    # 4 windows of its reference batch (a file each) gives the NumPy reference's loss within 1e-5,
    # at one rank and at tp 2 + sp. (Its config.json sets the model: no model flags here.)
    # (A python3 with NumPy: the first on PATH, else the system's; a pyenv one may lack it.)
    np_python=""
    for p in python3 /usr/bin/python3; do
      if [ -z "$np_python" ] && "$p" -c "import numpy" 2>/dev/null; then np_python=$p; fi
    done
    if [ -n "$np_python" ]; then
      "$np_python" - "$here/../python" <<'PY'
import os, struct, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import hf_reference as ref
d = ref.write_case("hf", "llama_gqa")
rows = np.fromfile(os.path.join(d, "tokens.bin"), dtype=np.int32).reshape(ref.ROWS, -1)
for i, row in enumerate(rows):
    with open(f"hf_val_{i}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, row.size, *([0] * 253)))
        f.write(row.astype(np.uint16).tobytes())
PY
      hf=(--device cpu --json --no-progress --init-from-hf hf/llama_gqa --eval-only
          --val-data 'hf_val_*.bin' --data 'hf_val_*.bin' --seq-len 8 --micro-batch 2
          --global-batch 4)
      for r in "hf_one 1" "hf_tp2_sp 2 --tp 2 --sp"; do
        set -- $r
        "$mpiexec" "${mpi_flags[@]}" -np "$2" "$trainer" "${hf[@]}" "${@:3}" >"$1.jsonl"
        python3 - "$1" <<'PY'
import json, sys
want = json.load(open("hf/llama_gqa/expected.json"))["loss"]
got = [json.loads(l) for l in open(sys.argv[1] + ".jsonl") if '"val_loss"' in l]
if len(got) != 1 or got[0]["val_windows"] != 4 or got[0]["val_step"] != 0 or \
        abs(got[0]["val_loss"] - want) > 1e-5 * want:
    sys.exit(f"{sys.argv[1]}: {got}, the reference's loss {want}")
print(f"{sys.argv[1]}: val_loss {got[0]['val_loss']} == the reference's {want}")
PY
      done
    else
      echo "(no NumPy: --init-from-hf --eval-only not checked against hf_reference.py)"
    fi
    # The text output has the line.
    text_model=()
    for a in "${model[@]}"; do [[ $a == --json ]] || text_model+=("$a"); done
    "$trainer" "${text_model[@]}" "${evaluated[@]}" --resume ck --eval-only >eval.out
    grep -q "^step    10/10 | val_loss [0-9.]* over 60 windows" eval.out || { cat eval.out; exit 1; }
    # Bad settings are refused before training, naming them.
    refused() {  # refused MESSAGE FLAGS...
      local want=$1
      shift
      if run bad 1 --steps 2 "$@" 2>bad.err; then echo "expected a refusal: $*"; exit 1; fi
      grep -qF -- "$want" bad.err || { echo "no '$want' in:"; cat bad.err; exit 1; }
    }
    refused "--val-every 5 needs --val-data" --val-every 5
    refused "--val-batches 2 needs --val-data" --val-batches 2
    refused "--eval-only needs --val-data" --eval-only --resume ck
    refused "--eval-only evaluates a trained model: give it with --resume" --eval-only \
      --val-data val.bin
    refused "--eval-only writes nothing: drop --save" --eval-only --val-data val.bin \
      --resume ck --save ck2
    refused "--val-every 5 needs training (it evaluates between steps), and --eval-only" \
      --eval-only --val-data val.bin --resume ck --val-every 5
    refused "--val-every -1 --val-batches 0: expected >= 0" --val-every -1 --val-data val.bin
    refused "data spec 'nothing_*.bin' matches no file" --val-data 'nothing_*.bin'
    refused "--val-batches 6: global batches of 12 windows" --val-data val.bin --val-batches 6
    refused "holds 2 windows, fewer than one global batch of 12" --val-data val.bin --seq-len 1024
    ;;
  bound_by)
    run tp2_dp2 4 --steps 6 --tp 2 --dp 2
    python3 "$here/check_bound_by.py" tp2_dp2.jsonl --nonzero "exposed tp" "exposed dp" compute
    slow=(--global-batch 4 --loader-threads 1 --loader-delay-ms 40)
    run slow 1 --steps 6 "${slow[@]}"
    python3 "$here/check_bound_by.py" slow.jsonl --bound input
    "$mpiexec" "${mpi_flags[@]}" -np 1 "$trainer" "${model[@]}" --steps 6 "${slow[@]}" \
      --json=false >slow.txt
    tail -n 1 slow.txt | grep -E '^bound by: input [0-9]+%, ' || { cat slow.txt; exit 1; }
    if run bad 1 --steps 1 --loader-delay-ms -1 2>bad.err; then exit 1; fi
    grep -q -- "--loader-delay-ms -1: expected a time >= 0" bad.err || { cat bad.err; exit 1; }
    ;;
  fp8)
    # The blocks' linear layers in FP8 (emulated: E4M3/E5M2 rounding, f32 GEMMs), current and
    # delayed scaling. Every layout's amaxes are the whole tensors' (tp_fp8_test checks the
    # scales exactly), so the layouts give the one-rank losses within the f32 layouts' 1e-4:
    # a sum the shards add in another order can round to the neighbouring FP8 value (an E5M2
    # step is 25%), which moves step 1's gradient norm by up to ~2e-4, where FP8 moves it from
    # f32's by more than 1e-3. FP8 trains as f32 does.
    # first_norms A B [C]: step 1's gradient norm of A is B's within 5e-4 (and not C's +-1e-3)
    first_norms() { python3 "$here/compare_first_norm.py" "$1" "$2" 5e-4 "${@:3}"; }
    run plain 1 --steps 20
    run fp8_one 1 --steps 20 --fp8 hybrid
    run fp8_tp2_sp_pp2 4 --steps 20 --fp8 hybrid --tp 2 --sp --pp 2
    compare fp8_one fp8_tp2_sp_pp2 1 20 1e-4
    first_norms fp8_one fp8_tp2_sp_pp2 plain
    compare plain fp8_one 1 20 0.03
    # --fp8-lm-head: the LM head in FP8 too, untied and tied (its own table and, at pp 2, the
    # last stage's copy), at tp 2 (+ sp) x pp 2 as one rank; step 1 is not the FP8 blocks'.
    # The logits' FP8 roundings flip more often: steps 1-2 within 1e-6, 1-20 within 5e-4.
    head_same() {
      compare "$1" "$2" 1 2 1e-6
      compare "$1" "$2" 1 20 5e-4
      first_norms "$@"
    }
    run head_one 1 --steps 20 --fp8 hybrid --fp8-lm-head
    run head_tp2_sp_pp2 4 --steps 20 --fp8 hybrid --fp8-lm-head --tp 2 --sp --pp 2
    head_same head_one head_tp2_sp_pp2 fp8_one
    compare plain head_one 1 20 0.03
    run head_tied_one 1 --steps 20 --fp8 hybrid --fp8-lm-head --tied-embeddings
    run head_tied_tp2_pp2 4 --steps 20 --fp8 hybrid --fp8-lm-head --tied-embeddings --tp 2 --pp 2
    run tied_one 1 --steps 20 --fp8 hybrid --tied-embeddings
    head_same head_tied_one head_tied_tp2_pp2 tied_one
    delayed=(--fp8 hybrid --fp8-scaling delayed --fp8-amax-history 4)
    run delayed_one 1 --steps 20 "${delayed[@]}"
    run delayed_tp2_pp2 4 --steps 20 "${delayed[@]}" --tp 2 --pp 2
    compare delayed_one delayed_tp2_pp2 1 20 1e-4
    first_norms delayed_one delayed_tp2_pp2
    # Data parallelism puts other sequences in a microbatch (the sampler strides over the
    # replicas), so its amaxes are another run's than one rank's: dp 2 is compared with dp 2.
    run delayed_dp2 2 --steps 20 "${delayed[@]}" --dp 2
    run delayed_tp2_dp2 4 --steps 20 "${delayed[@]}" --tp 2 --dp 2 --zero 1
    compare delayed_dp2 delayed_tp2_dp2 1 20 1e-4
    first_norms delayed_dp2 delayed_tp2_dp2
    compare plain delayed_one 1 20 0.03
    # Resuming delayed scaling continues bit for bit (the amax histories are in the checkpoint),
    # at another layout too (within 1e-4 as above); another history length is refused.
    run delayed_first 4 --steps 20 "${delayed[@]}" --tp 2 --pp 2 --save ckpt --stop-at 10
    run delayed_second 4 --steps 20 "${delayed[@]}" --tp 2 --pp 2 --resume ckpt
    compare delayed_tp2_pp2 delayed_first 1 10 0
    compare delayed_tp2_pp2 delayed_second 11 20 0
    run delayed_second_one 1 --steps 20 "${delayed[@]}" --resume ckpt
    compare delayed_tp2_pp2 delayed_second_one 11 20 1e-4
    if run bad 1 --steps 20 --fp8 hybrid --fp8-scaling delayed --resume ckpt 2>bad.err; then
      echo "a history of another length should be refused"; exit 1
    fi
    grep -q "holds an amax history of \[4\] steps" bad.err || { cat bad.err; exit 1; }
    refused() {  # refused MESSAGE FLAGS...: the run fails before training, naming the flags
      if run bad 1 --steps 1 "${@:2}" 2>bad.err; then echo "accepted: ${*:2}"; exit 1; fi
      grep -q -- "$1" bad.err || { cat bad.err; exit 1; }
    }
    refused "FP8 mode 'on': expected off or hybrid" --fp8 on
    refused "expected current or delayed" --fp8 hybrid --fp8-scaling tensorwise
    refused "--fp8-amax-history 0: expected a count >= 1" --fp8 hybrid --fp8-amax-history 0
    refused "--fp8-lm-head needs --fp8 hybrid" --fp8-lm-head
    ;;
  gpu_fp8)
    if ! nvidia-smi -L >/dev/null 2>&1; then
      echo "gpt_train_test gpu_fp8: SKIP (no GPU)"
      exit 0
    fi
    gpu_model=("${model[@]}")
    for i in "${!gpu_model[@]}"; do [ "${gpu_model[$i]}" = cpu ] && gpu_model[$i]=cuda; done
    for scaling in current delayed; do
      run "cpu_$scaling" 1 --steps 20 --fp8 hybrid --fp8-scaling "$scaling"
      echo "--- gpu_$scaling: 1 rank: ${gpu_model[*]}"
      "$mpiexec" "${mpi_flags[@]}" -np 1 "$trainer" "${gpu_model[@]}" --steps 20 --fp8 hybrid \
        --fp8-scaling "$scaling" >"gpu_$scaling.jsonl"
      # bf16 on the GPU against f32 on the CPU, both through FP8 from the same weights on the
      # same batches: the amaxes of bf16 and f32 tensors differ by a bf16 rounding, so the scales
      # and a few FP8 roundings differ too, and the per-token differences average down over the
      # batch's tokens. Reasoned, not yet measured: 1e-2 (twice the bf16-only bound of
      # moe_train_test gpu); the loss's fall is checked on its own below.
      compare "cpu_$scaling" "gpu_$scaling" 1 20 1e-2
      python3 - "cpu_$scaling.jsonl" "gpu_$scaling.jsonl" <<'PY'
import json, math, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"step"' in l]
def fall(l):  # the first 5 steps' mean loss less the last 5's
    return sum(l[:5]) / 5 - sum(l[-5:]) / 5
c, g = losses(sys.argv[1]), losses(sys.argv[2])
if not all(math.isfinite(x) for x in g):
    sys.exit(f"{sys.argv[2]}: a non-finite loss")
if not fall(c) > 0 or not fall(g) >= 0.5 * fall(c):
    sys.exit(f"the GPU run's loss fell by {fall(g):.4g}, the CPU run's by {fall(c):.4g}: the "
             "GPU run must fall by half of that or more")
print(f"loss fell by {fall(g):.4g} on the GPU, {fall(c):.4g} on the CPU")
PY
    done
    ;;
  *)
    echo "unknown case $case"; exit 2 ;;
esac
echo "gpt_train_test $case: PASS"
