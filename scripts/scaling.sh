#!/usr/bin/env bash
# Scaling curves on a many-core machine: one short pass over the
# benchmarks whose claims are about cores (per-core page tables, Refcache,
# Bonsai, the buddy allocator, Nibble under YCSB, SpaceJMP GUPS), at
# 1, 2, 4, 8, ... up to the online CPUs.
#
#   scripts/scaling.sh BIN_DIR OUT_DIR [SECONDS_PER_CELL]
#   ONLY=mapbench,ycsb scripts/scaling.sh ...   # run only the named steps
#
# BIN_DIR holds release builds of memlab, memlab-jemalloc,
# memlab-mimalloc and radixvm-percore (`cargo build --release -p bench -p
# radixvm --bins`); OUT_DIR receives one JSON-lines file per benchmark and
# machine.txt (CPU model, counts, kernel). Each benchmark runs under its
# own time limit so one that hangs cannot take the others with it.
set -uo pipefail
bin=$1
out=$2
secs=${3:-0.5}
mkdir -p "$out"
ncpu=$(nproc)
threads=1
t=2
while [ "$t" -le "$ncpu" ]; do
  threads="$threads,$t"
  t=$((t * 2))
done
{
  echo "nproc=$ncpu threads=$threads secs=$secs"
  uname -a
  grep -m1 'model name' /proc/cpuinfo
  lscpu 2>/dev/null | grep -E '^(Socket|Core|Thread|NUMA node\(s\)|L3)' || true
  grep -c TLB /proc/interrupts || true
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

run() {
  local name=$1 limit=$2
  shift 2
  case ",${ONLY:-$name}," in *",$name,"*) ;; *) return 0 ;; esac
  echo "== $name ($(date -u +%T), limit ${limit}s): memlab $*"
  timeout --signal=KILL "$limit" "$bin/memlab" "$@" --json --out "$out/$name.jsonl" >/dev/null 2>"$out/$name.err"
  echo "   rc=$? rows=$(wc -l <"$out/$name.jsonl" 2>/dev/null || echo 0)"
  tail -n 3 "$out/$name.err"
}

run mapbench 130 mapbench --threads "$threads" --seconds "$secs" --repeat 1 \
  --systems radixvm-percore,bonsai-percore,linux-percore,native-linux,radixvm-uffd,radixvm-sw
RADIXVM_FAULT_AROUND_PAGES=4 run mapbench-fa4 40 mapbench --threads "$threads" --seconds "$secs" \
  --repeat 1 --systems radixvm-percore,native-linux --workloads local
run ycsb 120 ycsb --threads "$threads" --seconds "$secs" --repeat 1 --records 200000 \
  --workloads a,c --distributions uniform,zipfian \
  --systems nibble,nibble2,dashmap-mimalloc,hashmap-mimalloc
run refcache 40 refcache --threads "$threads" --seconds "$secs" --repeat 1
run tree 60 tree --threads "$threads" --seconds "$secs" --repeat 1 --writers 0,1
run buddy 90 buddy --quick --threads "$threads"
run gups 100 jmp --workloads gups --windows 1,2,4,8,16 --updates 2097152 --repeat 1
run faultbench 60 faultbench --threads "$threads" --seconds "$secs" --repeat 1 \
  --fractions 0,0.5 --systems radixvm-percore,bonsai-percore,radixvm-uffd
echo "done $(date -u +%T)"
