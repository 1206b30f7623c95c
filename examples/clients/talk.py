#!/usr/bin/env python3
"""Call a loopbus instance from Python, standard library only.

    python3 talk.py ROOT TARGET [PROMPT]

ROOT is the channel root (the parent of the instances' state directories), TARGET the
instance to call; the prompt is read from stdin when PROMPT is absent. The caller's
name is $LOOPBUS_INSTANCE (set for engines), else "script"; the depth is
$LOOPBUS_DEPTH + 1. Prints the reply; exits 0, 1 (failure, not retryable), 75
(retryable) or 2 (usage), like `loopbus talk`. The protocol is in PROTOCOL.md.

http.client rather than urllib: urllib opens a connection per request, and the secret
must go only on the connection whose health answer proved that the instance holds it.
"""

import hashlib
import hmac
import http.client
import json
import os
import secrets
import sys

PROBE_TIMEOUT_SECS = 2  # connect and health answer
TALK_TIMEOUT_SECS = 1800  # a turn may run long; loopbus talk's default
BASE_CAPABILITIES = ["structured-errors", "retryable-errors"]


def fail(message, status):
    print(f"talk.py: {message}", file=sys.stderr)
    sys.exit(status)


def main():
    if len(sys.argv) not in (3, 4):
        fail("usage: talk.py ROOT TARGET [PROMPT]", 2)
    root, target = sys.argv[1], sys.argv[2]
    prompt = sys.argv[3] if len(sys.argv) == 4 else sys.stdin.read()

    # 1. The registry: port, host, this run's secret, and whether it proves itself.
    path = os.path.join(root, ".bus-registry.json")
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f).get("instances", {}).get(target)
    except (OSError, ValueError) as e:
        fail(f"cannot read {path}: {e}", 75)
    if not entry:
        fail(f"{target} is not registered in {path} (is it running?)", 75)
    host = entry.get("host", "127.0.0.1")
    port, secret = entry["port"], entry["secret"]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    # 2. Health on a new connection, with a nonce the instance must answer.
    conn = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_SECS)
    nonce = secrets.token_hex(16)
    try:
        conn.request("GET", "/api/health", headers={"Host": address, "X-Loopbus-Nonce": nonce})
        answer = conn.getresponse()
        health = json.loads(answer.read())
    except (OSError, ValueError, http.client.HTTPException) as e:
        fail(f"{target} at {address} does not answer health: {e}", 75)
    if answer.status != 200 or health.get("status") != "ok" or health.get("instance") != target:
        fail(f"{target} at {address} is not alive (health: {answer.status})", 75)
    if entry.get("proof") is not True:
        fail(f"{target} cannot prove it holds its secret; this example only calls loopbus instances", 1)
    message = f"loopbus-proof-v1\n{target}\n{address}\n{nonce}".encode()
    expected = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest().encode()
    proof = health.get("proof")
    if not isinstance(proof, str) or not hmac.compare_digest(expected, proof.encode()):
        fail(f"whoever holds {address} did not prove the secret of {target}; not sending it", 1)

    # 3. The talk, on that same connection only. Content-Type must be application/json:
    # the form types are refused (415) because a browser may send them anywhere.
    # (http.client opens a new connection only when conn.sock is None.)
    proved = conn.sock
    body = json.dumps({
        "fromInstance": os.environ.get("LOOPBUS_INSTANCE", "script"),
        "prompt": prompt,
        "depth": int(os.environ.get("LOOPBUS_DEPTH", "0")) + 1,
        "protocolVersion": 1,
        "capabilities": BASE_CAPABILITIES,
    }).encode()
    if proved is None:
        fail(f"{target} closed the proved connection; not sending the secret elsewhere", 75)
    proved.settimeout(TALK_TIMEOUT_SECS)
    headers = {
        "Host": address,
        "Content-Type": "application/json",
        "Authorization": f"Bearer {secret}",
    }
    try:
        conn.request("POST", "/api/talk", body=body, headers=headers)
        answer = conn.getresponse()
        envelope = json.loads(answer.read())
    except (OSError, ValueError, http.client.HTTPException) as e:
        fail(f"talk to {target} failed: {e}", 75)
    finally:
        conn.close()

    # 4. The envelope: success and text, or errorCode and retryable.
    if envelope.get("success") is True:
        text = envelope.get("text", "")
        # Like `loopbus talk`: the reply ends with a newline, so a prompt never lands on it.
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    retryable = envelope.get("retryable") is True
    code = envelope.get("errorCode", "unknown")
    fail(f"{target}: {envelope.get('error', '')} [{code}]", 75 if retryable else 1)


if __name__ == "__main__":
    main()
