#!/usr/bin/env bash
# Tests of examples/05_moe_train on the CPU under mpirun (ctest: moe_train_*):
#   layouts    ep 2 x dp 2 (edp 2; its exchange in 2 overlapped chunks, the default, and in 1),
#              tp 2 x ep 2 (etp 2), tp 2 + sp with etp 1, ep 3 (odd),
#              ep 2 with ZeRO-1, pp 2 x ep 2, cp 2 x ep 2 and a capacity-free shared-expert,
#              SwiGLU-free GELU model with aux and z losses on: the one-rank loss at each of 20
#              steps within 1e-4 relative; the per-step telemetry (tokens per expert, dropped
#              fraction, aux and z losses, ep_comm_ms) is in the JSON records
#   families   a Mixtral-style model (--arch mixtral, GQA 2 of 4 heads) at ep 2 (ZeRO-1) and tp 2 +
#              sp, a Qwen3-MoE-style one (QK-norm) at ep 2: the one-rank loss at each of 20 steps
#              within 1e-4 relative; --arch llama (dense) refused, naming it
#   mixtral    the Mixtral preset's own MoE shape (--arch mixtral: 8 SwiGLU experts of --ffn-hidden's
#              width, top-2; GQA 2 of 4 heads, 4 layers) at tp 2 x dp 2 with ep 2 (etp 2), pp 2 x
#              vpp 2 (interleaved), dp 2 with ZeRO-1, and without GQA at cp 2 x dp 2 x ep 2 (ring)
#              and cp 2 (ulysses): the one-rank loss at each of 20 steps within 1e-4 relative
#   combined   the same model on 8 ranks: tp 2 + sp x pp 2 x dp 2 with ep 2 (etp 2) and ZeRO-1,
#              and (without GQA) cp 2 x pp 2 x dp 2 with ep 2: the one-rank loss within 1e-4
#   mixtral_reshard  its checkpoint saved at tp 2 x dp 2, ep 2 (ZeRO-1) resumed at one rank, pp 2
#              x dp 2 x ep 2 and ep 4 x dp 4 follows the uninterrupted run within 1e-5
#   qwen3_moe  the Qwen3-MoE preset's own MoE shape (--arch qwen3-moe: 128 experts of width 3/8 of
#              --hidden, top-8; QK-norm, GQA 2 of 4 heads) at tp 2 x dp 2 with ep 2 (etp 2) and
#              ep 4 x dp 4: the one-rank loss at each of 20 steps within 1e-4 relative
#   mixed      dense blocks among the MoE ones (--dense-layers 0,2 of 4 blocks; the dense MLP 48
#              wide, the experts 16): pp 3 (odd; its middle stage holds one dense block and no
#              MoE layer), pp 2 x dp 2 x ep 2 (each stage a dense and an MoE block), tp 2 x dp 2 x
#              ep 2 (etp 2), ep 3 (odd), cp 2 x dp 2 x ep 2 and pp 2 x vpp 2 (a block per
#              chunk): the one-rank loss at each of 8 steps within 1e-4; its checkpoint (pp 2
#              x dp 2 x ep 2, step 4) holds each block's own MLP and, resumed at one rank and at
#              ep 3, follows the uninterrupted run within 1e-5
#   resume     a run with auxiliary-loss-free balancing stopped and saved at step 10, then
#              resumed, equals the uninterrupted run at steps 11..20 (the bias is in the checkpoint)
#   val        --val-data at ep 2 x dp 2 and tp 2 + sp x ep 2 (etp 2) equals one rank within 1e-5,
#              with the balancing bias
#              moving; evaluating leaves every step's losses and MoE telemetry unchanged;
#              --eval-only after --resume gives the run's val_loss at that step
#   gpu        one GPU (skipped without one): 20 bf16 steps follow the CPU run within 5e-3, the
#              GPU run's own loss falls (its last 5 steps' mean below its first 5's by at least
#              half the CPU run's fall), with the telemetry
#   reshard    a checkpoint of ep 2 x dp 4 resumed at ep 1, tp 2 x ep 2 (etp 2) and ep 4 follows the
#              uninterrupted run within 1e-5: every expert and the balancing bias come back
#   trace      --trace (cp 2 x dp 2 x ep 2, ep 3): valid traces with dp, ep and cp communication,
#              the per-kind figures adding up, the losses unchanged
#   bad_flags  experts not divisible by ep, top-k above the experts, etp x ep that does not fit
#              the ranks, an unknown router, --moe-chunks 0: refused with a message naming them
#   fp8        --fp8 hybrid with MoE blocks (the experts' GEMMs with per-tensor scales over the
#              stage, one exchange chunk): tp 2 x ep 2 (etp 1) and tp 2 + sp (etp 2) give the
#              one-rank losses (steps 1-2 within 1e-6, 1-20 within 5e-4) and step 1's gradient
#              norm (1e-5; f32's is 1e-3 away), FP8's losses within 3% of f32's; delayed scaling
#              at dp 2 x ep 2 gives dp 2's (ep 1) as closely; resuming it continues bit for bit
#              at its layout and within 5e-4 at ep 1
#   bound_by   the bound-by verdict at pp 2 x ep 2 (its JSON records and summary,
#              check_bound_by.py) adds up to the step time within 2%, with exposed ep and pp parts
# Usage: moe_train_test.sh TRAINER MPIEXEC WORKDIR CASE [mpirun flags...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/trainer_test_common.sh" "$@"
model=(--device cpu --layers 2 --hidden 32 --heads 4 --vocab 256 --seq-len 16 --micro-batch 2
       --global-batch 8 --lr 3e-3 --warmup 5 --experts 4 --top-k 2 --expert-ffn 48
       --aux-loss-coeff 0.01 --z-loss-coeff 0.001 --data-dir "$work/data" --json --no-progress)

case $case in
  families)
    # Mixtral-style (--arch mixtral: RoPE, RMSNorm, SwiGLU experts, no biases) with grouped-query
    # attention, 2 key/value heads for 4 query heads, at ep 2 (ZeRO-1) and tp 2 + sp (etp 2), and
    # Qwen3-MoE-style (QK-norm) at ep 2.
    gqa=(--kv-heads 2 --hidden 64 --seq-len 32)  # wider than the others: it learns in 20 steps
    mixtral=(--arch mixtral "${gqa[@]}")
    run mixtral_one 1 --steps 20 "${mixtral[@]}"
    run mixtral_ep2_zero1 2 --steps 20 "${mixtral[@]}" --dp 2 --ep 2 --zero 1
    run mixtral_tp2_sp 2 --steps 20 "${mixtral[@]}" --tp 2 --sp
    for r in mixtral_ep2_zero1 mixtral_tp2_sp; do compare mixtral_one $r 1 20 1e-4; done
    run qwen3_moe_one 1 --steps 20 --arch qwen3-moe "${gqa[@]}"
    run qwen3_moe_ep2 2 --steps 20 --arch qwen3-moe "${gqa[@]}" --dp 2 --ep 2
    compare qwen3_moe_one qwen3_moe_ep2 1 20 1e-4
    # A dense family is refused by the MoE trainer, naming --arch.
    if run llama 1 --steps 2 --arch llama 2>dense.err; then
      echo "--arch llama should be refused by the MoE trainer"; exit 1
    fi
    grep -q -- "--arch llama: a dense family" dense.err || { cat dense.err; exit 1; }
    ;;
  mixtral | combined | mixtral_reshard)
    # The Mixtral preset's MoE shape, not the other cases' experts: 8 experts of --ffn-hidden's
    # width, top-2; 4 layers so pp 2 x vpp 2 has a layer per chunk.
    model=(--device cpu --layers 4 --hidden 64 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2
           --global-batch 8 --lr 3e-3 --warmup 5 --arch mixtral --ffn-hidden 64
           --aux-loss-coeff 0.01 --z-loss-coeff 0.001 --data-dir "$work/data" --json --no-progress)
    gqa=(--kv-heads 2)  # context parallelism takes as many key/value heads as query heads
    ;;&
  mixtral)
    run one 1 --steps 20 "${gqa[@]}"
    run tp2_dp2_ep2 4 --steps 20 "${gqa[@]}" --tp 2 --dp 2 --ep 2
    run pp2_vpp2 2 --steps 20 "${gqa[@]}" --pp 2 --vpp 2 --schedule interleaved
    run dp2_zero1 2 --steps 20 "${gqa[@]}" --dp 2 --zero 1
    for r in tp2_dp2_ep2 pp2_vpp2 dp2_zero1; do compare one $r 1 20 1e-4; done
    run mha_one 1 --steps 20
    run mha_cp2_dp2_ep2 4 --steps 20 --cp 2 --dp 2 --ep 2
    run mha_cp2_ulysses 2 --steps 20 --cp 2 --cp-kind ulysses
    for r in mha_cp2_dp2_ep2 mha_cp2_ulysses; do compare mha_one $r 1 20 1e-4; done
    # The preset's shape reached the model: 8 sequences x 32 tokens x top-2 over 8 experts is a
    # mean of 64 tokens per expert, and no drops (dropless).
    python3 - <<'PY'
import json, sys
for r in (json.loads(l) for l in open("one.jsonl") if '"step"' in l):
    if r["tokens_per_expert_mean"] != 64.0 or r["dropped_fraction"] != 0.0:
        sys.exit(f"step {r['step']}: {r['tokens_per_expert_mean']} tokens per expert, dropped {r['dropped_fraction']}")
print("8 experts, top-2, dropless")
PY
    ;;
  combined)
    run one 1 --steps 20 "${gqa[@]}"
    run tp2_sp_pp2_dp2_ep2 8 --steps 20 "${gqa[@]}" --tp 2 --sp --pp 2 --dp 2 --ep 2 --zero 1
    compare one tp2_sp_pp2_dp2_ep2 1 20 1e-4
    run mha_one 1 --steps 20
    run mha_cp2_pp2_dp2_ep2 8 --steps 20 --cp 2 --pp 2 --dp 2 --ep 2
    compare mha_one mha_cp2_pp2_dp2_ep2 1 20 1e-4
    ;;
  mixtral_reshard)
    # Saved at tp 2 x dp 2, ep 2 (etp 2, ZeRO-1) at step 4; steps 5..8 resumed at one rank, at pp
    # 2 x dp 2 x ep 2 and at ep 4 x dp 4 follow the uninterrupted run within 1e-5.
    tool="$(dirname "$trainer")/../12_checkpoint_tool/12_checkpoint_tool"
    saved=(--tp 2 --dp 2 --ep 2 --zero 1)
    run full 4 --steps 8 "${gqa[@]}" "${saved[@]}"
    run first 4 --steps 8 "${gqa[@]}" "${saved[@]}" --save ckpt --stop-at 4
    compare full first 1 4 0
    "$tool" ckpt --verify >tool.out
    grep -q "verified: 4 shards" tool.out
    for layout in "one 1" "pp2_dp2_ep2 4 --pp 2 --dp 2 --ep 2" "ep4_dp4 4 --dp 4 --ep 4"; do
      # shellcheck disable=SC2086
      set -- $layout
      name=$1 ranks=$2
      shift 2
      rm -rf "ck_$name" && cp -r ckpt "ck_$name"
      run "$name" "$ranks" --steps 8 "${gqa[@]}" --resume "ck_$name" "$@"
      compare full "$name" 5 8 1e-5
    done
    ;;
  qwen3_moe)
    # The Qwen3-MoE preset's MoE shape, not the other cases' experts: 128 experts of width 24
    # (3/8 of hidden 64), top-8.
    model=(--device cpu --layers 2 --hidden 64 --heads 4 --kv-heads 2 --vocab 256 --seq-len 32
           --micro-batch 2 --global-batch 8 --lr 3e-3 --warmup 5 --arch qwen3-moe
           --data-dir "$work/data" --json --no-progress)
    run one 1 --steps 20
    run tp2_dp2_ep2 4 --steps 20 --tp 2 --dp 2 --ep 2
    run ep4_dp4 4 --steps 20 --dp 4 --ep 4
    for r in tp2_dp2_ep2 ep4_dp4; do compare one $r 1 20 1e-4; done
    # 8 sequences x 32 tokens x top-8 over 128 experts: a mean of 16 tokens per expert.
    python3 -c "import json,sys; r=[json.loads(l) for l in open('one.jsonl') if '\"step\"' in l]; sys.exit(0 if all(x['tokens_per_expert_mean'] == 16.0 for x in r) else 'not 128 experts top-8')"
    ;;
  mixed)
    # Blocks 0 and 2 dense (--ffn-hidden 48), 1 and 3 MoE (6 experts of width 16, top-2); 12
    # sequences so dp 2 and dp 3 both divide the batch.
    tool="$(dirname "$trainer")/../12_checkpoint_tool/12_checkpoint_tool"
    mixed=(--steps 8 --layers 4 --dense-layers 0,2 --ffn-hidden 48 --expert-ffn 16 --experts 6
           --global-batch 12)
    run one 1 "${mixed[@]}"
    run pp3 3 "${mixed[@]}" --pp 3
    run pp2_dp2_ep2 4 "${mixed[@]}" --pp 2 --dp 2 --ep 2
    run tp2_dp2_ep2 4 "${mixed[@]}" --tp 2 --dp 2 --ep 2
    run ep3 3 "${mixed[@]}" --dp 3 --ep 3
    run cp2_dp2_ep2 4 "${mixed[@]}" --cp 2 --dp 2 --ep 2
    run pp2_vpp2 2 "${mixed[@]}" --pp 2 --vpp 2 --schedule interleaved
    for r in pp3 pp2_dp2_ep2 tp2_dp2_ep2 ep3 cp2_dp2_ep2 pp2_vpp2; do compare one $r 1 8 1e-4; done
    run first 4 "${mixed[@]}" --pp 2 --dp 2 --ep 2 --save ckpt --stop-at 4
    compare pp2_dp2_ep2 first 1 4 0
    "$tool" ckpt --verify >tool.out
    for want in "block0.mlp.fc.weight +\[48, 32\] +f32 +1" "block2.mlp.proj.weight +\[32, 48\] +f32 +1" \
                "block1.mlp.experts.fc.weight +\[6, 16, 32\] +f32 +2" \
                "block3.mlp.router.weight +\[6, 32\] +f32 +1"; do
      grep -Eq "^value +$want\$" tool.out || { echo "no '$want' in:"; cat tool.out; exit 1; }
    done
    if grep -Eq "^value +block(0|2).mlp.router|^value +block(1|3).mlp.fc" tool.out; then
      echo "a dense block with a router, or an MoE block with a dense MLP:"; cat tool.out; exit 1
    fi
    for layout in "one_resumed 1" "ep3_resumed 3 --dp 3 --ep 3"; do
      # shellcheck disable=SC2086
      set -- $layout
      name=$1 ranks=$2
      shift 2
      rm -rf "ck_$name" && cp -r ckpt "ck_$name"
      run "$name" "$ranks" "${mixed[@]}" --resume "ck_$name" "$@"
      compare pp2_dp2_ep2 "$name" 5 8 1e-5
    done
    ;;
  layouts)
    run one 1 --steps 20
    run ep2_dp2 4 --steps 20 --dp 4 --ep 2
    run ep2_dp2_one_chunk 4 --steps 20 --dp 4 --ep 2 --moe-chunks 1
    run tp2_ep2 4 --steps 20 --tp 2 --dp 2 --ep 2
    run tp2_sp_ep2_etp1 4 --steps 20 --tp 2 --dp 2 --ep 2 --etp 1 --sp
    run ep3 3 --steps 20 --dp 3 --ep 3 --experts 6 --global-batch 6
    run one_e6 1 --steps 20 --experts 6 --global-batch 6
    run ep2_zero1 2 --steps 20 --dp 2 --ep 2 --zero 1
    run pp2_ep2 4 --steps 20 --pp 2 --dp 2 --ep 2
    run cp2_ep2 4 --steps 20 --cp 2 --dp 2 --ep 2
    for r in ep2_dp2 ep2_dp2_one_chunk tp2_ep2 tp2_sp_ep2_etp1 ep2_zero1 pp2_ep2 cp2_ep2; do
      compare one $r 1 20 1e-4
    done
    compare one_e6 ep3 1 20 1e-4
    python3 - <<'PY'
import json, sys
recs = [json.loads(l) for l in open("ep2_dp2.jsonl") if '"step"' in l]
for r in recs:
    for k in ("tokens_per_expert_min", "tokens_per_expert_mean", "tokens_per_expert_max",
              "dropped_fraction", "aux_loss", "z_loss", "ep_comm_ms"):
        if k not in r:
            sys.exit(f"step {r['step']}: no {k} in the JSON record")
    # 8 sequences x 16 tokens x top-2 over 2 blocks x 4 experts: the mean is 8 * 16 * 2 / 4.
    if abs(r["tokens_per_expert_mean"] - 64.0) > 1e-9 or not r["tokens_per_expert_min"] <= 64 <= r["tokens_per_expert_max"]:
        sys.exit(f"step {r['step']}: tokens per expert {r['tokens_per_expert_min']}/{r['tokens_per_expert_mean']}/{r['tokens_per_expert_max']}")
    if r["dropped_fraction"] != 0.0 or not r["aux_loss"] > 0 or not r["z_loss"] > 0:
        sys.exit(f"step {r['step']}: dropped {r['dropped_fraction']}, aux {r['aux_loss']}, z {r['z_loss']}")
if not any(r["ep_comm_ms"] > 0 for r in recs):
    sys.exit("ep_comm_ms is 0 at every step at ep 2")
print("telemetry present in every record")
PY
    # Capacity: with factor 0.5 some assignments are dropped, and the run still learns.
    run capacity 2 --steps 20 --dp 2 --ep 2 --capacity-factor 0.5 --shared-experts 1
    python3 -c "import json,sys; r=[json.loads(l) for l in open('capacity.jsonl') if '\"step\"' in l]; sys.exit(0 if all(x['dropped_fraction'] > 0 for x in r) and r[-1]['loss'] < r[0]['loss'] else 'no drops at capacity 0.5, or no learning')"
    ;;
  fp8)
    # Every amax is reduced over the stage, so a dp-1 layout gives one rank's scales and any
    # two layouts of one dp give each other's; the scales are per exchange chunk, so one chunk.
    # Steps 1 and 2 agree within 1e-6 (step 1's gradient norm within 1e-5, where FP8 moves it
    # from f32's by more than 1e-3); later a sum in another order moves an FP8 rounding (an
    # E5M2 step is 25%), which this small model's 20 steps carry to ~2e-4: within 5e-4.
    # norms A B [C]: step 1's gradient norm of B is A's within 1e-5 (and C's is not, by 1e-3)
    norms() { python3 "$here/compare_first_norm.py" "$1" "$2" 1e-5 "${@:3}"; }
    same() {  # same A B: B follows A (steps 1-2 within 1e-6, 1-20 within 5e-4, the norm)
      compare "$1" "$2" 1 2 1e-6
      compare "$1" "$2" 1 20 5e-4
      norms "$1" "$2"
    }
    current=(--fp8 hybrid --moe-chunks 1)
    run plain 1 --steps 20 --moe-chunks 1
    run fp8_one 1 --steps 20 "${current[@]}"
    run fp8_tp2_ep2 2 --steps 20 "${current[@]}" --tp 2 --ep 2 --etp 1
    run fp8_tp2_sp_etp2 2 --steps 20 "${current[@]}" --tp 2 --sp
    for r in fp8_tp2_ep2 fp8_tp2_sp_etp2; do same fp8_one $r; done
    norms fp8_one fp8_one plain
    compare plain fp8_one 1 20 0.03
    delayed=(--fp8 hybrid --fp8-scaling delayed --fp8-amax-history 4 --moe-chunks 1)
    run delayed_dp2 2 --steps 20 "${delayed[@]}" --dp 2
    run delayed_dp2_ep2 2 --steps 20 "${delayed[@]}" --dp 2 --ep 2
    same delayed_dp2 delayed_dp2_ep2
    # The experts' amax histories are in the checkpoint, by name: resumed at ep 2 bit for bit,
    # at ep 1 within 5e-4.
    run delayed_first 2 --steps 20 "${delayed[@]}" --dp 2 --ep 2 --save ckpt --stop-at 10
    compare delayed_dp2_ep2 delayed_first 1 10 0
    cp -r ckpt ck_ep1
    run delayed_second 2 --steps 20 "${delayed[@]}" --dp 2 --ep 2 --resume ckpt
    compare delayed_dp2_ep2 delayed_second 11 20 0
    run delayed_second_ep1 2 --steps 20 "${delayed[@]}" --dp 2 --resume ck_ep1
    compare delayed_dp2_ep2 delayed_second_ep1 11 20 5e-4
    ;;
  resume)
    bias=(--dp 2 --ep 2 --aux-free-bias-rate 0.01 --router sigmoid --aux-loss-coeff 0)
    run full 2 --steps 20 "${bias[@]}"
    run first 2 --steps 20 --stop-at 10 --save ckpt "${bias[@]}"
    run resumed 2 --steps 20 --resume ckpt "${bias[@]}"
    compare full resumed 11 20 1e-6
    ;;
  val)
    # The validation loss of an MoE model with its balancing bias moving (aux-loss-free) and the
    # aux and z losses on: the same at ep 2 x dp 2 as at one rank within 1e-5; evaluating moves
    # no bias and counts nothing (the losses and the MoE telemetry of every step as without it,
    # bit for bit); --eval-only after --resume prints the val_loss the run printed at that step.
    evaluated=(--steps 8 --val-data builtin --val-batches 4 --aux-free-bias-rate 0.01)
    val=("${evaluated[@]}" --val-every 4)  # (--eval-only runs no step: no --val-every)
    run val_one 1 "${val[@]}" --save ck
    run val_ep2 2 "${val[@]}" --dp 2 --ep 2
    run val_tp2_sp_ep2 4 "${val[@]}" --tp 2 --sp --dp 2 --ep 2
    for r in val_ep2 val_tp2_sp_ep2; do python3 "$here/compare_val.py" val_one $r 1e-5; done
    run plain_one 1 --steps 8 --aux-free-bias-rate 0.01
    python3 - <<'PY'
import json, sys
def steps(path):
    keep = ("loss", "grad_norm", "aux_loss", "z_loss", "tokens_per_expert_min",
            "tokens_per_expert_max", "dropped_fraction")
    return [{k: r[k] for k in keep} for r in map(json.loads, open(path)) if "step" in r]
a, b = steps("plain_one.jsonl"), steps("val_one.jsonl")
if len(a) != 8 or a != b:
    sys.exit(f"evaluating changed the training:\n{a}\n{b}")
PY
    run eval_ep2 2 "${evaluated[@]}" --dp 2 --ep 2 --resume ck --eval-only
    python3 "$here/compare_val.py" val_one eval_ep2 1e-5
    ;;
  gpu)
    if ! nvidia-smi -L >/dev/null 2>&1; then
      echo "moe_train_test gpu: SKIP (no GPU)"
      exit 0
    fi
    gpu_model=("${model[@]}")
    for i in "${!gpu_model[@]}"; do [ "${gpu_model[$i]}" = cpu ] && gpu_model[$i]=cuda; done
    run cpu_ref 1 --steps 20
    echo "--- gpu: 1 rank: ${gpu_model[*]}"
    "$mpiexec" "${mpi_flags[@]}" -np 1 "$trainer" "${gpu_model[@]}" --steps 20 >gpu.jsonl
    # bf16 on the GPU against f32 on the CPU, from the same weights on the same batches. The loss
    # is a mean over 128 tokens of cross-entropies from logits a few bf16 ULPs (2^-8 relative
    # each) off, which average down to well under 2^-8 of the loss; the 20 steps then move the
    # loss only about 1% (5.54 -> 5.48 on the CPU, first 5 against last 5), so the two runs'
    # updates, equal but for rounding, cannot part by more than a fraction of that. 5e-3 (under
    # half of the 1% fall) holds bf16 and fails a GPU run that does not train; 2e-2 did not.
    compare cpu_ref gpu 1 20 5e-3
    python3 - <<'PY'
import json, math, sys
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"step"' in l]
def fall(l):  # the first 5 steps' mean loss less the last 5's
    return sum(l[:5]) / 5 - sum(l[-5:]) / 5
cpu, gpu = fall(losses("cpu_ref.jsonl")), fall(losses("gpu.jsonl"))
if not cpu > 0 or not gpu >= 0.5 * cpu:
    sys.exit(f"the GPU run's loss fell by {gpu:.4g} (first 5 steps' mean less last 5's), "
             f"the CPU run's by {cpu:.4g}: the GPU run must fall by half of that or more")
print(f"loss fell by {gpu:.4g} on the GPU, {cpu:.4g} on the CPU")
recs = [json.loads(l) for l in open("gpu.jsonl") if '"step"' in l]
for r in recs:
    if not math.isfinite(r["loss"]) or not r["aux_loss"] > 0 or not r["z_loss"] > 0:
        sys.exit(f"step {r['step']}: loss {r['loss']}, aux {r['aux_loss']}, z {r['z_loss']}")
    if abs(r["tokens_per_expert_mean"] - 64.0) > 1e-9:
        sys.exit(f"step {r['step']}: mean tokens per expert {r['tokens_per_expert_mean']}")
print("GPU telemetry present in every record")
PY
    ;;
  reshard)
    # Saved at ep 2 x dp 4 (edp 2) at step 4, resumed at ep 1 (one rank, and dp 2), at tp 2 x
    # ep 2 (etp 2) and at ep 4: steps 5..8 follow the uninterrupted run within 1e-5, so every
    # expert (and the balancing bias) came back; the tool shows each expert weight in 2 pieces.
    tool="$(dirname "$trainer")/../12_checkpoint_tool/12_checkpoint_tool"
    run full 4 --steps 8 --dp 4 --ep 2 --aux-free-bias-rate 0.01
    run first 4 --steps 8 --dp 4 --ep 2 --aux-free-bias-rate 0.01 --save ckpt --stop-at 4
    "$tool" ckpt --verify >tool.out
    grep -q "verified: 4 shards" tool.out
    grep -Eq "^value +block0.mlp.experts.fc.weight +\[4, 48, 32\] +f32 +2$" tool.out ||
      { cat tool.out; exit 1; }
    grep -q "balance_bias" tool.out
    for layout in "one 1" "ep1_dp2 2 --dp 2" "tp2_ep2 4 --tp 2 --dp 2 --ep 2" \
                  "ep4 4 --dp 4 --ep 4"; do
      # shellcheck disable=SC2086
      set -- $layout
      name=$1 ranks=$2
      shift 2
      rm -rf "ck_$name" && cp -r ckpt "ck_$name"
      run "$name" "$ranks" --steps 8 --aux-free-bias-rate 0.01 --resume "ck_$name" "$@"
      compare full "$name" 5 8 1e-5
    done
    ;;
  trace)
    # --trace in the MoE trainer: cp 2 x dp 2 x ep 2 (dp, ep and cp communication) and ep 3 at
    # 3 ranks; valid traces whose ranges lie in their steps, per-kind figures that add up and
    # equal the trace's waits, the same losses as without --trace.
    run plain 4 --steps 4 --cp 2 --dp 2 --ep 2
    run traced 4 --steps 4 --cp 2 --dp 2 --ep 2 --trace traces --trace-steps 2:3
    compare plain traced 1 4 0
    python3 "$here/check_trace.py" traces traced.jsonl 4 dp,ep,cp 2 3
    run ep3_traced 3 --steps 3 --dp 3 --ep 3 --experts 6 --global-batch 6 --trace ep3_traces
    python3 "$here/check_trace.py" ep3_traces ep3_traced.jsonl 3 dp,ep 2 3
    ;;
  bad_flags)
    expect_error 2 "3 experts are not divisible by the expert-parallel size ep = 2" --steps 1 \
      --dp 2 --ep 2 --experts 3
    expect_error 3 "4 experts are not divisible by the expert-parallel size ep = 3" --steps 1 \
      --dp 3 --ep 3 --experts 4 --global-batch 6
    expect_error 1 "top_k = 5 is more than the 4 experts" --steps 1 --top-k 5
    expect_error 1 "top_k = 9 must be between 1 and 8" --steps 1 --top-k 9 --experts 16
    expect_error 2 "--etp 2 x --ep 2 x --pp 1 = 4 does not divide the 2 ranks" --steps 1 \
      --dp 2 --ep 2 --etp 2
    expect_error 1 'unknown router score "relu"' --steps 1 --router relu
    # ep counted as one more factor of the ranks: the message says it adds none.
    expect_error 2 "--tp 1 x --dp 1 = 1 ranks, but the job has 2; .* (--ep 2 adds no ranks" \
      --steps 1 --ep 2
    expect_error 1 "--moe-chunks 0: expected 1 .. 64" --steps 1 --moe-chunks 0
    ;;
  bound_by)
    run pp2_ep2 4 --steps 6 --pp 2 --dp 2 --ep 2
    python3 "$here/check_bound_by.py" pp2_ep2.jsonl --nonzero "exposed ep" "exposed pp" compute
    ;;
esac
echo "moe_train_test $case: PASS"
