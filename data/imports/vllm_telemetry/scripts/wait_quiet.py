"""Wait until no process outside our own sessions uses more than 20% of a core (the VM is shared).

  python wait_quiet.py MAX_WAIT_S SID [SID...]
  python wait_quiet.py --monitor SID [SID...]   (until SIGTERM: one line per 1 s sample that saw a busy
                                                foreign process, "UTC-time pid N P% cmd; ...")
Samples /proc/*/stat over 1 s; a process counts as ours if its session id is one of SIDs (the
setsid'ed recorder, server and scraper). Prints one line: waited N s, and the busy foreign
processes of the last sample (empty if quiet). Exit 0 always (it only waits, at most MAX_WAIT_S).
"""
import os, sys, time

HZ = os.sysconf("SC_CLK_TCK")
max_wait, ours = (0, set()) if sys.argv[1] == "--monitor" else (float(sys.argv[1]), {int(s) for s in sys.argv[2:]})
me = os.getsid(0)


def snap():
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            s = open(f"/proc/{p}/stat").read()
            rest = s[s.rindex(")") + 2:].split()
            sid, ticks = int(rest[3]), int(rest[11]) + int(rest[12])
            out[int(p)] = (sid, ticks, s[s.index("(") + 1:s.rindex(")")])
        except (OSError, ValueError, IndexError):
            pass
    return out


def busy_between(a, b):
    busy = []
    for pid, (sid, ticks, comm) in b.items():
        if pid in a and sid not in ours and sid != me and pid != os.getpid():
            pct = 100.0 * (ticks - a[pid][1]) / HZ
            if pct > 20:
                try:
                    cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()[:100]
                except OSError:
                    cmd = comm
                busy.append(f"pid {pid} {pct:.0f}% {cmd}")
    return busy


if sys.argv[1] == "--monitor":
    import signal
    ours = {int(s) for s in sys.argv[2:]}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    a = snap()
    while True:
        time.sleep(1.0); b = snap()
        busy = busy_between(a, b); a = b
        if busy:
            print(time.strftime("%H:%M:%S", time.gmtime()), "; ".join(busy), flush=True)

t0 = time.time()
while True:
    a = snap(); time.sleep(1.0); b = snap()
    busy = busy_between(a, b)
    waited = time.time() - t0
    if not busy or waited >= max_wait:
        print(f"waited {waited:.0f} s; foreign busy: {'; '.join(busy) if busy else 'none'}")
        break
    time.sleep(4)
