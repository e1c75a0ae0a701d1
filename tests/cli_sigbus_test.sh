#!/usr/bin/env bash
# The SIGBUS handler's parse of /proc/self/maps (tools/cmd_sigbus.c), on
# lines written here: which mapping holds the faulting address, the file's
# path as the line has it (spaces, " (deleted)"), the byte of the file
# (address - start + offset, by hand below), lines longer than the buffer,
# and a buffer smaller than a line. The real handler, on a real fault, is
# cli_hostile_test's case 10; here the handler is only sent the signal.
#   cli_sigbus_test.sh CLI_DRIVER CTRAX
set -uo pipefail
driver=$1
ctrax=$2
source "$(dirname "$0")/cli_common.sh" cli_sigbus_test
msg=" was cut short (or became unreadable) while ctrax read it through a memory map: byte "

# expect NAME FILE ADDR CAP FOUND [PATH BYTE]: the parse of FILE for ADDR with
# a CAP-byte buffer prints "found FOUND" and, when found, exactly the line
# "ctrax: PATH<msg>BYTE of it is gone" on stderr (nothing otherwise).
expect() {
    local name=$1 file=$2 addr=$3 cap=$4 found=$5 want=""
    [[ $found == 1 ]] && want="ctrax: $6$msg$7 of it is gone"
    local out err
    out=$("$driver" maps "$file" "$addr" "$cap" 2>"$work/err")
    err=$(tr -d '\n' <"$work/err")
    if [[ $out == "found $found" && $err == "$want" ]]; then
        ok "$name: $out${want:+: ${want:0:60}...${want: -40}}"
    else
        bad "$name: got '$out' and '${err:0:300}', want 'found $found' and '${want:0:300}'"
    fi
}

# Four mappings: the program, a file (its name with spaces, deleted since),
# an anonymous one and the stack; the columns padded as the kernel pads them.
cat >"$work/maps" <<'MAPS'
55d0a0000000-55d0a0021000 r--p 00000000 08:01 1234                       /usr/bin/ctrax
7f0000000000-7f0000010000 r--s 00002000 08:01 5678                       /data/my corpus.txt (deleted)
7f0000010000-7f0000020000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
MAPS
for cap in 8192 128; do
    # 0x123 + 0x2000 = 291 + 8192
    expect "deleted file with spaces, cap $cap" "$work/maps" 7f0000000123 $cap 1 "/data/my corpus.txt (deleted)" 8483
    expect "its first byte, cap $cap" "$work/maps" 7f0000000000 $cap 1 "/data/my corpus.txt (deleted)" 8192
    # 0x20fff = 135167
    expect "the program's last byte, cap $cap" "$work/maps" 55d0a0020fff $cap 1 /usr/bin/ctrax 135167
    expect "the end is not in the range (anonymous next), cap $cap" "$work/maps" 7f0000010000 $cap 0
    expect "the stack, cap $cap" "$work/maps" 7ffd00000010 $cap 0
    expect "no mapping, cap $cap" "$work/maps" 1000 $cap 0
done
# Not a maps line (no '-' between the addresses): no range, nothing named.
printf '7f0000000000 7f0000010000 r--s 00000000 08:01 7 /not/a/range\n' >"$work/bad_maps"
expect "a line without '-'" "$work/bad_maps" 7f0000000001 8192 0

# A line longer than the buffer (8191 bytes of it fit) whose rest looks like
# a maps line for the address: that rest is no line of its own; the real
# mapping, on the next line, is the one named.
python3 - "$work/long_maps" <<'PY'
import sys
head = "10000-20000 r--p 00000000 08:01 7 /"
line = head + "x" * (8191 - len(head)) + "7f0000000000-7f0000010000 r--s 00000000 08:01 1 /fake/path\n"
line += "7f0000000000-7f0000010000 r--s 00000000 08:01 2 /real/file\n"
open(sys.argv[1], "w").write(line)
PY
expect "the rest of a long line is not a line" "$work/long_maps" 7f0000000010 8192 1 /real/file 16
# The long line holds the address: named by the start of its path, with "...".
python3 - "$work/long_target" <<'PY'
import sys
head = "7f0000000000-7f0000010000 r--s 00001000 08:01 7 /"
open(sys.argv[1], "w").write("1000-2000 r--p 00000000 08:01 3 /bin/x\n" + head + "y" * 9000 + "\n"
                             + "7f0000010000-7f0000020000 r--s 00000000 08:01 1 /other\n")
PY
# The buffer holds the line's first 8191 bytes: the path's first 8191 - 49.
y=$(python3 -c 'print("y" * (8191 - 49))')
expect "a long line holding the address" "$work/long_target" 7f0000000002 8192 1 "/$y..." 4098
expect "the line after a long one" "$work/long_target" 7f0000010003 8192 1 /other 3
# A path with control characters (a terminal's escape sequence): each shown as '?'.
printf '7f0000000000-7f0000010000 r--s 00000000 08:01 7 /data/a\033]0;x\007b\177c\n' >"$work/ctl_maps"
expect "control characters in the path" "$work/ctl_maps" 7f0000000001 8192 1 "/data/a?]0;x?b?c" 1

# The handler in ctrax: SIGBUS from kill(1) (no fault, no address) ends a
# run with exit 1 and a message that says who sent it, not the signal's 135
# and no word (nor a file said to be cut short).
"$ctrax" train "$(dirname "$0")/configs/copy_run.gin" --steps 100000000 --output-dir "$work/run" >"$work/run.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [[ -f $work/run/checkpoint ]] && break; sleep 0.1; done
kill -BUS "$pid"
wait "$pid"
rc=$?
want="ctrax: stopped by a SIGBUS that process $$ sent (no fault: no file was cut short)."
if ((rc == 1)) && grep -qF "$want" "$work/run.log"; then ok "kill -BUS: exit 1: $want"; else
    bad "kill -BUS: exit $rc, want 1 and '$want': $(tail -n 2 "$work/run.log")"
fi
cli_done
