# The lab harness's command runner: one per container, started once with `docker exec -i`.
# Each docker exec costs 0.8-1 s under the lab's emulated CPUs (API round trips, runc); a
# fork from this resident process costs ~50 ms. Standard library only (the node image's
# python3).
#
# Protocol, one JSON object per line:
#   stdin:  {"id": N, "argv": [...], "env": ["KEY=value", ...]}
#   stdout: {"id": N, "code": C, "stdout": base64, "stderr": base64} when the command exits
#           (C as docker reports it: 128+N for a signal), or {"id": N, "error": "..."} when it
#           could not start.
# Commands start in the order they arrive. The runner exits when its stdin closes; commands
# still running are left running, as a docker exec's would be.
import base64
import json
import os
import subprocess
import sys
import threading

_out_lock = threading.Lock()


def reply(msg):
    line = (json.dumps(msg) + "\n").encode()
    with _out_lock:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


def b64(data):
    return base64.b64encode(data).decode()


def wait(req_id, proc):
    out, err = proc.communicate()
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    reply({"id": req_id, "code": code, "stdout": b64(out), "stderr": b64(err)})


def start(req):
    env = dict(os.environ)
    for kv in req.get("env") or []:
        key, _, value = kv.partition("=")
        env[key] = value
    try:
        proc = subprocess.Popen(req["argv"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        reply({"id": req["id"], "error": str(e)})
        return
    threading.Thread(target=wait, args=(req["id"], proc), daemon=True).start()


def main():
    reply({"id": 0, "ready": True})
    for line in sys.stdin.buffer:
        if line.strip():
            start(json.loads(line))


main()
