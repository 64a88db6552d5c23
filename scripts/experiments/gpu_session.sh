#!/bin/bash
# One GPU session in one command, as run for the README's H200 figures: install the carried wheels,
# make hopper-medium (1M, on the CPU), run scripts/bench.py on the GPU, fit one world model, then train
# RAVL, MOPO, BC and NEUBAY (paper presets, 3 seeds each) side by side until END seconds, and pack their
# metrics into $OUT/runs.tgz.
#
# The wheels are what the GPU image lacks (gymnasium, mujoco, mujoco-core, mujoco-studio, minari, tyro,
# docstring-parser, typeguard, shtab, farama-notifications, glfw, pyopengl; flax, optax and
# orbax-checkpoint pinned), downloaded for CPython 3.12 into .whl/ with `pip download --no-deps`.
# SMALL=1 shrinks everything for a local dry run; SKIP_INSTALL=1 uses the current environment; PY picks
# the interpreter.
set -u
PY=${PY:-python3}
R=${OUT:-/tmp/devout}; mkdir -p $R
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
END=${END:-560}
if [ -z "${SKIP_INSTALL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { tail -5 $R/install.log; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 MBRL_DATA_DIR=/tmp/dev_data MINARI_DATASETS_PATH=/tmp/dev_minari XLA_PYTHON_CLIENT_PREALLOCATE=false
$PY -c "import jax, flax, optax, orbax.checkpoint, mujoco, gymnasium, minari, tyro; print('versions', jax.__version__, flax.__version__, mujoco.__version__, gymnasium.__version__, jax.devices())" 2>&1 | tail -2 | tee $R/env.txt
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >> $R/env.txt 2>/dev/null; nproc >> $R/env.txt
if [ -n "${SMALL:-}" ]; then
  MAKE="--transitions 5000"; BENCH="--quick --only sac2_update"; EP=4; UPE=50; EV=2; FIT=10; PRESET=quick; NEP=2; NUPE=20
else
  MAKE=""; BENCH=""; EP=400; UPE=1000; EV=5; FIT=60; PRESET=paper; NEP=400; NUPE=1000
fi
echo "t=$(el) make+bench" | tee -a $R/progress.txt
( s=$(date +%s); JAX_PLATFORMS=cpu timeout 300 $PY -m mbrl.cli data make hopper-medium $MAKE > $R/make.log 2>&1; echo "make rc=$? seconds=$(( $(date +%s) - s ))" >> $R/make.log ) &
MAKE_PID=$!
timeout 170 $PY scripts/bench.py $BENCH > $R/bench.jsonl 2> $R/bench.err; echo "bench rc=$?" >> $R/bench.err
wait $MAKE_PID; tail -1 $R/make.log | tee -a $R/progress.txt
echo "t=$(el) fit" | tee -a $R/progress.txt
timeout 120 $PY -m mbrl.cli model fit --dataset hopper-medium --out /tmp/dev_wm --fit.max-seconds $FIT > $R/fit.log 2>&1; echo "fit rc=$?" >> $R/progress.txt
echo "t=$(el) train" | tee -a $R/progress.txt
LEFT=$(( END - $(el) ))
COMMON="--dataset hopper-medium --seeds 3 --schedule.eval-episodes 10 --schedule.checkpoint-every 100000"
for algo in ravl mopo bc; do
  WM=""; [ $algo != bc ] && WM="--world-model /tmp/dev_wm"
  timeout -s TERM -k 25 $LEFT $PY -m mbrl.cli train --algo $algo --preset $PRESET $WM $COMMON --run-dir /tmp/dev_runs/$algo \
    --schedule.epochs $EP --schedule.updates-per-epoch $UPE --schedule.eval-every $EV > $R/train_$algo.log 2>&1 &
done
timeout -s TERM -k 25 $LEFT $PY -m mbrl.cli train --algo neubay --preset $PRESET $COMMON --run-dir /tmp/dev_runs/neubay \
  --imagination.per-seed-model False --fit.max-seconds $((FIT + 30)) \
  --schedule.epochs $NEP --schedule.updates-per-epoch $NUPE --schedule.eval-every $EV > $R/train_neubay.log 2>&1 &
wait
echo "t=$(el) pack" | tee -a $R/progress.txt
tar czf $R/runs.tgz -C /tmp/dev_runs --exclude=checkpoints --exclude=world_model . 2>> $R/progress.txt
for f in $R/train_*.log; do tail -c 3000 $f > $f.tail; mv $f.tail $f; done
ls -la $R >> $R/progress.txt
