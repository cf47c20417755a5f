#!/usr/bin/env bash
# Starting sandboxes from a ~1 GB image kept on a remote file system: on demand (the layer file
# mounted where it lies, read as sandboxes need it) versus full pull (copied to local disk
# first, then mounted) — the comparison the DSec design rests on.
#
# The remote side is emulated: an sshd in a network namespace this script makes, reached over a
# veth pair shaped with `tc tbf` (RATE, default 200mbit) from a second namespace in which sshfs
# runs; the node reads the store through that sshfs mount. Nothing leaves the machine: both
# namespaces are the script's own, and it removes them (and everything else it made) on exit.
#
# Usage (as root, after `make build`):  bench/remote-images.sh    [env: N=8 RATE=200mbit RUNS=3]
# Prints a table of medians over RUNS: time to first exec, time until all N sandboxes ran the
# task, bytes sent over the link, bytes read from the layer as a share of the image, and the
# bytes of the files the task opened (its Python modules, the interpreter and the libraries
# it mapped) as a share of the image's file data: what a perfect loader would fetch. Loop
# mode runs twice: with the kernel's readahead for the device and with Warren's
# (`layer_readahead_kb`, 128 KiB).
set -euo pipefail
cd "$(dirname "$0")/.."
W=$PWD/target/release/warren
[ -x "$W" ] || { echo "build first: make build" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
for t in sshfs sshd ip tc nsenter mkfs.erofs; do
  command -v "$t" >/dev/null || { echo "missing $t: apt-get install sshfs openssh-server iproute2 erofs-utils" >&2; exit 1; }
done
N=${N:-8}
RATE=${RATE:-200mbit}
RUNS=${RUNS:-3}
TASK='import json, email.parser, http.client, sqlite3, csv; print("ok")'
# The task, counting the bytes of every file it opened: what the audit hook saw opened, the
# modules imported before the hook was set (their source and cached bytecode), and every
# file mapped (the interpreter, libraries, extension modules). Prints that sum last.
MEASURED='import sys, os
seen = set()
sys.addaudithook(lambda e, a: seen.add(a[0]) if e == "open" and isinstance(a[0], str) else None)
exec(sys.argv[1])
for m in list(sys.modules.values()):
    for f in (getattr(m, "__file__", None), getattr(m, "__cached__", None)):
        if isinstance(f, str):
            seen.add(f)
for line in open("/proc/self/maps"):
    parts = line.split()
    if len(parts) >= 6 and parts[5].startswith("/"):
        seen.add(parts[5])
inodes = {}
for f in seen:
    try:
        st = os.stat(f)
    except OSError:
        continue
    if os.path.isfile(f):
        inodes[(st.st_dev, st.st_ino)] = st.st_size
print(sum(inodes.values()))'
work=$(mktemp -d /var/tmp/warren-bench-images.XXXXXX)
NSR=wbimg-remote-$$ NSC=wbimg-client-$$
REMOTE_IP=10.231.77.1 CLIENT_IP=10.231.77.2
pids=()

cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  umount -l "$work/mnt" 2>/dev/null
  for m in $(awk -v w="$work" '$5 ~ "^"w {print $5}' /proc/self/mountinfo | sort -r); do umount -l "$m"; done
  ip netns del "$NSR" 2>/dev/null; ip netns del "$NSC" 2>/dev/null
  for cg in /sys/fs/cgroup/*/warren-bench-img-$$ /sys/fs/cgroup/unified/warren-bench-img-$$; do
    [ -d "$cg" ] && rmdir "$cg" 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s%N; }
ms() { echo $(( ($2 - $1) / 1000000 )); }

# warren up on its own data dir, port and cgroup parent; $1 = name, $2 = store, $3 = layer_mount,
# $4 = layer_readahead_kb (default Warren's)
up() {
  local name=$1 store=$2 mode=$3 ra=${4:-128} port
  port=$((7790 + RANDOM % 100))
  mkdir -p "$work/$name"
  # One catalog (the control plane's database) for every instance: the image is named once.
  printf '[node]\nwarm_pool = 0\nlayer_mount = "%s"\nlayer_readahead_kb = %s\n[control]\ndatabase_url = "sqlite://%s?mode=rwc"\n' \
    "$mode" "$ra" "$work/catalog.db" > "$work/$name/cfg.toml"
  WARREN_LOG=warn "$W" up --data-dir "$work/$name" --listen 127.0.0.1:$port --image-store "$store" \
    --cgroup-parent warren-bench-img-$$ --config "$work/$name/cfg.toml" --kill-sandboxes-on-exit \
    >"$work/$name.log" 2>&1 &
  UP_PID=$!
  pids+=("$UP_PID")
  export WARREN_URL=http://127.0.0.1:$port
  for _ in $(seq 1 100); do
    [ -f "$work/$name/admin.key" ] && curl -fsS -o /dev/null "$WARREN_URL/v1/health" 2>/dev/null && break
    sleep 0.1
  done
  WARREN_API_KEY=$(cat "$work/$name/admin.key"); export WARREN_API_KEY
}
down() { kill "$UP_PID"; wait "$UP_PID" 2>/dev/null || true; }

# --- the image: the host's Python and a good part of /usr (bound in, not copied) -------------
echo "building the image (host /usr/bin, /usr/lib/x86_64-linux-gnu, python3, /usr/share) ..." >&2
root=$work/rootfs
mkdir -p "$root/usr/lib" "$root/etc"
for d in usr/bin usr/lib/x86_64-linux-gnu usr/lib/python3 usr/lib/python3.11 usr/lib64 usr/share; do
  [ -d "/$d" ] || continue
  mkdir -p "$root/$d"; mount --bind -o ro "/$d" "$root/$d"
done
for l in bin lib lib64 sbin; do ln -s "usr/$l" "$root/$l"; done
ln -s ../bin "$root/usr/sbin"
filedata=$(find "$root" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
up import "$work/remote-store" loop
t0=$(now)
"$W" image import "$root" --name bench/python:1 >/dev/null
t_import=$(ms "$t0" "$(now)")
down
for d in $(awk -v w="$root" '$5 ~ "^"w {print $5}' /proc/self/mountinfo | sort -r); do umount "$d"; done
layer=$(ls "$work"/remote-store/layers/*.erofs)
size=$(stat -c %s "$layer")
echo "image: $(numfmt --to=iec "$filedata") of file data, $(numfmt --to=iec "$size") EROFS (lz4hc), imported in $((t_import / 1000)) s" >&2


# --- the link: remote namespace (sshd) <- tbf $RATE -> client namespace (sshfs) -----------------
ip netns add "$NSR"; ip netns add "$NSC"
ip link add wbr$$ netns "$NSR" type veth peer name wbc$$ netns "$NSC"
ip -n "$NSR" addr add $REMOTE_IP/30 dev wbr$$; ip -n "$NSC" addr add $CLIENT_IP/30 dev wbc$$
for ns in "$NSR" "$NSC"; do ip -n "$ns" link set lo up; done
ip -n "$NSR" link set wbr$$ up; ip -n "$NSC" link set wbc$$ up
ip netns exec "$NSR" tc qdisc add dev wbr$$ root tbf rate "$RATE" burst 128kb latency 100ms
mkdir -p "$work/ssh" /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/host" </dev/null
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/client" </dev/null
cp "$work/ssh/client.pub" "$work/ssh/authorized_keys"
cat > "$work/ssh/sshd_config" <<CFG
ListenAddress $REMOTE_IP
HostKey $work/ssh/host
AuthorizedKeysFile $work/ssh/authorized_keys
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $work/ssh/sshd.pid
Subsystem sftp internal-sftp
CFG
ip netns exec "$NSR" /usr/sbin/sshd -D -e -f "$work/ssh/sshd_config" 2>"$work/sshd.log" &
pids+=("$!")
sleep 0.5
mkdir -p "$work/mnt"
mount_remote() {
  nsenter --net=/run/netns/"$NSC" sshfs -o ro,IdentityFile="$work/ssh/client",StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,Ciphers=aes128-gcm@openssh.com \
    root@$REMOTE_IP:"$work/remote-store" "$work/mnt"
}
unmount_remote() { umount "$work/mnt"; }
link_bytes() { ip netns exec "$NSC" cat /sys/class/net/wbc$$/statistics/rx_bytes; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# Starts N sandboxes of the image and runs the task in each, all at once; prints
# "<ms to first exec> <ms until all ran>", measured from $1.
start_n() {
  local t0=$1 first="" i jobs=()
  for i in $(seq 1 "$N"); do
    ( id=$("$W" sandbox create --image bench/python:1 --memory 512Mi) &&
      "$W" exec "$id" -- python3 -c "$MEASURED" "$TASK" | tail -1 > "$work/opened.$i" &&
      now > "$work/done.$i" ) &
    jobs+=("$!")
  done
  wait "${jobs[@]}"  # these only: this shell's other children are the platform and sshd
  for i in $(seq 1 "$N"); do [ -f "$work/done.$i" ] || { echo "sandbox $i failed" >&2; exit 1; }; done
  first=$(cat "$work"/done.* | sort -n | head -1); last=$(cat "$work"/done.* | sort -n | tail -1)
  OPENED=$(sort -n "$work"/opened.* | tail -1)
  rm -f "$work"/done.* "$work"/opened.*
  echo "$(ms "$t0" "$first") $(ms "$t0" "$last")"
}

# Layer bytes read, from the API.
layer_read() {
  "$W" image stats --json | python3 -c 'import json,sys; print(sum(l["read_bytes"] for l in json.load(sys.stdin)["layers"]))'
}

rows=()
run_on_demand() {
  local mode=$1 ra=${2:-128} label=$3
  cold; mount_remote
  up "ondemand-$mode-$ra" "$work/mnt" "$mode" "$ra"
  local b0 t0 r b1 rd
  b0=$(link_bytes); t0=$(now)
  start_n "$t0" > "$work/r"; r=$(cat "$work/r")  # start_n sets OPENED
  b1=$(link_bytes); rd=$(layer_read)
  down; unmount_remote
  rows+=("$label|${r% *}|${r#* }|$((b1 - b0))|$rd|$OPENED")
}
run_full_pull() {
  cold; mount_remote
  local b0 t0 r b1 rd
  b0=$(link_bytes); t0=$(now)
  mkdir -p "$work/local-store"
  cp -r "$work/mnt/layers" "$work/local-store/"
  up pull "$work/local-store" loop
  start_n "$t0" > "$work/r"; r=$(cat "$work/r")  # start_n sets OPENED
  b1=$(link_bytes); rd=$(layer_read)
  down; unmount_remote; rm -rf "$work/local-store"
  rows+=("full pull, then loop|${r% *}|${r#* }|$((b1 - b0))|$rd|$OPENED")
}

# The readahead the kernel gives a loop device over the layer where it lies (the remote mount).
mount_remote
dev=$(losetup -f --show -r --direct-io=on "$work/mnt/layers/$(basename "$layer")")
kernel_ra=$(cat /sys/block/"$(basename "$dev")"/queue/read_ahead_kb)
losetup -d "$dev"; unmount_remote
echo "running: $N sandboxes, link $RATE, $RUNS runs, task: python3 -c '$TASK'" >&2
for run in $(seq 1 "$RUNS"); do
  run_on_demand loop "$kernel_ra" "on demand (loop, ra ${kernel_ra}K)"
  run_on_demand loop 128 "on demand (loop, ra 128K)"
  run_on_demand file 128 "on demand (file)"
  run_full_pull
  echo "run $run done" >&2
done

printf '\nStarting %s sandboxes from a %s image (%s of file data) over a %s link (page cache dropped before each run; medians of %s runs)\n\n' \
  "$N" "$(numfmt --to=iec "$size")" "$(numfmt --to=iec "$filedata")" "$RATE" "$RUNS"
printf '%s\n' "${rows[@]}" | python3 -c '
import sys, statistics
size, n, filedata, kra = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
by = {}
for line in sys.stdin:
    name, *vals = line.strip().split("|")
    by.setdefault(name, []).append([int(v) for v in vals])
def iec(b):
    for u in ["B", "K", "M", "G"]:
        if b < 1024 or u == "G":
            return f"{b:.0f}{u}" if u == "B" else f"{b:.1f}{u}"
        b /= 1024
med = {k: [statistics.median(c) for c in zip(*v)] for k, v in by.items()}
print("%-26s %15s %15s %14s %22s %22s" % ("mode", "first exec (ms)", "all %s ran (ms)" % n,
      "over link", "read from layer", "files opened"))
for k, (first, all_, sent, rd, opened) in med.items():
    print(f"{k:<26} {first:>15.0f} {all_:>15.0f} {iec(sent):>14} {iec(rd):>13} ({100*rd/size:4.1f}%)"
          f" {iec(opened):>13} ({100*opened/filedata:4.1f}%)")
od, fp = med["on demand (file)"], med["full pull, then loop"]
lk, lw = med[f"on demand (loop, ra {kra}K)"], med["on demand (loop, ra 128K)"]
print(f"\non demand (file, the default) vs full pull: first exec {fp[0]/max(od[0],1):.1f}x faster; "
      f"{100*od[2]/max(fp[2],1):.1f}% of the bytes over the link")
print(f"loop readahead {kra}K (the kernel default) -> 128K (Warren default): {iec(lk[3])} -> {iec(lw[3])} read from "
      f"the layer, {iec(lk[2])} -> {iec(lw[2])} over the link; the files opened are {iec(lw[4])} "
      f"({100*lw[4]/filedata:.1f}% of the file data; the DSec paper reports 6.0% for Python)")
print("(read from layer: loop counts every read request to the device, repeats included; file counts")
print(" the layer file pages that entered the page cache. files opened: the task modules, interpreter,")
print(" libraries and extension modules, each counted once at its full size)")
' "$size" "$N" "$filedata" "$kernel_ra"
